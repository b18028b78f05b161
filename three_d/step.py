"""Assignment 5.6.3: one 3D training step — pipeline over pp, tensor parallel stages, data parallel over dp.

Every rank holds one :class:`three_d.stage.TensorParallelStage` (its stage's blocks, its tp
shard) and this dp rank's share of the global batch. One step:

1. the global number of counted target tokens ``N`` (an all-reduce of the local counts in
   the dp group), so each micro-batch loss is ``sum of token losses / (N / dp)``;
2. the pipeline's step (:func:`pipeline.pipeline_step`, the one the pipeline part trains with):
   the schedule (``pipeline.one_f_one_b_actions`` or ``pipeline.gpipe_actions``) run by a
   :class:`pipeline.StageRunner` over the **pp** group — activations go to the same tp rank of the
   next stage; the stage's tensor-parallel all-reduces stay in its **tp** group — then
3. the tied embedding / LM-head gradient summed between the first and the last stage, in
   the **embedding** group (Narayanan et al. 2021, Sec. 4.1; Shoeybi et al. 2019):
   :func:`sum_tied_gradients`, handed to the pipeline's step;
4. gradients averaged over the **dp** group only (the ranks that hold the same shard of the
   same layers: averaging over the world would mix different layers and shards);
5. the global gradient norm ``sqrt(sum of squares)`` over the whole model, **each parameter
   counted once**: a tp-sharded parameter contributes its shard on every tp rank, a
   replicated one (layer norms, position embedding, row-parallel biases) only once (it is
   identical on the tp ranks), the last stage's copy of the tied weight not at all (the
   first stage's counts); the squares are summed over the tp and the pp group (the dp
   replicas are equal after step 4); then every gradient is scaled by
   ``min(1, max_norm / (norm + 1e-6))`` as ``torch.nn.utils.clip_grad_norm_`` does.

The optimizer step follows (the caller's). With this, the loss and every gradient equal
those of one process running the dense GPT-2 on the whole global batch (tested).

Sources: Narayanan et al. 2021 (Megatron-LM "PTD-P"), Sec. 3 and 4.1; torchtitan's
``clip_grad_norm_`` over a device mesh.
"""
from __future__ import annotations

import math

import torch

import pipeline
from course.collectives import all_reduce, group_size
from three_d import SCHEDULES, V_SCHEDULE_MESSAGE, V_SCHEDULES  # the schedules a 3D step runs


def count_targets(labels: torch.Tensor) -> int:
    """Counted next-token targets of (batch, seq) ``labels``: label t+1 != -100."""
    return int((labels[:, 1:] != -100).sum())


def sum_tied_gradients(stage, embedding_group) -> None:
    """Sum the tied weight's gradient between the first and the last stage (in place)."""
    tied = stage.tied
    if embedding_group is None or tied is None:
        return
    # BEGIN ASSIGN5_6_3
    grad = tied.grad if tied.grad is not None else torch.zeros_like(tied)
    tied.grad = all_reduce(grad, embedding_group)
    # END ASSIGN5_6_3


def average_over_dp(stage, dp_group) -> None:
    """Average every gradient of ``stage`` over ``dp_group`` (one flat all-reduce)."""
    params = [p for p in stage.parameters() if p.grad is not None]
    if not params or group_size(dp_group) == 1:
        return
    # BEGIN ASSIGN5_6_3
    flat = torch.cat([p.grad.reshape(-1) for p in params])
    flat = all_reduce(flat, dp_group) / group_size(dp_group)
    offset = 0
    for p in params:
        p.grad.copy_(flat[offset:offset + p.numel()].view_as(p.grad))
        offset += p.numel()
    # END ASSIGN5_6_3


