"""Elastic data parallelism: a run whose world shrinks and grows between attempts and still trains one run.

Under ``python project/elastic.py --nnodes MIN:MAX --nproc_per_node G ...`` (torchrun's c10d rendezvous), the
number of ranks ``W`` changes whenever a node is lost or joins: every rank then starts again at the new ``W``
and continues from the run's latest checkpoint (DCP loads the model and AdamW state at any number of ranks:
:mod:`course.checkpoint`). For the run to stay *one* run, what a step computes must not depend on ``W``:

* **The data order is the world's, not the ranks'.** Step ``s`` of epoch ``e`` takes the global batch of
  positions ``s B .. (s + 1) B`` of the epoch's shuffle (seed ``seed + e``; :func:`data_parallel.data_order.
  global_batch_indices` at dp = 1), whatever ``W`` is. An epoch of ``n`` examples has ``n // B`` steps (the
  last ``n mod B`` examples of the shuffle are left out of that epoch). After a restart the run continues at
  the step after its checkpoint: within an epoch no example is trained on twice or skipped.
* **The same global batch, by gradient accumulation** (not by a recomputed per-rank batch). The global batch is
  cut into ``M = MAX x G`` micro-batches of ``B / M`` examples — as many as the largest world has ranks —, rank
  ``r`` of ``W`` takes micro-batches ``r M / W .. (r + 1) M / W`` (``M / W`` of them when ``W`` divides ``M``)
  and accumulates their gradients, each micro-batch's mean target-token loss scaled by ``W / M``; then
  :func:`data_parallel.average_gradients` (sum over the ``W`` ranks, divided by ``W``) leaves every rank with
  the gradient of **the mean over the M micro-batches of their mean losses** — the same function of the same
  examples at every ``W``, and the objective of the plain data-parallel run at ``dp = M``.

Recomputing the per-rank batch instead (``B / W`` rows each, as ``--resume`` at another ``--dp`` does:
:mod:`data_parallel.data_order`) would change the objective with ``W`` (each rank's mean weights its tokens by
its own count). With accumulation the only difference between worlds is the order of the float32 sums. When
``W / M`` is a power of two (``M`` = 2, ``W`` in {1, 2}, the course's test) every product by it is exact and
the sums have two terms (commutative, so exact too): a run that shrinks and grows computes **bit for bit** the
losses and weights of the uninterrupted run, dropout off (with dropout on, each rank draws its own masks and the
masks of a micro-batch depend on which rank takes it) and every rank computing with as many threads (a reduction
split over another number of threads rounds differently). For other sizes the worlds' sums differ by float32
rounding.

Rank 0 records the run in its log (:mod:`course.elastic`): each attempt's start (world, nodes, the checkpoint's
step), each step's loss and examples; it prints what each restart changed and, once the run is back where it
was, what it cost; the results file keeps it all under ``elastic`` (with ``--nnodes`` and torchrun's
``--max_restarts``).
"""
from __future__ import annotations

import os
import socket
import time

import torch.distributed as dist

from course import trace
from course.elastic import (append_event, describe_cost, describe_restart, log_path, parse_nnodes, read_events,
                            restarts, summary)
from course.epoch_runner import StepOutcome, to_device
from course.loss import model_loss
from data_parallel.data_order import global_batch_indices
from data_parallel.gradients import average_gradients
from data_parallel.training import DataParallelTraining


def micro_batches_per_step(nnodes: str, nproc_per_node: int) -> int:
    """``M = MAX x G``: the micro-batches of a global batch — one per rank of the largest world."""
    return parse_nnodes(nnodes)[1] * nproc_per_node


