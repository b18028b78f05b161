"""One pipeline training step on one rank, and the stages gathered back into one model.

:func:`pipeline_step` is the step both training modes with a multi-process pipeline run: the pipeline
part's (:class:`pipeline.training.StageTraining`) and the 3D step (:func:`three_d.step.three_d_step`,
which adds the dp averaging and the global gradient clip around it). On every rank of the pipeline's
group, one step is

1. the gradients of this rank's chunks set to None (this step's only);
2. the schedule's action list for this rank (:func:`pipeline.schedules.schedule_actions`) run by its
   :class:`pipeline.stage_runner.StageRunner`: every micro-batch forward and backward, the gradients
   accumulated in the chunks' parameters;
3. the tied embedding / LM-head gradient summed between the first and the last stage in the
   embedding group (Narayanan et al. 2021, Sec. 4.1; Press & Wolf 2017): the caller's sum, since each
   part has its own (assignments 5.2.3 and 5.6.3).

:func:`gather_stages` is the other half both modes share: for evaluation and export, every stage's
parameters are gathered in the pipeline's group into each rank's copy of the whole model.

Source: Narayanan et al. 2021, Megatron-LM, Sec. 2.2 (pipeline schedules) and 4.1 (the tied embedding).
"""
from __future__ import annotations

from typing import Callable

import torch
import torch.distributed as dist
from torch import nn

from course.collectives import group_size
from pipeline.schedules import schedule_actions
from pipeline.stage_measure import StepResult


def pipeline_step(runner, schedule: str, micro_batches: int, inputs: list | None, targets: list | None,
                  sum_tied: Callable[[], None]) -> StepResult:
    """Forward and backward of one batch through the pipeline, then the tied gradient summed (no optimizer step).

    Collective in the runner's group (and in the embedding group through ``sum_tied``): every stage calls it.

    Args:
        runner: this rank's :class:`pipeline.stage_runner.StageRunner` (its group: the mesh's ``pp`` group).
        schedule: a name in :data:`pipeline.schedules.SCHEDULES` (``"1f1b"``, ``"gpipe"``, ...).
        micro_batches: ``m``, the micro-batches of the batch.
        inputs: the ``m`` micro-batch inputs (token ids, (rows, seq) each); read on the first stage only,
            None is fine elsewhere.
        targets: the ``m`` targets of the runner's ``loss_fn``; read on the last stage only, None is fine elsewhere.
        sum_tied: called once the schedule has run, on every rank: sums the tied embedding gradient
            between the first and the last stage (e.g. ``lambda: TiedGradients(group)(tied)``).

    Returns:
        The runner's :class:`pipeline.stage_measure.StepResult` (losses on the last stage, events, peaks).

    Raises:
        ValueError: an unknown schedule or a number of micro-batches it refuses
            (:func:`pipeline.schedules.schedule_actions`); see :meth:`pipeline.stage_runner.StageRunner.run`.
    """
    actions = schedule_actions(schedule, runner.stage_index, runner.n_stages, micro_batches, runner.virtual_stages)
    for chunk in runner.chunks:
        for p in chunk.parameters():
            p.grad = None
    result = runner.run(actions, inputs if runner.is_first else None, targets if runner.is_last else None)
    sum_tied()
    return result


def gather_stages(model: nn.Module, mine: dict[str, torch.Tensor], group, skip: tuple[str, ...] = ()) -> list[dict]:
    """Every stage's parameters gathered in ``group`` and copied into ``model``; collective in ``group``.

    Args:
        model: this rank's copy of the whole model; its parameters named in any stage's ``mine`` are overwritten.
        mine: this stage's ``{name in model: tensor}`` (any device; sent through the host with
            ``all_gather_object``, which works on every back-end).
        group: the pipeline's process group (the mesh's ``pp`` group).
        skip: names not copied (e.g. the last stage's copy of a tied weight, whose original is the first stage's).

    Returns:
        Every stage's ``{name: CPU tensor}``, in stage order (the group's ranks).

    Raises:
        KeyError: a name of some stage that ``model`` does not have.
    """
    pieces: list = [None] * group_size(group)
    dist.all_gather_object(pieces, {name: t.detach().cpu() for name, t in mine.items()}, group=group)
    params = dict(model.named_parameters())
    with torch.no_grad():
        for piece in pieces:
            for name, value in piece.items():
                if name not in skip:
                    params[name].copy_(value)
    return pieces
