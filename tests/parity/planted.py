"""Wrong configurations planted into the parity harness: each must break its tolerance (builders for
``project.tools.parity_cases.ParityCase(builder="tests.parity.planted:<name>")``, imported by the ranks)."""
from __future__ import annotations

import torch.distributed as dist

from project.tools.parity_cases import Stepper, dp_rows, mode_stepper


class _SumWithoutAveraging:
    """A gradient synchroniser that sums the dp ranks' gradients and forgets to divide by dp."""

    def __init__(self, model, group):
        self.model, self.group = model, group

    def before_backward(self):
        pass

    def finish(self):
        for p in self.model.parameters():
            if p.grad is not None:
                dist.all_reduce(p.grad, group=self.group)


def summed_dp(rank, config, data, device, group=None) -> Stepper:
    """Data parallelism whose gradients are summed, not averaged (Adam hides it from the loss; the norm shows it)."""
    from course.mesh import Mesh
    from data_parallel.training import dp_training

    mode = dp_training(config, data, Mesh.build(dp=config.dp))
    mode.grad_sync = _SumWithoutAveraging(mode.model, mode.dp_group)
    return mode_stepper(mode, lambda batch: dp_rows(batch, mode.dp_rank, mode.dp_size))


def untied_pipeline(rank, config, data, device, group=None) -> Stepper:
    """1F1B whose first and last stage never sum the tied embedding / LM-head gradient."""
    from course.mesh import Mesh
    from pipeline.training import stage_training

    mode = stage_training(config, data, Mesh.build(pp=config.pp))
    mode.sync_tied = lambda tied: None
    return mode_stepper(mode)


def unsynced_sequence_parallel(rank, config, data, device, group=None) -> Stepper:
    """TP + SP that skips the all-reduce of the layer norms' partial gradients."""
    from course.mesh import Mesh
    from tensor_parallel.training import tp_training

    mode = tp_training(config, data, Mesh.build(tp=config.tp))
    mode.model.sync_grads = lambda *ignored: None
    return mode_stepper(mode)