def my_micro_batches(rank: int, world_size: int, micro_batches: int) -> range:
    """The micro-batches rank ``rank`` of ``world_size`` takes: ``rank M / W .. (rank + 1) M / W`` (as even as
    whole numbers allow).

    Raises:
        ValueError: more ranks than micro-batches (``world_size > M``).
    """
    if world_size > micro_batches:
        raise ValueError(f"{world_size} ranks but {micro_batches} micro-batches per step: a world of at most "
                         f"MAX x nproc_per_node = {micro_batches} ranks")
    return range(rank * micro_batches // world_size, (rank + 1) * micro_batches // world_size)


class ElasticTraining(DataParallelTraining):
    """Plain data parallelism (:func:`average_gradients`) whose steps do not depend on the world size (see the
    module docstring).

    Args:
        micro_batches: ``M``, micro-batches per global batch (:func:`micro_batches_per_step`).
        nodes: every rank's ``{"host", "agent_pid", "restart_count", "rank"}`` (gathered by
            :func:`elastic_training`), for the log.
        (and :class:`data_parallel.training.DataParallelTraining`'s arguments, without sharding or grad_sync)
    """

    mode = "data_parallel"

    def __init__(self, config, data, device, model, optimizer, dp_group, *, micro_batches: int, nodes: list[dict],
                 **kwargs):
        super().__init__(config, data, device, model, optimizer, dp_group, **kwargs)
        self.micro_batches = micro_batches
        self.mine = my_micro_batches(self.dp_rank, self.dp_size, micro_batches)
        self.micro_batch_size = config.batch_size // micro_batches
        self.nodes = nodes
        self.log = log_path(config.workdir, self.results_prefix)
        self.attempt = None  # this attempt's number in the log (rank 0), once its first step starts
        self.back_at = None  # rank 0: the step after which the last restart's cost is known

    # ---- the data: the world's order, this rank's micro-batches ----

    def epoch_steps(self, epoch: int) -> list[list[int]]:
        """The epoch's global batches: positions in the training set, ``B`` each (full batches only), at most
        ``--max_batches``."""
        config = self.config
        batches = global_batch_indices(len(self.data.train), config.batch_size, 1, config.seed + epoch)
        batches = [b for b in batches if len(b) == config.batch_size]
        return batches if config.max_batches is None else batches[: config.max_batches]

    def epoch_batches(self, epoch: int):
        """Each step's ``{"step": global step, "positions": [this rank's micro-batches' positions]}`` (the
        micro-batches are collated when the step runs: the steps a resumed run skips cost nothing), and the
        number of steps."""
        steps = self.epoch_steps(epoch)
        size = self.micro_batch_size
        first = epoch * len(steps)  # every epoch has the same number of steps

        def batches():
            for s, positions in enumerate(steps):
                yield {"step": first + s + 1, "positions": [positions[m * size:(m + 1) * size] for m in self.mine]}

        return batches(), len(steps)

    # ---- the step: accumulate this rank's micro-batches, average over the ranks ----

    def train_step(self, batch: dict) -> StepOutcome:
        """Forward and backward of each of this rank's micro-batches (loss scaled by ``W / M``, gradients
        accumulated), gradients averaged over the dp group, optimizer step; then the step goes into the log."""
        if self.attempt is None:
            self._begin_attempt(batch["step"] - 1)
        data = self.data
        scale = self.dp_size / self.micro_batches
        self.optimizer.zero_grad(set_to_none=True)
        losses, tokens = [], 0
        for positions in batch["positions"]:
            micro = to_device(data.collate([data.train[i] for i in positions]), self.device)
            with trace.span("forward", "compute", self.device):
                loss = model_loss(self.model, micro)
            with trace.span("backward", "compute", self.device):
                (loss * scale).backward()
            losses.append(loss.item())
            tokens += int(micro["attention_mask"].sum())
        with trace.span("gradient sync", "communication", self.device, kind="after_backward"):
            average_gradients(self.model, self.dp_group)
        self.optimizer.step()
        self._log_step(batch, losses)
        return StepOutcome(sum(losses) / len(losses), tokens)

    # ---- the log (rank 0) ----

    def _gathered(self, value):
        everyone = [None] * dist.get_world_size(self.world_group)
        dist.all_gather_object(everyone, value, group=self.world_group)  # pickled host objects, over gloo
        return everyone

    def _begin_attempt(self, resumed_step: int) -> None:
        self.attempt = 0
        if self.rank != 0:
            return
        earlier = read_events(self.log)
        self.attempt = 1 + max((e["attempt"] for e in earlier), default=0)
        append_event(self.log, {"event": "start", "attempt": self.attempt, "time": time.time(),
                                "world_size": self.dp_size, "resumed_step": resumed_step, "nodes": self.nodes,
                                "nnodes": self.config.elastic, "run_id": os.environ.get("TORCHELASTIC_RUN_ID")})
        changes = restarts(read_events(self.log))
        if changes:
            last = changes[-1]
            print(describe_restart(last, self.config.elastic), flush=True)
            self.back_at = last["interrupted_after"]
            if not last["steps_redone"]:
                print(describe_cost(last), flush=True)
                self.back_at = None

    def _log_step(self, batch: dict, losses: list[float]) -> None:
        everyone = self._gathered((batch["positions"], losses))
        if self.rank != 0:
            return
        loss = sum(sum(ls) for _, ls in everyone) / self.micro_batches  # the mean over the M micro-batches
        examples = [i for positions, _ in everyone for part in positions for i in part]
        append_event(self.log, {"event": "step", "attempt": self.attempt, "step": batch["step"], "loss": loss,
                                "world_size": self.dp_size, "time": time.time(), "examples": examples})
        if batch["step"] == self.back_at:
            print(describe_cost(restarts(read_events(self.log))[-1]), flush=True)
            self.back_at = None

    # ---- what the results file records ----

    def epoch_extra(self, epoch: int, stats: dict) -> dict:
        record = [None]
        if self.rank == 0:
            record = [summary(read_events(self.log))]
        dist.broadcast_object_list(record, src=0, group=self.world_group)
        low, high = parse_nnodes(self.config.elastic)
        return {**super().epoch_extra(epoch, stats),
                "elastic": {"nnodes": self.config.elastic, "min_nodes": low, "max_nodes": high,
                            "max_restarts": int(os.environ.get("TORCHELASTIC_MAX_RESTARTS", 0)),
                            "run_id": os.environ.get("TORCHELASTIC_RUN_ID"),
                            "nproc_per_node": int(os.environ.get("LOCAL_WORLD_SIZE", self.dp_size)),
                            "micro_batches_per_step": self.micro_batches, "micro_batch_size": self.micro_batch_size,
                            "log": str(self.log), **record[0]}}

    def record(self) -> dict:
        return {**super().record(), "per_rank_batch_size": len(self.mine) * self.micro_batch_size,
                "micro_batches_per_step": self.micro_batches, "micro_batches_per_rank": len(self.mine),
                "grad_sync": "average_gradients, micro-batches accumulated"}


def node_of_this_rank(rank: int) -> dict:
    """This rank's node as the log names it: host, its torchrun agent's process id, the agent's restart count."""
    return {"host": socket.gethostname(), "agent_pid": os.getppid(),
            "restart_count": int(os.environ.get("TORCHELASTIC_RESTART_COUNT", 0)), "rank": rank}


def elastic_training(config, data, mesh) -> ElasticTraining:
    """This rank's :class:`ElasticTraining` over ``mesh.dp_group`` (``config.elastic`` set, under torchrun):
    the GPT-2 and AdamW of :func:`data_parallel.training.dp_training`, ``M`` from ``--elastic`` and torchrun's
    ``LOCAL_WORLD_SIZE``, every rank's node gathered for the log (collective over the world). On CPU an explicit
    ``OMP_NUM_THREADS`` sets the rank's threads (the launcher gives it the node's cores / LOCAL_WORLD_SIZE, which
    does not count the ranks of other agents on the same machine)."""
    import torch

    from data_parallel.training import dp_training

    threads = os.environ.get("OMP_NUM_THREADS", "")
    if threads.isdigit() and int(threads) > 0:  # several agents may share a machine (project/elastic_demo.py): the
        torch.set_num_threads(int(threads))  # launcher's cores / LOCAL_WORLD_SIZE would count this agent's ranks only
    everyone = [None] * mesh.world_size
    dist.all_gather_object(everyone, node_of_this_rank(mesh.rank), group=mesh.group("world"))
    nodes = {}
    for n in everyone:
        key = (n["host"], n["agent_pid"])
        nodes.setdefault(key, {**{k: n[k] for k in ("host", "agent_pid", "restart_count")}, "ranks": []})
        nodes[key]["ranks"].append(n["rank"])
    micro = micro_batches_per_step(config.elastic, int(os.environ.get("LOCAL_WORLD_SIZE", 1)))
    return dp_training(config, data, mesh, kind=ElasticTraining, micro_batches=micro,
                       nodes=list(nodes.values()))
