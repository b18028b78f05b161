"""Assignment 5.6.1: the 3-D mesh's rank arithmetic — coordinates and groups of a global rank.

``dp * pp * tp`` ranks form a grid with dimensions ordered ``("pp", "dp", "tp")`` as
``torch.distributed.device_mesh.init_device_mesh(device, (pp, dp, tp),
mesh_dim_names=("pp", "dp", "tp"))`` lays them out (and as torchtitan and Megatron-LM do):
**tp varies fastest** (a tensor-parallel group is made of neighbouring ranks — one node,
NVLink), **pp slowest** (the stages of a pipeline may sit on different nodes)::

    rank = (pp_rank * dp + dp_rank) * tp + tp_rank

A rank's group along one dimension is the ranks that share its other two coordinates.
Example dp = 2, pp = 2, tp = 2: rank 5 is at (pp 1, dp 0, tp 1); its tp group is [4, 5],
its dp group [5, 7], its pp group [1, 5].

Sources: Narayanan et al. 2021 (Megatron-LM, Sec. 3, "PTD-P"); PyTorch ``DeviceMesh``.
:class:`course.mesh.Mesh` builds the real process groups inside each rank.
"""
from __future__ import annotations


def _check(rank: int, dp: int, pp: int, tp: int) -> None:
    for name, value in (("dp", dp), ("pp", pp), ("tp", tp)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"{name} must be a whole number >= 1, not {value!r}")
    if not isinstance(rank, int) or not 0 <= rank < dp * pp * tp:
        raise ValueError(f"rank {rank!r} is outside 0..{dp * pp * tp - 1} (dp x pp x tp = {dp * pp * tp} ranks)")


def coordinates(rank: int, dp: int, pp: int, tp: int) -> tuple[int, int, int]:
    """The ``(pp_rank, dp_rank, tp_rank)`` of global rank ``rank`` in a ``dp x pp x tp`` mesh.

    Equal to ``init_device_mesh(..., (pp, dp, tp), mesh_dim_names=("pp", "dp", "tp"))``'s
    ``get_coordinate()`` on that rank.

    Raises:
        ValueError: a size < 1 or ``rank`` outside ``0 .. dp*pp*tp - 1``.
    """
    _check(rank, dp, pp, tp)
    # BEGIN ASSIGN5_6_1
    return (rank // (dp * tp), rank // tp % dp, rank % tp)
    # END ASSIGN5_6_1


def group_ranks(rank: int, dp: int, pp: int, tp: int) -> dict[str, list[int]]:
    """The global ranks of ``rank``'s groups: ``{"dp": [...], "pp": [...], "tp": [...]}``.

    Each list is sorted by the group rank (the coordinate along that dimension) and
    contains ``rank`` itself: the ``tp`` list has ``tp`` ranks that differ only in their tp
    coordinate, and so on. Equal to ``dist.get_process_group_ranks(mesh.get_group(dim))``.

    Raises:
        ValueError: as :func:`coordinates`.
    """
    _check(rank, dp, pp, tp)
    # BEGIN ASSIGN5_6_1
    s, d, t = coordinates(rank, dp, pp, tp)
    at = lambda s_, d_, t_: (s_ * dp + d_) * tp + t_  # noqa: E731
    return {"dp": [at(s, i, t) for i in range(dp)], "pp": [at(i, d, t) for i in range(pp)],
            "tp": [at(s, d, i) for i in range(tp)]}
    # END ASSIGN5_6_1
