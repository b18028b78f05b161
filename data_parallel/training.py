"""Assignment 5.1.3 — data-parallel training of GPT-2: the training mode and its builder.

:func:`dp_training` builds what ``project/run_data_parallel.py`` (``project/train.py --mode dp``) trains on every
rank. Each rank holds a full replica of
the model, trains on its own shard of every global batch, and averages gradients over the
data-parallel group before each optimizer step, so the replicas never diverge.
:class:`DataParallelTraining` says what one epoch and one step are; the shared epoch
runner (:func:`course.epoch_runner.run_epochs`) does the rest (evaluation, BLEU, results).
"""
from __future__ import annotations

import contextlib
from pathlib import Path
from types import SimpleNamespace

import torch
import torch.distributed as dist

from course.epoch_runner import Evaluation, StepOutcome, TrainingMode, supervised_step
from course.launch import context
from course.mesh import Mesh
from course.model import parameter_fingerprint
from course.task import build_model
from data_parallel.data_order import DATA_ORDER, regrouped_batches
from data_parallel.gradients import average_gradients
from data_parallel.partition import partition_dataset


def common_steps(n_batches: int, max_batches: int | None = None, group=None) -> int:
    """Batches every rank of ``group`` can run: the fewest any rank has (ranks must step
    together, or the all-reduce of the rank with one more batch waits forever)."""
    # a count: a host tensor, over the group's gloo back-end (docs/architecture.md, "Devices and back-ends")
    t = torch.tensor([n_batches if max_batches is None else min(n_batches, max_batches)], device="cpu")
    dist.all_reduce(t, op=dist.ReduceOp.MIN, group=group)
    return int(t)


class DataParallelTraining(TrainingMode):
    """Data parallelism over the ``dp`` group: a shard of every global batch per rank, gradients averaged.

    Args:
        model, optimizer: this rank's replica and its optimizer.
        dp_group: the data-parallel group; ``dp_rank``/``dp_size`` are this rank's place in it.
        sharding: optional; an object that does the whole training step instead (``train_step(batch,
            device)``, ``begin_evaluation()``, ``summon_full_params()``, ``record()``), e.g.
            ``memory.training.ShardedStep`` for ``--zero``, ``--activation_checkpointing``, ``--precision``;
            None (default): plain data parallelism.
        grad_sync: None: :func:`average_gradients` after the backward pass. Otherwise an object
            with ``before_backward()`` (called before the forward pass) and ``finish()`` (after
            the backward pass; leaves the averaged gradients in ``param.grad``), e.g. the
            bucketed reducer of the communication part, built by the run script.
        (and the :class:`course.epoch_runner.TrainingMode` arguments)
    """

    mode = "data_parallel"

    def __init__(self, config, data, device, model, optimizer, dp_group, sharding=None, grad_sync=None, **kwargs):
        super().__init__(config, data, device, **kwargs)
        if sharding is not None and grad_sync is not None:
            raise ValueError("give a sharding (it does its own gradient communication) or a grad_sync, not both")
        self.model, self.optimizer, self.dp_group = model, optimizer, dp_group
        self.sharding, self.grad_sync = sharding, grad_sync
        self.dp_rank, self.dp_size = dist.get_rank(dp_group), dist.get_world_size(dp_group)
        self.initial_sha = self.fingerprint()
        self.order_dp = self.dp_size  # whose data order the epoch in progress follows (data_order.py)
        self.resumed_order: tuple[int, int] | None = None  # (epoch, dp) of a checkpoint's data order

    def fingerprint(self) -> str:
        if self.sharding is None:
            return parameter_fingerprint(self.model)
        with self.sharding.summon_full_params():  # copies: numpy() would pin a sharded storage
            params = [p.detach().clone() for p in self.model.parameters()]
        return parameter_fingerprint(SimpleNamespace(parameters=lambda: params))

    def epoch_batches(self, epoch: int):
        """This rank's shard of the epoch (a new shuffle each epoch: seed ``config.seed + epoch``),
        and the number of steps every rank of the dp group can take."""
        config, data = self.config, self.data
        loader = steps = None
        # BEGIN ASSIGN5_1_3
        loader = partition_dataset(self.dp_rank, self.dp_size, data.train, config.batch_size, data.collate,
                                   seed=config.seed + epoch)
        steps = common_steps(len(loader), config.max_batches, self.dp_group)
        # END ASSIGN5_1_3
        self.order_dp = self.dp_size
        if self.resumed_order is not None and self.resumed_order[0] == epoch and self.resumed_order[1] != self.dp_size:
            # resumed at another dp in mid-epoch: the epoch keeps the global batches of the run that began it
            self.order_dp = self.resumed_order[1]
            loader, steps = regrouped_batches(data.train, config.batch_size, data.collate, config.seed + epoch,
                                              self.order_dp, self.dp_rank, self.dp_size, config.max_batches)
        return loader, steps

    # ---- checkpoints: model and optimizer (ZeRO: memory.sharded_checkpoint), and the data order ----

    def checkpoint_state(self) -> dict:
        """The model and optimizer (ZeRO-1/2/3: the sharding's state, keyed independently of dp) and
        ``data_order``: the dp whose global batches the epoch in progress follows (:mod:`data_parallel.data_order`)."""
        sharded = self.sharding is not None and getattr(self.sharding, "zero", 0)
        state = self.sharding.checkpoint_state() if sharded else super().checkpoint_state()
        return {**state, DATA_ORDER: torch.tensor([self.order_dp], dtype=torch.int64, device="cpu")}

    def load_checkpoint_state(self, state: dict) -> None:
        if self.sharding is not None and getattr(self.sharding, "zero", 0):
            self.sharding.load_checkpoint_state(state)
        else:
            super().load_checkpoint_state(state)
        self.resumed_order = (int(state["progress"]["epoch"]), int(state[DATA_ORDER][0]))

    def train_step(self, batch: dict) -> StepOutcome:
        """Forward and backward on this rank's shard, gradients averaged over the dp group, optimizer step."""
        if self.sharding is not None:
            return self.sharding.train_step(batch, self.device)
        if self.grad_sync is not None:
            self.grad_sync.before_backward()
            return supervised_step(self.model, self.optimizer, batch, self.device,
                                   after_backward=lambda m: self.grad_sync.finish())
        # BEGIN ASSIGN5_1_3
        return supervised_step(self.model, self.optimizer, batch, self.device,
                               after_backward=lambda m: average_gradients(m, self.dp_group))
        # END ASSIGN5_1_3

    def export_state(self) -> dict:
        """The replica's weights as the GPT-2's state dict (ZeRO-3: every unit gathered first; copies, since
        the gathered storage is freed after)."""
        if self.sharding is None:
            return super().export_state()
        with self.sharding.summon_full_params():
            return {name: t.detach().clone() for name, t in self.model.state_dict().items()}

    def evaluation(self) -> Evaluation:
        # Validation and BLEU are shared out over the ranks too, then summed / gathered.
        if self.sharding is not None:
            self.sharding.begin_evaluation()
        return Evaluation(self.model, self.device, group=self.dp_group)

    def training(self, epoch: int):
        if self.sharding is not None and hasattr(self.sharding, "training"):
            return self.sharding.training()
        return super().training(epoch)

    def epoch_extra(self, epoch: int, stats: dict) -> dict:
        extra = {"param_sha256": self.fingerprint(), "initial_param_sha256": self.initial_sha}
        if self.order_dp != self.dp_size:
            extra["data_order_dp"] = self.order_dp
        if self.sharding is not None and hasattr(self.sharding, "epoch_extra"):
            extra.update(self.sharding.epoch_extra(stats["steps"]))
        return extra

    def record(self) -> dict:
        return {**self.config.record(), "world_size": self.dp_size, "mode": self.mode,
                "per_rank_batch_size": self.config.batch_size // self.dp_size,
                "grad_sync": "average_gradients" if self.grad_sync is None else type(self.grad_sync).__name__,
                **(self.sharding.record() if self.sharding is not None else {})}

    def progress_desc(self, epoch: int) -> str:
        return f"epoch {epoch} (rank 0 of {self.dp_size})"


