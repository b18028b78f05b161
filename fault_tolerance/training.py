"""Per-step fault tolerance: GPT-2 trained by replica groups that leave and rejoin at step granularity (torchft).

Each replica group (``--dp`` ranks holding a full replica; :func:`course.replica_groups.launch_replica_groups`
starts ``--replicas`` of them) trains on its own shard of every global batch. One step, as torchft's
``Manager`` runs it (the library's documentation, "Manager"; Dubey et al. 2024, Sec. 3.3.4 on why):

1. ``start_quorum``: ask the lighthouse which groups take this step. A group that is behind — started again
   after a failure — **heals** here: it loads the weights, the AdamW state and the step number from a live peer
   and joins the same step;
2. forward and backward on the group's batch **of that step** (the batch is chosen by the step number, so a
   healed group takes the batch the others take);
3. the gradients averaged inside the group (its process group), then across the quorum (``manager.allreduce``:
   the sum over the live groups divided by their number — the effective batch is ``live groups x batch per group``);
4. ``should_commit``: every group votes; if a group died during the step (the all-reduce failed) no group
   applies it, and the step is **taken again** with the smaller quorum. Otherwise AdamW steps.

So a failure costs the survivors the aborted attempt and the wait for the lighthouse to notice the dead group
(its heartbeat timeout), never a committed step; the killed group costs only its own restart and one transfer of
the state. Run it with ``python project/run_fault_tolerant.py``; the drill options kill a group mid-run.
"""
from __future__ import annotations

import logging
import os
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, DistributedSampler

from course import trace
from course.epoch_runner import Evaluation, StepOutcome, TrainingMode, to_device
from course.loss import model_loss
from course.model import parameter_fingerprint
from course.replica_groups import fault_point, replica, report, wait_for_start
from course.task import build_model

MAX_ATTEMPTS = 20  # attempts at one step before the group gives up (each aborted attempt is a quorum change)