def global_grad_norm(stage, tp_group, pp_group, tp_rank: int) -> float:
    """The 2-norm of the whole model's gradient, every parameter counted once (see module doc, 5.)."""
    sharded = stage.sharded_parameters()
    tied_copy = stage.lm_head.weight if stage.lm_head is not None else None
    # BEGIN ASSIGN5_6_3
    square = None
    for p in stage.parameters():
        if p.grad is None or p is tied_copy:
            continue
        if id(p) not in sharded and tp_rank != 0:
            continue
        s = p.grad.detach().double().pow(2).sum()
        square = s if square is None else square + s
    if square is None:  # on the gradients' device, as on the other ranks (NCCL), even with nothing to add
        square = torch.zeros((), dtype=torch.float64, device=next(stage.parameters()).device)
    square = all_reduce(all_reduce(square.reshape(1), tp_group), pp_group)
    return math.sqrt(float(square))
    # END ASSIGN5_6_3


def clip_gradients(stage, norm: float, max_norm: float) -> None:
    """Scale every gradient by ``min(1, max_norm / (norm + 1e-6))``."""
    coef = min(1.0, max_norm / (norm + 1e-6))
    for p in stage.parameters():
        if p.grad is not None:
            p.grad.mul_(coef)


def three_d_step(stage, runner, mesh, input_ids: torch.Tensor, labels: torch.Tensor, micro_batches: int,
                 schedule: str = "1f1b", max_norm: float | None = 1.0) -> dict:
    """One 3D step's forward, backward and gradient processing (no optimizer step).

    Args:
        stage: this rank's :class:`three_d.stage.TensorParallelStage`.
        runner: its :class:`pipeline.StageRunner` (group: ``mesh.pp_group``, loss_fn:
            :class:`three_d.stage.StageLoss` over ``mesh.tp_group``).
        mesh: the run's :class:`course.mesh.Mesh`.
        input_ids, labels: this dp rank's share of the global batch, (batch / dp, seq) each;
            labels -100 where not counted. The same on the tp ranks and the stages of a
            pipeline (only the first stage uses input_ids, only the last labels).
        micro_batches: micro-batches per step (divides batch / dp).
        schedule: a name in :data:`SCHEDULES` (``"1f1b"``, ``"gpipe"``, ``"zb-h1"``).
        max_norm: clip the global gradient norm to this; None: no clipping (the norm is still measured).

    Returns:
        ``{"loss": the global batch's mean token loss (last stage; None elsewhere),
        "grad_norm": the global gradient norm before clipping, "result": the runner's StepResult}``.

    Raises:
        ValueError: an unknown schedule; ``micro_batches`` not dividing the local batch.
    """
    if schedule in V_SCHEDULES:
        raise ValueError(V_SCHEDULE_MESSAGE.format(name=schedule))
    if schedule not in SCHEDULES:
        raise ValueError(f"--schedule {schedule!r} is unknown; choose one of {sorted(SCHEDULES)}")
    if input_ids.size(0) % micro_batches:
        raise ValueError(f"--micro_batches {micro_batches} does not divide the per-dp-rank batch of "
                         f"{input_ids.size(0)} rows")
    dp = group_size(mesh.dp_group)
    # a count, on the host: it travels over the group's gloo back-end (docs/architecture.md, "Devices and back-ends")
    n_target = float(all_reduce(torch.tensor([float(count_targets(labels))], dtype=torch.float64, device="cpu"),
                                mesh.dp_group))
    denominator = max(n_target, 1.0) / dp
    micro = input_ids.size(0) // micro_batches
    inputs = list(input_ids.split(micro))
    targets = [(lab, denominator) for lab in labels.split(micro)]
    # the pipeline's step (pipeline.pipeline_step): the schedule over pp, then the tied gradient summed
    result = pipeline.pipeline_step(runner, schedule, micro_batches, inputs, targets,
                                    lambda: sum_tied_gradients(stage, mesh.embedding_group))
    average_over_dp(stage, mesh.dp_group)
    norm = global_grad_norm(stage, mesh.tp_group, mesh.pp_group, mesh.tp_rank)
    if max_norm is not None:
        clip_gradients(stage, norm, max_norm)
    loss = None
    if stage.is_last:
        local = torch.tensor([sum(result.losses.values())], dtype=torch.float64, device="cpu")  # floats: host
        loss = float(all_reduce(local, mesh.dp_group)) / dp
    return {"loss": loss, "grad_norm": norm, "result": result}
