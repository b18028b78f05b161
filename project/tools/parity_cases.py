"""The configurations the loss-parity harness (``project/tools/parity.py``) compares, one entry each.

Every entry is a :class:`ParityCase`: the script configuration it trains with (its ``XConfig``
class and the options that differ from the common ones), how many ranks it takes, which
one-process run it is compared against, and the largest differences it may show — with the
reason. A builder turns the entry into something that takes one optimizer step on a global batch
(:class:`Stepper`), using the part's own training mode (``dp_training``, ``stage_training``,
``tp_training``, ``moe_training``, ``ThreeDTraining``): the harness runs the code the run scripts
run, on the batches it chooses.

**The references.** Not every configuration minimises the same function of a global batch:

* ``token``: the mean next-token loss over every target token of the batch — one process,
  the pipeline schedules (each micro-batch loss divided by the batch's token count), tensor
  parallelism (every rank sees the whole batch) and the 3D step (the dp ranks agree on the count).
* ``shards``: the mean over the dp ranks of each rank's own mean — data parallelism averages
  per-rank gradients of per-rank means (``average_gradients``, ZeRO, the reducers of part 5.4). When
  the shards hold different numbers of target tokens this is another function than ``token``; the
  harness reports how far apart the two one-process references are (the ``shards`` row).
* ``moe``: the mixture-of-experts GPT-2 (another model) in one process, the mean over the dp shards
  of each shard's loss plus its router losses (:func:`moe.training.accumulated_step`).

A new configuration (context parallelism, hybrid sharding) is one more entry in :data:`CASES`, with a
builder if none of the existing ones fits.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import torch

EXACT = 2e-5     # |loss difference| (nats/token) of configurations that compute the same sums in another order
EXACT_GRAD = 2e-5  # relative gradient-norm difference of the same
ORDER = ("fp32 summation order only (other shapes of matrix products, the reduction order of an all-reduce); "
         "AdamW turns a last-bit difference of a small gradient into a difference of up to lr in its update, "
         "so the gap may grow with the steps")
APPLIED = ("The gradient the optimizer applies is the decompressed one plus the error feedback, another vector "
           "than the exact gradient: its norm is shown, not bounded")


@dataclass(frozen=True)
class ParityCase:
    """One row of the parity table.

    Attributes:
        name: how the table names it.
        world_size: ranks it runs on.
        builder: a key of :data:`BUILDERS`, or ``"module:function"`` of a builder elsewhere (e.g. a test's
            planted wrong solution).
        config: ``"module:Class"`` of the script configuration (``Class.for_test(**options)``).
        options: the configuration's fields that differ from the harness's common ones.
        reference: which one-process run it is compared with: ``"token"``, ``"shards"`` or ``"moe"``.
        loss_tol: the largest allowed |loss - reference loss| at any step (nats/token).
        grad_tol: the largest allowed relative gradient-norm difference at any step.
        reason: why the tolerance is what it is.
    """

    name: str
    world_size: int
    builder: str
    config: str
    options: dict = field(default_factory=dict)
    reference: str = "token"
    loss_tol: float = EXACT
    grad_tol: float = EXACT_GRAD
    reason: str = ORDER


DP = "project.run_data_parallel:DataParallelConfig"
PIPE = "project.run_pipeline:PipelineConfig"
TP = "project.run_tensor_parallel:TensorParallelConfig"
THREE_D = "project.run_3d:ThreeDConfig"
MOE = "project.run_moe:MoERunConfig"

REFERENCES = {
    "token": ParityCase("1 process", 1, "one_process", DP, {"dp": 1}, reason="the reference"),
    "shards": ParityCase("1 process, mean of 2 shard means", 1, "one_process_shards", DP, {"dp": 1}, "token",
                         loss_tol=float("inf"), grad_tol=float("inf"),
                         reason="not a parity check: how far data parallelism's objective (the mean of per-rank "
                                "means) is from the batch's token mean on these batches"),
    "moe": ParityCase("1 process, MoE GPT-2, mean of 2 shards", 1, "one_process_moe", MOE, {"dp": 1, "ep": 1},
                      reason="the reference of the expert-parallel rows"),
}

CASES: list[ParityCase] = [
    ParityCase("DP 2", 2, "data_parallel", DP, {"dp": 2}, "shards"),
    ParityCase("DP 2, buckets, overlapped", 2, "data_parallel", DP, {"dp": 2, "bucket_mb": 0.25, "overlap": True},
               "shards"),
    ParityCase("DP 2, top-k 1%", 2, "data_parallel", DP, {"dp": 2, "compression": "topk", "topk_ratio": 0.01},
               "shards", loss_tol=1.0, grad_tol=float("inf"),
               reason="lossy: 1% of each gradient's entries are sent per step, the rest waits in the error-feedback "
                      "residual, so the loss falls more slowly; the bound says training does not stall or diverge "
                      "(it cannot tell a correct reducer from no communication at all). " + APPLIED),
    ParityCase("DP 2, PowerSGD rank 1", 2, "data_parallel", DP, {"dp": 2, "compression": "powersgd",
                                                                "powersgd_rank": 1},
               "shards", loss_tol=1.0, grad_tol=float("inf"),
               reason="lossy: each matrix gradient is replaced by a rank-1 approximation (error feedback keeps the "
                      "rest), so the loss falls more slowly and can jump when the residual grows; the bound says "
                      "training does not stall or diverge. " + APPLIED),
    ParityCase("ZeRO-1", 2, "data_parallel", DP, {"dp": 2, "zero": 1}, "shards"),
    ParityCase("ZeRO-2", 2, "data_parallel", DP, {"dp": 2, "zero": 2}, "shards"),
    ParityCase("ZeRO-3 (the course's FSDP)", 2, "data_parallel", DP, {"dp": 2, "zero": 3}, "shards"),
    ParityCase("DP 2, activation checkpointing", 2, "data_parallel", DP, {"dp": 2, "activation_checkpointing": True},
               "shards"),
    ParityCase("DP 2, bf16 autocast", 2, "data_parallel", DP, {"dp": 2, "precision": "bf16"}, "shards",
               loss_tol=0.01, grad_tol=0.05,
               reason="lossy: matrix products in bfloat16 (8-bit mantissa, relative rounding 2^-9) against fp32; "
                      "weights, reductions and Adam stay fp32"),
    ParityCase("GPipe, pp 2", 2, "pipeline", PIPE, {"schedule": "gpipe", "pp": 2, "micro_batches": 4}),
    ParityCase("1F1B, pp 2", 2, "pipeline", PIPE, {"schedule": "1f1b", "pp": 2, "micro_batches": 4}),
    ParityCase("interleaved 1F1B, pp 2 x 2 chunks", 2, "pipeline", PIPE,
               {"schedule": "interleaved", "pp": 2, "virtual_stages": 2, "micro_batches": 4}),
    ParityCase("ZB-H1, pp 2", 2, "pipeline", PIPE, {"schedule": "zb-h1", "pp": 2, "micro_batches": 4}),
    ParityCase("TP 2", 2, "tensor_parallel", TP, {"tp": 2}),
    ParityCase("TP 2 + SP", 2, "tensor_parallel", TP, {"tp": 2, "sequence_parallel": True}),
    ParityCase("EP 2 (MoE, dp 2)", 2, "moe", MOE, {"dp": 2, "ep": 2}, "moe"),
    ParityCase("3D dp 2 x pp 2 x tp 2", 8, "three_d", THREE_D,
               {"dp": 2, "pp": 2, "tp": 2, "micro_batches": 2, "max_grad_norm": 1e12},
               reason=ORDER + "; clipping off (max_grad_norm 1e12), as the reference does not clip"),
]


# ---- steppers ---------------------------------------------------------------------------------------

@dataclass
class Stepper:
    """One configuration on one rank, ready to train.

    A builder ``(rank, config, data, device, group=None) -> Stepper`` makes one: ``config`` is the case's
    configuration, ``data`` :func:`course.task.prepare_data`'s, ``group`` the ranks the case runs on (a
    one-process reference: a group of one rank, inside a launch of more; a parallel case builds its mesh
    over the launch's world instead).

    Attributes:
        step: ``step(global_batch) -> loss or None`` — one optimizer step on the global batch
            (dict of (batch, seq) tensors); the loss this rank computed (None where it computes none).
        optimizer: the ``torch.optim`` optimizer whose ``step`` applies the gradients (its pre-step hook
            sees them as they are applied: averaged, reduced, decompressed, sharded).
    """

    step: Callable[[dict], float | None]
    optimizer: torch.optim.Optimizer


def mode_stepper(mode, feed: Callable[[dict], dict] | None = None) -> Stepper:
    """A :class:`Stepper` of a part's training mode (:class:`course.epoch_runner.TrainingMode`) as the epoch
    runner would step it (``train_mode()``, its ``training`` state): ``mode.train_step(feed(batch))``."""
    mode.train_mode()
    mode.training(0)
    feed = feed or (lambda batch: batch)
    return Stepper(lambda batch: mode.train_step(feed(batch)).loss, _torch_optimizer(mode.optimizer))


def dp_rows(batch: dict, dp_rank: int, dp: int) -> dict:
    """Rows ``[r B/dp, (r+1) B/dp)`` of every tensor of ``batch`` (B rows): dp rank r's shard, as the 3D
    step takes it."""
    share = batch["input_ids"].size(0) // dp
    return {k: v[dp_rank * share:(dp_rank + 1) * share] if torch.is_tensor(v) else v for k, v in batch.items()}


def _torch_optimizer(optimizer) -> torch.optim.Optimizer:
    return getattr(optimizer, "optimizer", optimizer)  # memory.zero.ZeroOptimizer wraps the one that steps


def _one_process(rank, config, data, device, group=None) -> Stepper:
    from course.epoch_runner import supervised_step
    from course.task import build_model

    model = build_model(config, data.tokenizer.vocab_size).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=config.learning_rate)
    return Stepper(lambda batch: supervised_step(model, optimizer, batch, device).loss, optimizer)


def _one_process_shards(rank, config, data, device, group=None, shards: int = 2) -> Stepper:
    from course.epoch_runner import to_device
    from course.loss import model_loss
    from course.task import build_model

    model = build_model(config, data.tokenizer.vocab_size).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=config.learning_rate)

    def step(batch):
        optimizer.zero_grad(set_to_none=True)
        losses = [model_loss(model, to_device(dp_rows(batch, r, shards), device)) for r in range(shards)]
        loss = sum(losses) / shards
        loss.backward()
        optimizer.step()
        return loss.item()

    return Stepper(step, optimizer)


def _one_process_moe(rank, config, data, device, group=None, shards: int = 2) -> Stepper:
    from moe.training import accumulated_step, build_moe_model

    model = build_moe_model(config, data.tokenizer.vocab_size, group).to(device)  # a group of this rank alone
    optimizer = torch.optim.AdamW(model.parameters(), lr=config.learning_rate)

    def step(batch):
        losses = accumulated_step(model, optimizer, [dp_rows(batch, r, shards) for r in range(shards)], device)
        return sum(losses) / shards

    return Stepper(step, optimizer)


def _data_parallel(rank, config, data, device, group=None) -> Stepper:
    from course.mesh import Mesh
    from data_parallel.training import dp_training

    mode = dp_training(config, data, Mesh.build(dp=config.dp))
    return mode_stepper(mode, lambda batch: dp_rows(batch, mode.dp_rank, mode.dp_size))


def _pipeline(rank, config, data, device, group=None) -> Stepper:
    from course.mesh import Mesh
    from pipeline.training import stage_training

    return mode_stepper(stage_training(config, data, Mesh.build(pp=config.pp)))


def _tensor_parallel(rank, config, data, device, group=None) -> Stepper:
    from course.mesh import Mesh
    from tensor_parallel.training import tp_training

    return mode_stepper(tp_training(config, data, Mesh.build(tp=config.tp)))


def _moe(rank, config, data, device, group=None) -> Stepper:
    from course.collectives import group_rank, group_size
    from course.mesh import Mesh
    from moe.training import moe_training

    mode = moe_training(config, data, Mesh.build(dp=config.dp, ep=config.ep))
    group = mode.mesh.dp_cp_group
    return mode_stepper(mode, lambda batch: dp_rows(batch, group_rank(group), group_size(group)))


def _three_d(rank, config, data, device, group=None) -> Stepper:
    from course.task import build_model
    from three_d.rank_setup import setup_rank
    from three_d.training import ThreeDTraining

    return mode_stepper(ThreeDTraining(config, data, device, setup_rank(
        config.dims, build_model(config, data.tokenizer.vocab_size), device, scatter_gather=config.scatter_gather)))


BUILDERS: dict[str, Callable[..., Stepper]] = {
    "one_process": _one_process, "one_process_shards": _one_process_shards, "one_process_moe": _one_process_moe,
    "data_parallel": _data_parallel, "pipeline": _pipeline, "tensor_parallel": _tensor_parallel, "moe": _moe,
    "three_d": _three_d,
}


def builder(name: str) -> Callable[..., Stepper]:
    """The builder called ``name``: a key of :data:`BUILDERS` or ``"module:function"``.

    Raises:
        ValueError: an unknown name.
    """
    if name in BUILDERS:
        return BUILDERS[name]
    if ":" in name:
        import importlib

        module, function = name.split(":")
        return getattr(importlib.import_module(module), function)
    raise ValueError(f"unknown parity builder {name!r}; one of {sorted(BUILDERS)} or 'module:function'")
