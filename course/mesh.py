"""The device mesh of a run: ``pp × dp × cp × tp = world_size`` ranks, and each rank's groups.

A run that combines pipeline (pp), data (dp), context (cp) and tensor (tp) parallelism arranges
its ``world_size`` ranks in a grid with the dimensions ordered ``("pp", "dp", "cp", "tp")`` as
torchtitan's ``ParallelDims`` and Megatron-LM order them: **tp varies fastest**, so the
ranks of one tensor-parallel group are neighbours (on GPUs: the same node, where the
frequent, large all-reduces of tensor parallelism have NVLink bandwidth), then cp (its ring
or all-to-all traffic is the next heaviest), then dp, and **pp varies slowest**, so the stages
of a pipeline can sit on different nodes (they exchange only one activation per micro-batch):

    rank = ((stage * dp + dp_rank) * cp + cp_rank) * tp + tp_rank

Example, dp = 2, pp = 2, tp = 2, cp = 1 (8 ranks)::

    stage 0: dp 0 -> ranks 0 1 (a tp group)    stage 1: dp 0 -> ranks 4 5
             dp 1 -> ranks 2 3                          dp 1 -> ranks 6 7
    tp groups: [0,1] [2,3] [4,5] [6,7]; dp groups: [0,2] [1,3] [4,6] [5,7]; pp groups: [0,4] [1,5] [2,6] [3,7]

The cp ranks of a (stage, dp rank, tp rank) hold the same weights and different parts of each
sequence, so the weights' gradients are averaged over dp × cp together (``dp_cp_group``, as
torchtitan flattens ``dp_cp``). **Expert parallelism** (ep) is carved out of those dp × cp ranks
of one stage and tp rank: numbering them ``f = dp_rank * cp + cp_rank``, ranks with the same
``f // ep`` form an ep group (they hold different experts and exchange tokens with an
all-to-all), and ranks with the same ``f % ep`` hold replicas of the same experts and average
those experts' gradients (the expert-data-parallel group, ``edp_group``; Megatron-LM's
"expert data parallel"). ``ep`` must divide ``dp * cp``.

**Hybrid sharding** (HSDP, ``--hsdp REPLICAS`` of ``project/run_data_parallel.py``) lays a rank's dp group
out as ``replicas x shard``: ``dp_rank = replica * shard + shard_rank``, shard fastest. The ``shard``
neighbouring dp ranks form a ``dp_shard`` group (ZeRO-3 among them), the ranks with the same shard rank a
``dp_replicate`` group (they hold the same slices); :meth:`Mesh.hybrid_shard_groups` makes them. For
dp = 4 = 2 x 2: shard groups ``[0,1] [2,3]``, replicate groups ``[0,2] [1,3]``.

:class:`ParallelDims` (in :mod:`course.dims`: torch-free) is plain arithmetic and checks the sizes
before any process starts;
:class:`Mesh` is built once inside every rank (after the launcher formed the process
group) on top of ``torch.distributed.device_mesh.init_device_mesh`` and hands each part
its group. The single-parallelism runs are special cases: data parallel is
``ParallelDims(dp=world_size)``, tensor parallel ``ParallelDims(tp=world_size)``, the
multi-process pipeline ``ParallelDims(pp=world_size)``. A dimension of size 1 other than cp
is kept in the device mesh; cp enters it only when cp > 1, so runs without context
parallelism keep the three-dimensional ``("pp", "dp", "tp")`` mesh.

Sources: Narayanan et al. 2021 (Megatron-LM, Sec. 3, "PTD-P"); torchtitan
``ParallelDims``; PyTorch ``DeviceMesh``; Megatron-Core ``parallel_state`` (expert groups).
"""
from __future__ import annotations

import torch.distributed as dist

from course.collectives import name_group
from course.dims import DIM_NAMES, Coordinates, ParallelDims  # noqa: F401 (the mesh's sizes, torch-free)


