"""Measuring the bubble of a real multi-process pipeline whose stages have equal cost.

Each stage is a small linear layer plus a :class:`Sleep` that waits ``t_forward`` seconds
in its forward and ``t_backward`` seconds in its backward. Sleeping does not use the
CPU, so every stage costs the same however few cores the machine has, and the measured
timeline shows the schedule itself (plus the real send/recv between the processes) —
not the contention of many processes for two cores. The measured bubble fraction can
then be compared with ``(p - 1) / (m + p - 1)`` (:func:`pipeline.metrics.bubble_fraction`).
"""
from __future__ import annotations

import time

import torch
from torch import nn

from pipeline.metrics import measured_bubble_fraction
from pipeline.stage_runner import StageRunner
from pipeline.schedules import schedule_actions


class Sleep(torch.autograd.Function):
    """Identity that sleeps ``t_forward`` s in forward and ``t_backward`` s in backward."""

    @staticmethod
    def forward(ctx, x, t_forward: float, t_backward: float):
        ctx.t_backward = t_backward
        time.sleep(t_forward)
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        time.sleep(ctx.t_backward)
        return grad, None, None


class SleepStage(nn.Module):
    """(mb, width) -> (mb, width): ``Sleep(linear(x))``, a stage of fixed cost.

    Args:
        t_forward, t_backward: seconds slept per call, or per row of the input if ``per_row``
            (a device whose time grows with the micro-batch size).
    """

    def __init__(self, width: int, t_forward: float, t_backward: float, per_row: bool = False):
        super().__init__()
        self.linear = nn.Linear(width, width)
        self.t_forward, self.t_backward, self.per_row = t_forward, t_backward, per_row

    def forward(self, x):
        scale = x.shape[0] if self.per_row else 1
        return Sleep.apply(self.linear(x), self.t_forward * scale, self.t_backward * scale)


def sleep_pipeline_worker(rank: int, world_size: int, plan: dict[str, list[int]], t_forward: float,
                          t_backward: float, repeats: int = 2, width: int = 8) -> dict:
    """Run every schedule of ``plan`` (``{schedule name: [m, ...]}``) with each of its ``m``, ``repeats`` steps
    each; return this rank's timelines.

    A worker for :func:`course.launch.launch`. Returns ``{schedule: {m: [StepResult as dict per step]}}``.
    """
    from course.launch import context
    from course.mesh import Mesh

    device = context().device
    mesh = Mesh.build(pp=world_size)
    torch.manual_seed(0)
    stage = SleepStage(width, t_forward, t_backward).to(device)
    runner = StageRunner(stage, device, loss_fn=lambda y, t: ((y - t) ** 2).mean(), group=mesh.pp_group)
    out = {}
    for schedule, micro_batches in plan.items():
        out[schedule] = {}
        for m in micro_batches:
            actions = schedule_actions(schedule, mesh.stage, world_size, m)
            inputs = [torch.randn(2, width, device=device) for _ in range(m)] if mesh.is_first_stage else None
            targets = [torch.zeros(2, width, device=device) for _ in range(m)] if mesh.is_last_stage else None
            steps = []
            for _ in range(repeats):
                torch.distributed.barrier(group=mesh.pp_group)
                result = runner.run(actions, inputs, targets)
                steps.append(dict(events=result.events, peak_in_flight=result.peak_in_flight,
                                  peak_activation_bytes=result.peak_activation_bytes))
            out[schedule][m] = steps
    return out


def measure_bubbles(n_stages: int, plan: dict[str, list[int]], t_forward: float = 0.02, t_backward: float = 0.02,
                    repeats: int = 2, timeout: float = 180.0) -> dict:
    """Launch ``n_stages`` processes once and measure the bubble fraction of every schedule and ``m`` of ``plan``.

    Args:
        plan: ``{schedule name (pipeline.schedules.SCHEDULES): [m, ...]}``, e.g. ``{"1f1b": [1, 4], "gpipe": [4]}``.

    Returns:
        ``{schedule: {"bubble": {m: measured fraction (min over the repeats)}, "events": {m: events[r] of the
        step with that fraction}, "peak_in_flight": {m: [per rank]}}}``.
    """
    from course.launch import launch

    plan = {name: list(ms) for name, ms in plan.items()}
    per_rank = launch(sleep_pipeline_worker, n_stages, plan, t_forward, t_backward, repeats, device="cpu",
                      timeout=timeout, collective_timeout=60)
    reports = {}
    for schedule, micro_batches in plan.items():
        report = reports[schedule] = {"bubble": {}, "events": {}, "peak_in_flight": {}}
        for m in micro_batches:
            fractions = []
            for step in range(repeats):
                events = [per_rank[r][schedule][m][step]["events"] for r in range(n_stages)]
                fractions.append((measured_bubble_fraction(events), events))
            best = min(fractions, key=lambda f: f[0])
            report["bubble"][m], report["events"][m] = best
            report["peak_in_flight"][m] = [per_rank[r][schedule][m][-1]["peak_in_flight"] for r in range(n_stages)]
    return reports


def measure_bubble(n_stages: int, micro_batches: list[int], schedule: str = "1f1b", t_forward: float = 0.02,
                   t_backward: float = 0.02, repeats: int = 2, timeout: float = 180.0) -> dict:
    """One schedule of :func:`measure_bubbles`: ``{"bubble": {m: ...}, "events": {m: ...}, "peak_in_flight": {m: ...}}``."""
    return measure_bubbles(n_stages, {schedule: micro_batches}, t_forward, t_backward, repeats, timeout)[schedule]
