"""Hybrid sharded data parallelism (HSDP): ZeRO-3 inside a shard group, replication across shard groups.

ZeRO-3 over all ``dp`` ranks (:mod:`memory.fsdp`) divides the model state by ``dp`` but puts every
all-gather and reduce-scatter of every step on all ``dp`` ranks — on a cluster, across nodes. Hybrid
sharding (PyTorch FSDP's ``HYBRID_SHARD`` and FSDP2 on a 2D mesh, Zhao et al. 2023, "PyTorch FSDP",
Sec. 3.2.2; DeepSpeed's ZeRO++ hpZ, Wang et al. 2023, Sec. 3.2) arranges the dp ranks as
``replicas x shard`` (:meth:`course.mesh.Mesh.hybrid_shard_groups`): each group of ``shard`` neighbouring
ranks (one node on GPUs) runs ZeRO-3 among themselves, holding a ``1/shard`` slice of every unit; the
``replicas`` groups hold the same slices. A step is ZeRO-3's in the shard group — all-gather each unit
before its forward and again before its backward, reduce-scatter its gradient and divide by ``shard`` —
and then one all-reduce of each unit's gradient *slice* over the replicate group (the ranks holding the
same slice), divided by ``replicas``: the mean over all ``dp`` ranks' batches, as in data parallelism.

Per rank and step, for ``Ψ`` parameters in fp32 (4 bytes), ring traffic:

* ZeRO-3 over dp: ``3 (dp - 1)/dp · 4Ψ`` bytes, all in the dp group;
* HSDP: ``3 (s - 1)/s · 4Ψ`` in the shard group (s = shard) and ``2 (r - 1)/r · 4Ψ/s`` in the replicate
  group (r = replicas) — a slice, not the whole model, crosses the slow links;

(less the second all-gather of the root unit, which stays gathered from forward to backward), and the
model state held is ``(4 + 4 + 8) Ψ / s`` bytes instead of ``/ dp``: memory traded for communication that
stays inside the shard group. ``replicas = 1`` is ZeRO-3; ``shard = 1`` is data parallelism with the
gradient all-reduced. ``python -m memory.labs.hsdp_benchmark`` measures both for every layout of the ranks.

:class:`HybridShardedModel` is the course's own ZeRO-3 (:class:`memory.fsdp.FullyShardedModel`, assignment
5.5.3) over the shard group, whose units add the replica all-reduce after their reduce-scatter.
"""
from __future__ import annotations

import torch

from course import collectives
from memory.fsdp import FullyShardedModel, ShardedUnit


class HybridShardedUnit(ShardedUnit):
    """A ZeRO-3 unit over the shard ``group`` whose gradient slice is then averaged over ``replicate_group``."""

    def __init__(self, module, params, group, name, is_root=False, *, replicate_group=None):
        self.replicate_group = replicate_group
        self.replicas = collectives.group_size(replicate_group)
        super().__init__(module, params, group, name, is_root)

    @torch.no_grad()
    def reduce_gradients(self) -> None:
        """ZeRO-3's reduce-scatter in the shard group (mean over its ranks), then an all-reduce of this rank's
        slice in the replicate group divided by the number of replicas: ``shard.grad`` gains the mean over
        every rank's batch. Gradients accumulated by earlier backward passes are kept and added to."""
        earlier, self.shard.grad = self.shard.grad, None
        super().reduce_gradients()  # self.shard.grad: this backward's slice, averaged over the shard group
        if self.replicas > 1:
            self.shard.grad = collectives.all_reduce(self.shard.grad, group=self.replicate_group) / self.replicas
        if earlier is not None:
            self.shard.grad = earlier + self.shard.grad


class HybridShardedModel(FullyShardedModel):
    """ZeRO-3 inside ``shard_group``, replicated over ``replicate_group`` (module docstring).

    Used exactly as :class:`memory.fsdp.FullyShardedModel` (optimizer over :meth:`shard_parameters`,
    :meth:`finish_backward` after ``backward``); the groups come from
    :meth:`course.mesh.Mesh.hybrid_shard_groups`. Every rank must build it from the same weights.

    Args:
        model, units: as :class:`memory.fsdp.FullyShardedModel`.
        shard_group: the ranks that share out each unit (ZeRO-3 among them).
        replicate_group: the ranks that hold the same slices (one per shard group).
    """

    def __init__(self, model, units, shard_group=None, replicate_group=None):
        self.replicate_group = replicate_group
        super().__init__(model, units, group=shard_group)

    def make_unit(self, module, params, group, name, is_root=False) -> HybridShardedUnit:
        return HybridShardedUnit(module, params, group, name, is_root, replicate_group=self.replicate_group)