def new_groups(rank_lists: list[list[int]], desc: str, *, backend: str | None = None):
    """Create one process group per list of global ranks in ``rank_lists`` and return this rank's (None if
    it is in none). Collective: every rank of the world calls it with the same lists, in the same order.

    Every rank ends the call holding one group more than before, also the ranks that are in no list: those
    form one extra group of their own (``desc + ":rest"``, never used). Torch names a group made by
    ``split_group`` (what ``init_device_mesh`` uses when the process group is bound to a device, as
    :mod:`course.launch` binds it on GPUs) or by ``new_group(use_local_synchronization=True)`` from its
    ranks and the number of groups the rank already holds, and the members of a group meet under that
    name; if some ranks held fewer groups (the middle stages of a pipeline of pp >= 3 are in no embedding
    group), the names of every such group made later would differ between its members and its creation
    would wait forever — a second mesh's groups on GPUs, for instance. :mod:`course.nccl_rules` checks
    this on CPU (tests named ``rendezvous``).

    Args:
        rank_lists: the groups' global ranks; a rank may be in at most one list.
        desc: the groups' description (``group_desc``: what torch's logs and flight recorder show).
        backend: the groups' back-end (None: the run's).

    Raises:
        ValueError: a rank in two lists (make overlapping groups in separate calls).
    """
    seen: set[int] = set()
    for ranks in rank_lists:
        if seen & set(ranks):
            raise ValueError(f"rank(s) {sorted(seen & set(ranks))} are in two of the groups {rank_lists}; every "
                             "rank may be in at most one group of a call: make overlapping groups in separate calls")
        seen |= set(ranks)
    world_size, mine, rank = dist.get_world_size(), None, dist.get_rank()
    for ranks in rank_lists:  # every rank creates every group, in the same order, as new_group requires
        group = dist.new_group(list(ranks), backend=backend, group_desc=desc)
        if rank in ranks:
            mine = group
    rest = [r for r in range(world_size) if r not in seen]
    if rest:
        dist.new_group(rest, backend=backend, group_desc=f"{desc}:rest")
    return mine


