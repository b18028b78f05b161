"""The device mesh of a run: ``dp × pp × tp = world_size`` ranks, and each rank's groups.

A run that combines data (dp), pipeline (pp) and tensor (tp) parallelism arranges its
``world_size`` ranks in a 3-D grid with the dimensions ordered ``("pp", "dp", "tp")`` as
torchtitan's ``ParallelDims`` and Megatron-LM order them: **tp varies fastest**, so the
ranks of one tensor-parallel group are neighbours (on GPUs: the same node, where the
frequent, large all-reduces of tensor parallelism have NVLink bandwidth), and **pp varies
slowest**, so the stages of a pipeline can sit on different nodes (they exchange only one
activation per micro-batch):

    rank = (stage * dp + dp_rank) * tp + tp_rank

Example, dp = 2, pp = 2, tp = 2 (8 ranks)::

    stage 0: dp 0 -> ranks 0 1 (a tp group)    stage 1: dp 0 -> ranks 4 5
             dp 1 -> ranks 2 3                          dp 1 -> ranks 6 7
    tp groups: [0,1] [2,3] [4,5] [6,7]; dp groups: [0,2] [1,3] [4,6] [5,7]; pp groups: [0,4] [1,5] [2,6] [3,7]

:class:`ParallelDims` is plain arithmetic and checks the sizes before any process starts;
:class:`Mesh` is built once inside every rank (after the launcher formed the process
group) on top of ``torch.distributed.device_mesh.init_device_mesh`` and hands each part
its group. The single-parallelism runs are special cases: data parallel is
``ParallelDims(dp=world_size)``, tensor parallel ``ParallelDims(tp=world_size)``, the
multi-process pipeline ``ParallelDims(pp=world_size)``.

Sources: Narayanan et al. 2021 (Megatron-LM, Sec. 3, "PTD-P"); torchtitan
``ParallelDims``; PyTorch ``DeviceMesh``.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch.distributed as dist

from course.collectives import name_group

DIM_NAMES = ("pp", "dp", "tp")


class Coordinates(NamedTuple):
    """Where a rank sits in the mesh: its stage (pp rank), dp rank and tp rank."""

    pp: int
    dp: int
    tp: int


@dataclass(frozen=True)
class ParallelDims:
    """The sizes of a run's mesh: ``dp * pp * tp`` ranks.

    Raises (at construction):
        ValueError: a size that is not a whole number >= 1.
    """

    dp: int = 1
    pp: int = 1
    tp: int = 1

    def __post_init__(self):
        for name in DIM_NAMES:
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"--{name} must be a whole number >= 1, not {value!r}")

    @property
    def world_size(self) -> int:
        return self.dp * self.pp * self.tp

    @property
    def shape(self) -> tuple[int, int, int]:
        """The mesh shape in ``DIM_NAMES`` order: ``(pp, dp, tp)``."""
        return (self.pp, self.dp, self.tp)

    def check(self, world_size: int | None = None, *, n_layer: int | None = None, n_head: int | None = None,
              n_inner: int | None = None) -> "ParallelDims":
        """Check the sizes against the world size and the model, before any process starts.

        Args:
            world_size: the number of processes (torchrun's ``WORLD_SIZE``, or the launcher's).
            n_layer, n_head, n_inner: the model's transformer blocks, attention heads and MLP
                width (the vocabulary needs no check: the tensor-parallel model pads it to a
                multiple of tp, as Megatron-LM's ``make_vocab_size_divisible_by`` does).

        Returns:
            ``self``.

        Raises:
            ValueError: naming the option to change.
        """
        if world_size is not None and self.world_size != world_size:
            raise ValueError(f"dp x pp x tp = {self.dp} x {self.pp} x {self.tp} = {self.world_size} ranks, but the "
                             f"world has {world_size} processes; choose sizes whose product is {world_size}")
        if n_head is not None and n_head % self.tp:
            raise ValueError(f"--tp {self.tp} does not divide the {n_head} attention heads (attention is split by "
                             f"heads); choose a tp that divides {n_head}")
        if n_inner is not None and n_inner % self.tp:
            raise ValueError(f"--tp {self.tp} does not divide the MLP width {n_inner}; choose a tp that divides it")
        if n_layer is not None and self.pp > n_layer:
            raise ValueError(f"--pp {self.pp} is more than the {n_layer} transformer blocks (every stage needs at "
                             f"least one); use --pp <= {n_layer} or a bigger --preset")
        return self

    def coordinates(self, rank: int) -> Coordinates:
        """The ``(pp, dp, tp)`` coordinates of global rank ``rank``.

        Raises:
            ValueError: ``rank`` outside ``0 .. world_size - 1``.
        """
        if not 0 <= rank < self.world_size:
            raise ValueError(f"rank {rank} is outside 0..{self.world_size - 1}")
        tp = rank % self.tp
        dp = rank // self.tp % self.dp
        pp = rank // (self.tp * self.dp)
        return Coordinates(pp, dp, tp)

    def rank_of(self, pp: int, dp: int, tp: int) -> int:
        """The global rank at coordinates ``(pp, dp, tp)``."""
        return (pp * self.dp + dp) * self.tp + tp


class Mesh:
    """A run's device mesh inside one rank: its coordinates and its dp, pp, tp groups.

    Collective at construction: every rank of the world must build its ``Mesh`` with the
    same sizes (it creates the process groups of every dimension, and, with several
    stages, the embedding groups that join each pipeline's first and last stage).

    Attributes:
        dims: the :class:`ParallelDims`.
        device_mesh: the ``torch.distributed.device_mesh.DeviceMesh`` (dimension names
            ``("pp", "dp", "tp")``), e.g. for DTensor or checkpoint resharding.
        rank, world_size: global rank and number of ranks.
        stage, dp_rank, tp_rank: this rank's coordinates (``stage`` is its pp rank).
        dp_group, pp_group, tp_group: this rank's process group along each dimension.
        embedding_group: the group of this pipeline's first and last stage (pp > 1, on
            those two stages; None elsewhere), where the tied embedding / LM-head gradient
            is summed (Shoeybi et al. 2019; Narayanan et al. 2021, Sec. 4.1).

    Raises:
        RuntimeError: no process group (build it inside a worker of :func:`course.launch.launch`).
        ValueError: sizes that do not multiply to the world size.
    """

    def __init__(self, dims: ParallelDims, device_type: str | None = None):
        from torch.distributed.device_mesh import init_device_mesh

        if not dist.is_initialized():
            raise RuntimeError("a Mesh needs a process group: build it inside a worker started by course.launch.launch")
        self.dims = dims.check(dist.get_world_size())
        if device_type is None:
            from course.launch import context

            device_type = context().device.type
        self.device_mesh = init_device_mesh(device_type, dims.shape, mesh_dim_names=DIM_NAMES)
        self.rank, self.world_size = dist.get_rank(), dist.get_world_size()
        self.stage, self.dp_rank, self.tp_rank = dims.coordinates(self.rank)
        self.pp_group = self.device_mesh.get_group("pp")
        self.dp_group = self.device_mesh.get_group("dp")
        self.tp_group = self.device_mesh.get_group("tp")
        self.embedding_group = self._embedding_groups()
        for name in DIM_NAMES:  # what the communication counter calls them
            name_group(self.group(name), name)
        name_group(self.embedding_group, "embedding")

    @classmethod
    def build(cls, dp: int = 1, pp: int = 1, tp: int = 1, device_type: str | None = None) -> "Mesh":
        """``Mesh(ParallelDims(dp, pp, tp))``."""
        return cls(ParallelDims(dp=dp, pp=pp, tp=tp), device_type)

    def _embedding_groups(self):
        if self.dims.pp == 1:
            return None
        mine = None
        for dp in range(self.dims.dp):  # every rank creates every group, in the same order
            for tp in range(self.dims.tp):
                ranks = [self.dims.rank_of(0, dp, tp), self.dims.rank_of(self.dims.pp - 1, dp, tp)]
                group = dist.new_group(ranks, group_desc="embedding")
                if self.rank in ranks:
                    mine = group
        return mine

    @property
    def coordinates(self) -> Coordinates:
        return Coordinates(self.stage, self.dp_rank, self.tp_rank)

    @property
    def is_first_stage(self) -> bool:
        return self.stage == 0

    @property
    def is_last_stage(self) -> bool:
        return self.stage == self.dims.pp - 1

    def group(self, name: str):
        """The group of dimension ``name`` (``"dp"``, ``"pp"`` or ``"tp"``), or ``"world"``."""
        if name == "world":
            return dist.group.WORLD
        if name not in DIM_NAMES:
            raise ValueError(f"unknown mesh dimension {name!r}; choose one of {DIM_NAMES} or 'world'")
        return getattr(self, f"{name}_group")

    def describe(self) -> dict:
        """Sizes, coordinates and group members of this rank (for results files and traces)."""
        return {"dp": self.dims.dp, "pp": self.dims.pp, "tp": self.dims.tp, "rank": self.rank,
                "coordinates": {"pp": self.stage, "dp": self.dp_rank, "tp": self.tp_rank},
                "groups": {name: dist.get_process_group_ranks(self.group(name)) for name in DIM_NAMES}}