def save_final_checkpoint(mode: DataParallelTraining, mesh: Mesh) -> None:
    """With ``--save_checkpoint`` (``mode.config.save_checkpoint``), after training: the final weights, gathered from
    their shards under ZeRO-3, to ``<workdir>/checkpoint_data_parallel.pt`` (a ``torch.save`` file made from a DCP
    checkpoint, :func:`course.checkpoint.save_final_weights`). Collective over ``mesh.dp_group``; nothing without
    the option."""
    if not mode.config.save_checkpoint:
        return
    from course.checkpoint import save_final_weights

    with mode.sharding.summon_full_params() if mode.sharding is not None else contextlib.nullcontext():
        save_final_weights({k: v.detach().clone() for k, v in mode.model.state_dict().items()},
                           Path(mode.config.workdir) / "checkpoint_data_parallel.pt", rank=mode.rank,
                           group=mesh.dp_group)


def dp_training(config, data, mesh: Mesh, *, kind: type | None = None, **extra) -> DataParallelTraining:
    """This rank's :class:`DataParallelTraining` over ``mesh.dp_group``: the GPT-2 of ``config`` (same seed on every
    rank) on the worker's device, with what the run's options ask for — the memory part's sharded step for
    ``--zero``, ``--activation_checkpointing`` or ``--precision bf16`` (:func:`memory.build_sharding`: its
    optimizer), else the communication part's synchroniser for ``--bucket_mb``, ``--overlap`` or
    ``--compression`` (:func:`communication.build_grad_sync`), else AdamW at ``config.learning_rate`` with
    :func:`average_gradients` after each backward pass. What ``project/train.py --mode dp`` trains; the parity
    harness (``project/tools/parity.py``) steps it directly. ``kind``: a subclass of :class:`DataParallelTraining`
    to build instead, with ``extra`` keyword arguments (``--elastic``: :func:`data_parallel.elastic.elastic_training`
    builds its :class:`data_parallel.elastic.ElasticTraining` so)."""
    device = context().device
    model = build_model(config, data.tokenizer.vocab_size).to(device)
    sharding = grad_sync = None
    if config.memory_options():
        from memory import build_sharding

        sharding = build_sharding(model, config, mesh.dp_group, mesh)
    elif config.communication_options():
        from communication import build_grad_sync

        grad_sync = build_grad_sync(config, model, mesh.dp_group)
    optimizer = sharding.optimizer if sharding is not None else torch.optim.AdamW(model.parameters(),
                                                                                   lr=config.learning_rate)
    return (kind or DataParallelTraining)(config, data, device, model, optimizer, mesh.dp_group, sharding=sharding,
                                          grad_sync=grad_sync, rank=mesh.rank, world_group=mesh.group("world"),
                                          throughput_group=mesh.dp_group, show_progress=mesh.rank == 0, **extra)