class Mesh:
    """A run's device mesh inside one rank: its coordinates and its groups.

    Collective at construction: every rank of the world must build its ``Mesh`` with the
    same sizes (it creates the process groups of every dimension, and, with several
    stages, the embedding groups that join each pipeline's first and last stage; with
    ``ep > 1``, the expert-parallel groups).

    Attributes:
        dims: the :class:`ParallelDims`.
        device_mesh: the ``torch.distributed.device_mesh.DeviceMesh`` (dimension names
            ``dims.dim_names``: ``("pp", "dp", "tp")``, or ``("pp", "dp", "cp", "tp")`` with
            cp > 1), e.g. for DTensor or checkpoint resharding.
        rank, world_size: global rank and number of ranks.
        stage, dp_rank, cp_rank, tp_rank: this rank's coordinates (``stage`` is its pp rank).
        dp_group, pp_group, tp_group: this rank's process group along each dimension.
        cp_group: the context-parallel group (cp > 1; with cp = 1 a group of this rank alone).
        dp_cp_group: the ranks holding the same weights (dp x cp): where dense gradients are
            averaged; the dp group when cp = 1.
        ep_group, edp_group, ep_rank: the expert-parallel group, the expert-data-parallel group
            (the replicas of this rank's experts) and this rank's place in the ep group
            (module docstring); with ep = 1, a group of this rank alone and ``dp_cp_group``.
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
        self.device_mesh = init_device_mesh(device_type, dims.shape, mesh_dim_names=dims.dim_names)
        self.rank, self.world_size = dist.get_rank(), dist.get_world_size()
        self.stage, self.dp_rank, self.cp_rank, self.tp_rank = dims.coordinates(self.rank)
        self.pp_group = self.device_mesh.get_group("pp")
        self.dp_group = self.device_mesh.get_group("dp")
        self.tp_group = self.device_mesh.get_group("tp")
        self._alone = None
        if dims.cp > 1:
            self.cp_group = self.device_mesh.get_group("cp")
            self.dp_cp_group = self._new_groups("dp_cp", lambda r: self._members(r, ("dp", "cp")))
        else:
            self.cp_group, self.dp_cp_group = self._singleton(), self.dp_group
        self.ep_rank = dims.expert_coordinates(self.rank)[0]
        if dims.ep > 1:
            self.ep_group = self._new_groups("ep", lambda r: dims.expert_group_ranks(r)["ep"])
            self.edp_group = self._new_groups("edp", lambda r: dims.expert_group_ranks(r)["edp"])
        else:
            self.ep_group, self.edp_group = self._singleton(), self.dp_cp_group
        self.embedding_group = self._embedding_groups()
        # What the communication counter calls them; a group that is also another (edp = dp_cp when ep = 1,
        # dp_cp = dp when cp = 1) keeps the more basic name, named last.
        for name in ("edp", "ep", "dp_cp", *DIM_NAMES):
            name_group(self.group(name), name)
        name_group(self.embedding_group, "embedding")

    @classmethod
    def build(cls, dp: int = 1, pp: int = 1, tp: int = 1, device_type: str | None = None, *, cp: int = 1,
              ep: int = 1) -> "Mesh":
        """``Mesh(ParallelDims(dp, pp, tp, cp, ep))``."""
        return cls(ParallelDims(dp=dp, pp=pp, tp=tp, cp=cp, ep=ep), device_type)

    def _members(self, rank: int, names: tuple[str, ...]) -> list[int]:
        """The ranks that share every coordinate of ``rank`` except those in ``names``."""
        here = self.dims.coordinates(rank)
        return [r for r in range(self.world_size)
                if all(getattr(self.dims.coordinates(r), d) == getattr(here, d) for d in DIM_NAMES if d not in names)]

    def _new_groups(self, name: str, members_of) -> object:
        """Create the groups ``members_of(r)`` for every rank r (:func:`new_groups`: every rank creates every
        group, in the same order) and return this rank's."""
        lists = []
        for r in range(self.world_size):
            ranks = list(members_of(r))
            if ranks not in lists:
                lists.append(ranks)
        return new_groups(lists, name)

    def _singleton(self):
        """A group of this rank alone (for a dimension of size 1: its collectives are no-ops)."""
        if self._alone is None:
            self._alone = dist.new_group([self.rank], use_local_synchronization=True, group_desc="alone")
        return self._alone

    def _embedding_groups(self):
        """The group of each pipeline's first and last stage (one per dp, cp and tp rank); None on the middle
        stages, which :func:`new_groups` gives a group of their own so that every rank holds as many groups as
        every other (with pp >= 3 the middle stages are in no embedding group)."""
        if self.dims.pp == 1:
            return None
        d = self.dims
        ends = [[d.rank_of(0, dp, tp, cp), d.rank_of(d.pp - 1, dp, tp, cp)]
                for dp in range(d.dp) for cp in range(d.cp) for tp in range(d.tp)]
        return new_groups(ends, "embedding")

    def hybrid_shard_groups(self, replicas: int) -> tuple:
        """``(shard group, replicate group)`` of this rank for hybrid sharding with ``replicas`` replicas of
        ``dp / replicas``-rank shard groups (:meth:`ParallelDims.hybrid_shard_ranks`), named ``"dp_shard"``
        and ``"dp_replicate"`` for the communication counter. Collective the first time (every rank creates
        every group); made once per mesh and number of replicas.

        Raises:
            ValueError: ``replicas`` does not divide dp.
        """
        made = self.__dict__.setdefault("_hybrid", {})
        if replicas not in made:
            self.dims.hybrid_shard_ranks(self.rank, replicas)  # checks replicas
            shard = self._new_groups("dp_shard", lambda r: self.dims.hybrid_shard_ranks(r, replicas)["dp_shard"])
            replicate = self._new_groups("dp_replicate",
                                         lambda r: self.dims.hybrid_shard_ranks(r, replicas)["dp_replicate"])
            name_group(shard, "dp_shard")
            name_group(replicate, "dp_replicate")
            made[replicas] = (shard, replicate)
        return made[replicas]

    @property
    def coordinates(self) -> Coordinates:
        return Coordinates(self.stage, self.dp_rank, self.cp_rank, self.tp_rank)

    @property
    def is_first_stage(self) -> bool:
        return self.stage == 0

    @property
    def is_last_stage(self) -> bool:
        return self.stage == self.dims.pp - 1

    GROUPS = (*DIM_NAMES, "dp_cp", "ep", "edp")

    def group(self, name: str):
        """The group named ``name`` (``"pp"``, ``"dp"``, ``"cp"``, ``"tp"``, ``"dp_cp"``, ``"ep"``,
        ``"edp"``), or ``"world"``."""
        if name == "world":
            return dist.group.WORLD
        if name not in self.GROUPS:
            raise ValueError(f"unknown mesh group {name!r}; choose one of {self.GROUPS} or 'world'")
        return getattr(self, f"{name}_group")

    def describe(self) -> dict:
        """Sizes, coordinates and group members of this rank (for results files and traces)."""
        names = [n for n in self.GROUPS if getattr(self.dims, n, 2) > 1 or n in ("pp", "dp", "tp")]
        return {"dp": self.dims.dp, "pp": self.dims.pp, "tp": self.dims.tp, "cp": self.dims.cp, "ep": self.dims.ep,
                "rank": self.rank, "coordinates": self.coordinates._asdict(),
                "groups": {name: dist.get_process_group_ranks(self.group(name)) for name in names}}
