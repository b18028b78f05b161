"""Every way to factor a world of ranks into a ``dp x pp x tp`` mesh that a model allows.

Used by the planner's ranked plans (:mod:`project.planner.search`), the fake world's sweep
(:func:`project.planner.fake_mesh.sweep`) and the 3D factorisation benchmark
(:mod:`three_d.labs.factorisation_benchmark`): one enumeration, in one order, for all of them.
"""
from __future__ import annotations


def factorisations(world_size: int, n_layer: int, n_head: int, n_inner: int) -> list[tuple[int, int, int]]:
    """Every ``(dp, pp, tp)`` with ``dp * pp * tp == world_size`` that the model allows
    (:meth:`course.dims.ParallelDims.check`: tp divides the heads and the MLP width, at least one block per
    stage), ordered by pp, then tp.

    Args:
        world_size: ranks to factor (>= 1).
        n_layer, n_head, n_inner: the model's blocks, attention heads and MLP width.

    Raises:
        ValueError: ``world_size`` < 1.
    """
    from course.dims import ParallelDims

    if world_size < 1:
        raise ValueError(f"a world needs at least one rank, not {world_size}")
    found = []
    for pp in range(1, world_size + 1):
        for tp in range(1, world_size // pp + 1):
            if world_size % (pp * tp):
                continue
            dims = ParallelDims(dp=world_size // (pp * tp), pp=pp, tp=tp)
            try:
                dims.check(world_size, n_layer=n_layer, n_head=n_head, n_inner=n_inner)
            except ValueError:
                continue
            found.append((dims.dp, pp, tp))
    return found
