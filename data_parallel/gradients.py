"""Assignment 5.1.2 (part 2) — averaging gradients with all-reduce.

After each rank's backward pass on its own shard, every gradient is all-reduced (summed
over the ranks of the data-parallel group) and divided by the group's size, so every rank
holds the gradient of the mean loss over the global batch and the replicas stay identical
after ``optimizer.step()`` (Li et al. 2020, PyTorch Distributed, Sec. 3.2; Goyal et al. 2017).

In a run that also splits the model (tensor or pipeline parallelism), only the ranks that
hold the *same* part of the model average their gradients: the ``dp`` group of the run's
mesh (:class:`course.mesh.Mesh`), not the whole world.
"""
from __future__ import annotations

import torch
import torch.distributed as dist


def average_gradients(model: torch.nn.Module, group=None) -> None:
    """Replace every ``param.grad`` by its mean over the ranks of ``group``, in place.

    Each gradient is all-reduced with ``ReduceOp.SUM`` in ``group`` and divided by the
    group's size. Parameters whose ``grad`` is None (unused, or frozen) are skipped. Shapes
    are unchanged; on return every rank of ``group`` holds the same gradients.

    Args:
        model: this rank's replica.
        group: the data-parallel process group; None: every rank of the run (the world).

    Raises:
        RuntimeError: no process group (call :func:`data_parallel.process_group.setup` or
            run under the launcher).
    """
    if not dist.is_initialized():
        raise RuntimeError("average_gradients needs a process group: run it inside course.launch.launch")
    # BEGIN ASSIGN5_1_2
    world_size = dist.get_world_size(group)
    for param in model.parameters():
        if param.grad is None:
            continue
        dist.all_reduce(param.grad, op=dist.ReduceOp.SUM, group=group)
        param.grad /= world_size
    # END ASSIGN5_1_2
