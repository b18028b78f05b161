"""The sizes of a run's mesh, as plain arithmetic without torch: :class:`ParallelDims`.

The rank layout is :mod:`course.mesh`'s (its docstring draws it): ``rank = ((stage * dp + dp_rank) * cp +
cp_rank) * tp + tp_rank``, expert parallelism carved out of each stage's ``dp * cp`` ranks. It lives here,
apart from the groups, so that the configuration (:mod:`course.config`) checks a mesh where torch is not
installed (``modal run`` on a laptop); :mod:`course.mesh` imports it from here.

Sources: Narayanan et al. 2021 (Megatron-LM, Sec. 3, "PTD-P"); torchtitan ``ParallelDims``; Megatron-Core
``parallel_state`` (expert groups).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

DIM_NAMES = ("pp", "dp", "cp", "tp")


class Coordinates(NamedTuple):
    """Where a rank sits in the mesh: its stage (pp rank), dp rank, cp rank and tp rank."""

    pp: int
    dp: int
    cp: int
    tp: int


@dataclass(frozen=True)
class ParallelDims:
    """The sizes of a run's mesh: ``pp * dp * cp * tp`` ranks, and ``ep`` expert-parallel ranks
    carved out of each stage's ``dp * cp`` ranks.

    Raises (at construction):
        ValueError: a size that is not a whole number >= 1; ``ep`` not dividing ``dp * cp``.
    """

    dp: int = 1
    pp: int = 1
    tp: int = 1
    cp: int = 1
    ep: int = 1

    def __post_init__(self):
        for name in (*DIM_NAMES, "ep"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"--{name} must be a whole number >= 1, not {value!r}")
        if (self.dp * self.cp) % self.ep:
            raise ValueError(f"--ep {self.ep} does not divide dp x cp = {self.dp} x {self.cp} = {self.dp * self.cp} "
                             "(expert-parallel groups are made of the dp x cp ranks of a stage); choose --ep in "
                             f"{_divisors(self.dp * self.cp)}")

    @property
    def world_size(self) -> int:
        return self.dp * self.pp * self.cp * self.tp

    @property
    def dim_names(self) -> tuple[str, ...]:
        """The device mesh's dimensions: ``("pp", "dp", "cp", "tp")``, without cp when cp = 1."""
        return DIM_NAMES if self.cp > 1 else ("pp", "dp", "tp")

    @property
    def shape(self) -> tuple[int, ...]:
        """The device mesh's shape in :attr:`dim_names` order, e.g. ``(pp, dp, tp)``."""
        return tuple(getattr(self, name) for name in self.dim_names)

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
            sizes = f"dp x pp x tp = {self.dp} x {self.pp} x {self.tp}" if self.cp == 1 else \
                f"dp x pp x cp x tp = {self.dp} x {self.pp} x {self.cp} x {self.tp}"
            raise ValueError(f"{sizes} = {self.world_size} ranks, but the world has {world_size} processes; choose "
                             f"sizes whose product is {world_size}")
        if n_head is not None and n_head % self.tp:
            raise ValueError(f"--tp {self.tp} does not divide the {n_head} attention heads (attention is split by "
                             f"heads); choose --tp in {_divisors(n_head, n_inner)}")
        if n_inner is not None and n_inner % self.tp:
            raise ValueError(f"--tp {self.tp} does not divide the MLP width {n_inner}; choose --tp in "
                             f"{_divisors(n_head, n_inner)}")
        if n_layer is not None and self.pp > n_layer:
            raise ValueError(f"--pp {self.pp} is more than the {n_layer} transformer blocks (every stage needs at "
                             f"least one); use --pp <= {n_layer} or a bigger --preset")
        return self

    def coordinates(self, rank: int) -> Coordinates:
        """The ``(pp, dp, cp, tp)`` coordinates of global rank ``rank``.

        Raises:
            ValueError: ``rank`` outside ``0 .. world_size - 1``.
        """
        if not 0 <= rank < self.world_size:
            raise ValueError(f"rank {rank} is outside 0..{self.world_size - 1}")
        tp = rank % self.tp
        cp = rank // self.tp % self.cp
        dp = rank // (self.tp * self.cp) % self.dp
        pp = rank // (self.tp * self.cp * self.dp)
        return Coordinates(pp, dp, cp, tp)

    def rank_of(self, pp: int, dp: int, tp: int, cp: int = 0) -> int:
        """The global rank at coordinates ``(pp, dp, cp, tp)``."""
        return ((pp * self.dp + dp) * self.cp + cp) * self.tp + tp

    def hybrid_shard_ranks(self, rank: int, replicas: int) -> dict[str, list[int]]:
        """The global ranks of ``rank``'s ``"dp_shard"`` and ``"dp_replicate"`` groups when its dp group is
        laid out as ``replicas x shard`` (hybrid sharding, HSDP; ``shard = dp / replicas``), each in group-rank
        order: ``dp_rank = replica * shard + shard_rank`` — shard varies fastest, so a shard group is ``shard``
        neighbouring dp ranks (on GPUs, one node: the all-gathers and reduce-scatters of every layer stay
        there) and a replicate group takes one rank of each (PyTorch's ``("dp_replicate", "dp_shard")`` mesh).

        Raises:
            ValueError: ``replicas`` not a divisor of dp.
        """
        if not isinstance(replicas, int) or replicas < 1 or self.dp % replicas:
            raise ValueError(f"--hsdp {replicas} does not divide --dp {self.dp}: the dp ranks are laid out as "
                             f"replicas x shard; choose a number of replicas that divides {self.dp}")
        shard = self.dp // replicas
        c = self.coordinates(rank)
        replica, shard_rank = divmod(c.dp, shard)

        def at(dp_rank: int) -> int:
            return self.rank_of(c.pp, dp_rank, c.tp, c.cp)

        return {"dp_shard": [at(replica * shard + s) for s in range(shard)],
                "dp_replicate": [at(r * shard + shard_rank) for r in range(replicas)]}

    def expert_coordinates(self, rank: int) -> tuple[int, int]:
        """``(ep rank, edp rank)`` of global rank ``rank``: with ``f = dp_rank * cp + cp_rank``,
        ``f % ep`` and ``f // ep`` (see the module docstring)."""
        c = self.coordinates(rank)
        f = c.dp * self.cp + c.cp
        return f % self.ep, f // self.ep

    def expert_group_ranks(self, rank: int) -> dict[str, list[int]]:
        """The global ranks of ``rank``'s ``"ep"`` and ``"edp"`` groups, each in group-rank order."""
        c = self.coordinates(rank)
        ep_rank, edp_rank = self.expert_coordinates(rank)

        def at(f: int) -> int:
            return self.rank_of(c.pp, f // self.cp, c.tp, f % self.cp)

        return {"ep": [at(edp_rank * self.ep + e) for e in range(self.ep)],
                "edp": [at(d * self.ep + ep_rank) for d in range(self.dp * self.cp // self.ep)]}


def _divisors(*sizes: int | None) -> list[int]:
    """The numbers that divide every given size (tensor-parallel degrees that split them all), at most 64."""
    known = [n for n in sizes if n]
    return [d for d in range(1, min([64, *known]) + 1) if all(n % d == 0 for n in known)]