class FaultTolerantTraining(TrainingMode):
    """One replica group's training under a ``torchft.Manager`` (see the module docstring).

    Args:
        manager: this group's ``torchft.Manager`` (synchronous quorum: ``use_async_quorum=False``).
        mesh: the group's :class:`course.mesh.Mesh` (``dp`` ranks).
        info: :class:`course.replica_groups.ReplicaInfo` of the group.
        (and the :class:`course.epoch_runner.TrainingMode` arguments)
    """

    mode = "fault_tolerant"

    def __init__(self, config, data, device, model, optimizer, manager, mesh, info, **kwargs):
        super().__init__(config, data, device, **kwargs)
        self.model, self.optimizer, self.manager, self.mesh, self.info = model, optimizer, manager, mesh, info
        self.results_prefix = config.group_prefix(info.group)  # each group its own results files and checkpoints
        self.dp_group = mesh.dp_group
        self.shards = config.replicas * config.dp
        self.shard = info.group * config.dp + mesh.dp_rank
        self.steps_per_epoch = len(self._loader(0)) if config.max_batches is None else \
            min(config.max_batches, len(self._loader(0)))
        self._cached: tuple[int, list] | None = None
        self.log: list[dict] = []  # per committed step: step, live groups, loss
        self.aborted: list[int] = []  # steps whose attempt was aborted (a group failed in it)
        self.healed: list[int] = []  # steps at which this group healed from a peer

    # ---- data: the batch of a step, whichever step the quorum is at ----
    def _loader(self, epoch: int) -> DataLoader:
        sampler = DistributedSampler(self.data.train, num_replicas=self.shards, rank=self.shard, shuffle=True,
                                     seed=self.config.seed, drop_last=True)
        sampler.set_epoch(epoch)
        return DataLoader(self.data.train, batch_size=self.config.batch_size // self.shards, sampler=sampler,
                          collate_fn=self.data.collate, drop_last=True)

    def batch_for(self, step: int) -> dict:
        """This rank's batch of global step ``step`` (epoch ``step // steps_per_epoch``)."""
        epoch, index = divmod(step, self.steps_per_epoch)
        if self._cached is None or self._cached[0] != epoch:
            batches = []
            for batch in self._loader(epoch):
                if len(batches) == self.steps_per_epoch:
                    break
                batches.append(batch)
            self._cached = (epoch, batches)
        return self._cached[1][index]

    def epoch_batches(self, epoch: int):
        """Slots, one per step, until the quorum's step leaves the epoch (a group that healed into a later step
        ends the epoch early); ``train_step`` takes the batch of the quorum's step."""
        end = (epoch + 1) * self.steps_per_epoch

        def slots():
            while self.manager.current_step() < end:
                yield None
        return slots(), self.steps_per_epoch

    # ---- one step ----
    def train_step(self, _slot) -> StepOutcome:
        for _ in range(MAX_ATTEMPTS):
            before = self.manager.current_step()
            self.manager.start_quorum()  # synchronous: a group that is behind heals here, from a live peer
            step = self.manager.current_step()
            if step != before:  # it was behind: it loaded a live peer's weights, AdamW state and step
                self.healed.append(step)
                report("healed", step, fingerprint=parameter_fingerprint(self.model))
            batch = to_device(self.batch_for(step), self.device)
            self.optimizer.zero_grad(set_to_none=True)
            with trace.span("forward", "compute", self.device):
                loss = model_loss(self.model, batch)
            fault_point(step)  # a planned kill lands here, after the forward pass
            with trace.span("backward", "compute", self.device):
                loss.backward()
            with trace.span("gradient sync", "communication", self.device):
                self.average_gradients()
            if self.manager.should_commit():
                self.optimizer.step()
                live = self.manager.num_participants()
                self.log.append({"step": step, "live_groups": live, "loss": loss.item()})
                if self.mesh.rank == 0:
                    report("commit", step, live_groups=live, loss=loss.item(),
                           fingerprint=parameter_fingerprint(self.model))
                return StepOutcome(loss.item(), int(batch["attention_mask"].sum()))
            self.aborted.append(step)  # a group failed during the step: nobody applied it; take it again
            report("abort", step)
        raise RuntimeError(f"replica group {self.info.group}: step {self.manager.current_step()} aborted "
                           f"{MAX_ATTEMPTS} times in a row; the quorum keeps changing (see the lighthouse's log)")

    def average_gradients(self) -> None:
        """Mean gradient over the group's ranks (its process group), then over the live quorum (torchft)."""
        grads = [p.grad for p in self.model.parameters() if p.grad is not None]
        flat = torch.cat([g.reshape(-1) for g in grads])
        if dist.get_world_size(self.dp_group) > 1:
            dist.all_reduce(flat, group=self.dp_group)
            flat /= dist.get_world_size(self.dp_group)
        self.manager.allreduce(flat).wait()  # sum over the quorum / its size (torchft's ReduceOp.AVG)
        offset = 0
        for g in grads:
            g.copy_(flat[offset:offset + g.numel()].view_as(g))
            offset += g.numel()

    # ---- checkpoints: also the manager's step, so that a stop-the-world restart resumes the quorum's count ----
    def load_checkpoint_state(self, state: dict) -> None:
        super().load_checkpoint_state(state)
        step = int(state["progress"]["global_step"])
        self.manager.load_state_dict({"step": step, "batches_committed": step * self.config.replicas})
        report("resumed", step)

    def evaluation(self) -> Evaluation:
        return Evaluation(self.model, self.device, group=self.dp_group)

    def epoch_extra(self, epoch: int, stats: dict) -> dict:
        return {"param_sha256": parameter_fingerprint(self.model), "quorum_log": list(self.log),
                "aborted_steps": list(self.aborted), "healed_at_steps": list(self.healed),
                "replica_group": self.info.group, "incarnation": self.info.incarnation}

    def record(self) -> dict:
        return {**self.config.record(), "mode": self.mode, "replica_group": self.info.group,
                "per_group_batch_size": self.config.batch_size // self.config.replicas}

    def progress_desc(self, epoch: int) -> str:
        return f"epoch {epoch} (replica group {self.info.group} of {self.config.replicas})"


def make_manager(config, model, optimizer, mesh, info, device):
    """This group's ``torchft.Manager``: heartbeats to the lighthouse of ``info``, its cross-group process group
    (gloo on CPU, NCCL on GPUs) re-formed at every new quorum, the model's and optimizer's state for healing."""
    from torchft import Manager, ProcessGroupGloo, ProcessGroupNCCL

    for name in ("torchft", "torchft_quorums", "torchft_commits", "torchft_errors"):
        logging.getLogger(name).setLevel(logging.CRITICAL)
    # A healing group reads a live peer's state over torchft's HTTP checkpoint server, which logs every request to
    # stderr (http.server's default), and torch warns once that the received buffer is read-only (it is only read):
    # neither is the run's news, and both would land in a notebook's output.
    import http.server
    import warnings

    http.server.BaseHTTPRequestHandler.log_message = lambda self, format, *args: None
    warnings.filterwarnings("ignore", message="The given buffer is not writable", category=UserWarning)
    timeout = timedelta(seconds=config.quorum_timeout)
    pg = ProcessGroupNCCL(timeout=timeout) if device.type == "cuda" else ProcessGroupGloo(timeout=timeout)

    def state_dict():
        return {"model": model.state_dict(), "optim": optimizer.state_dict()}

    def load_state_dict(state):
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optim"])

    return Manager(pg=pg, min_replica_size=config.min_replicas, load_state_dict=load_state_dict,
                   state_dict=state_dict, replica_id=f"replica{info.group}", store_addr=os.environ["MASTER_ADDR"],
                   store_port=int(os.environ["MASTER_PORT"]), rank=mesh.rank, world_size=mesh.world_size,
                   lighthouse_addr=info.lighthouse, hostname="127.0.0.1", use_async_quorum=False, init_sync=False,
                   timeout=timeout, quorum_timeout=timeout, connect_timeout=timeout)


def ft_training(config, data, mesh) -> FaultTolerantTraining:
    """The registry's builder (``build(config, data, mesh)``): this rank's GPT-2 (the same seed in every group),
    AdamW, the group's manager; returns once every group's manager heartbeats (the launcher's start barrier)."""
    from course.launch import context

    device = context().device
    info = replica()
    model = build_model(config, data.tokenizer.vocab_size).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=config.learning_rate)
    manager = make_manager(config, model, optimizer, mesh, info, device)
    training = FaultTolerantTraining(config, data, device, model, optimizer, manager, mesh, info,
                                     rank=mesh.rank,
                                     world_group=mesh.group("world"), throughput_group=mesh.dp_group,
                                     show_progress=mesh.rank == 0 and info.group == 0)
    wait_for_start()
    return training


def finish(training: FaultTolerantTraining, config, mesh) -> None:
    """After the epochs: the manager's server and checkpoint transport stop (the lighthouse is the launcher's)."""
    training.manager.shutdown(wait=False)
