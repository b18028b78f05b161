"""One rank of a 3D run, set up in one place: its mesh, its tensor-parallel stage and its stage runner.

Every 3D run — the training mode (``project/run_3d.py``), the notebook workers, the factorisation
benchmark and the tests — builds a rank the same way:

1. the run's device mesh (:class:`course.mesh.Mesh`, collective: every rank builds it with the same
   sizes, in the same order as every other mesh of the run);
2. this rank's pipeline stage of the model, its blocks split over the stage's tp group
   (:class:`three_d.stage.TensorParallelStage`), on the rank's device;
3. the stage runner over the pp group (:class:`pipeline.StageRunner`), whose loss is the
   vocabulary-parallel cross-entropy over the tp group (:class:`three_d.stage.StageLoss`).

Sources: Narayanan et al. 2021 (Megatron-LM "PTD-P"), Sec. 3.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

import pipeline
from course.mesh import Mesh, ParallelDims
from three_d.stage import StageLoss, TensorParallelStage


@dataclass
class ThreeDRank:
    """What one rank of a 3D run holds (see the module docstring)."""

    mesh: Mesh
    stage: TensorParallelStage
    runner: pipeline.StageRunner


def setup_rank(dims: ParallelDims, model, device: torch.device, *, scatter_gather: bool = False,
               mesh: Mesh | None = None) -> ThreeDRank:
    """Build this rank's mesh, its stage of ``model`` and the stage's runner.

    Args:
        dims: the run's sizes (dp, pp, tp).
        model: the single-device ``GPT2LMHeadModel``, the same on every rank (same seed).
        device: this rank's device (``course.launch.context().device``).
        scatter_gather: stages exchange 1/tp of each activation (:class:`three_d.stage.TensorParallelStage`).
        mesh: the run's mesh of these ``dims`` if it is already built (the one worker of ``project/train.py``
            builds every mode's mesh); None: built here.

    Collective over the world (the mesh and the runner's clock origin).

    Raises:
        ValueError: sizes that do not fit the world or the model.
    """
    if mesh is None:
        mesh = Mesh(dims)
    elif mesh.dims != dims:
        raise ValueError(f"the mesh was built for {mesh.dims}, not for {dims}")
    stage = TensorParallelStage(model, mesh.stage, dims.pp, group=mesh.tp_group, scatter_gather=scatter_gather)
    stage.to(device)
    runner = pipeline.StageRunner(stage, device, loss_fn=StageLoss(mesh.tp_group), group=mesh.pp_group)
    return ThreeDRank(mesh, stage, runner)
