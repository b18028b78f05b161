"""Assignment 5.5.3 — ZeRO-3 / fully sharded data parallelism: the parameters are sharded too.

ZeRO stage 3 (Rajbhandari et al. 2020, Sec. 5.3, "P_os+g+p") and PyTorch FSDP (Zhao et al.
2023, "PyTorch FSDP", Sec. 3) keep on each of the dp ranks only a 1/dp slice of every
parameter, its gradient and its optimizer state: ``(4 + 4 + 8) Ψ / dp`` bytes in fp32 with
Adam. The model is cut into *units* — here each transformer block, plus the *root* unit
holding whatever is left (embeddings, final LayerNorm, the tied output head). A unit's
parameters are one flat fp32 buffer padded to a multiple of dp (as in ZeRO-1,
:func:`memory.zero.shard_range`); every rank keeps its slice as a ``shard`` parameter — the
only parameter the optimizer sees — and the module's own parameters become views of a
*full* buffer whose storage exists only while the unit computes:

* **forward pre-hook**: all-gather the slices into the full buffer (storage re-allocated);
* **forward post-hook**: free the full buffer (storage resized to 0 bytes) — except the root,
  whose parameters are needed again first thing in the backward pass (FSDP2 does not reshard
  the root after forward either);
* **before the unit's backward** (a hook on the unit's output gradient): all-gather again;
* **after the last gradient of the unit has been accumulated** (``post_accumulate_grad``
  hooks): flatten the gradients, reduce-scatter them (SUM) in the dp group, divide by dp,
  keep this rank's slice as ``shard.grad``, drop the full gradients and free the full buffer.

At any moment a rank holds the full parameters of the root and of about one block, so the
peak memory is the sharded state plus one unit. Communication per step: an all-gather in
forward and one in backward, a reduce-scatter of the gradient: ``3Ψ`` elements against data
parallelism's ``2Ψ`` (ZeRO, Sec. 7.2.2).
"""
from __future__ import annotations

import contextlib

import torch
from torch import nn

from course import collectives
from memory.zero import flatten_into, shard_range, unique_parameters


def _tensors(tree):
    """The tensors inside ``tree`` (a tensor, tuple, list, dict or model-output object)."""
    if torch.is_tensor(tree):
        yield tree
    elif isinstance(tree, dict):
        for v in tree.values():
            yield from _tensors(v)
    elif isinstance(tree, (tuple, list)):
        for v in tree:
            yield from _tensors(v)


class ShardedUnit:
    """The parameters of one unit (a block, or the root's leftovers) sharded over ``group``.

    Attributes:
        module: the module whose forward gathers / frees the unit.
        params: its trainable parameters (unique), now views of ``full``.
        full: the flat fp32 buffer of ``padded`` elements; its storage holds 0 bytes while freed.
        shard: this rank's slice ``[start, end)`` as an ``nn.Parameter`` (what the optimizer steps).
        is_root: the root unit stays gathered from its forward until its gradients are reduced.
    """

    def __init__(self, module: nn.Module, params: list[nn.Parameter], group, name: str, is_root: bool = False):
        self.module, self.params, self.group, self.name, self.is_root = module, params, group, name, is_root
        self.dp, self.dp_rank = collectives.group_size(group), collectives.group_rank(group)
        self.numels = [p.numel() for p in params]
        self.numel = sum(self.numels)
        self.start, self.end, self.padded = shard_range(self.numel, self.dp, self.dp_rank)
        with torch.no_grad():
            self.full = flatten_into([(p.detach(), n) for p, n in zip(params, self.numels)], self.padded)
            self.shard = nn.Parameter(self.full[self.start:self.end].clone())
            offset = 0
            for p, n in zip(params, self.numels):
                p.data = self.full[offset:offset + n].view_as(p)
                offset += n
        self.full_bytes = self.padded * self.full.element_size()
        self.gathered = True
        self.keep_gathered = False  # inside FullyShardedModel.summon_full_params
        self.ready = 0  # gradients accumulated in this backward pass
        self.free()

    def held_bytes(self) -> int:
        """Bytes the full buffer holds now (0 while freed)."""
        return self.full.untyped_storage().nbytes()

    @torch.no_grad()
    def gather(self) -> None:
        """All-gather the slices of ``group`` into ``full`` (re-allocating its storage); no-op if gathered."""
        if self.gathered:
            return
        # BEGIN ASSIGN5_5_3
        self.full.untyped_storage().resize_(self.full_bytes)
        self.full.copy_(collectives.all_gather(self.shard.detach(), 0, group=self.group))
        # END ASSIGN5_5_3
        self.gathered = True

    def free(self) -> None:
        """Release the full buffer's storage (the parameters keep their shapes, views of 0 bytes)."""
        if self.keep_gathered:
            return
        # BEGIN ASSIGN5_5_3
        self.full.untyped_storage().resize_(0)
        # END ASSIGN5_5_3
        self.gathered = False

    @torch.no_grad()
    def reduce_gradients(self) -> None:
        """Reduce-scatter (SUM over ``group``) the unit's flat gradient, divide by dp, add this rank's
        slice to ``shard.grad`` (None: set it), and drop every full ``param.grad``."""
        local = flatten_into([(p.grad, n) for p, n in zip(self.params, self.numels)], self.padded, self.shard.device)
        # BEGIN ASSIGN5_5_3
        for p in self.params:
            p.grad = None
        grad = collectives.reduce_scatter(local, 0, group=self.group) / self.dp
        self.shard.grad = grad if self.shard.grad is None else self.shard.grad + grad
        # END ASSIGN5_5_3
        self.ready = 0

    # -- hooks ----------------------------------------------------------------------------------

    def pre_forward(self, module, args):
        self.gather()

    def post_forward(self, module, args, output):
        """Free a block's parameters; and, if a backward pass will follow, gather them again just
        before it reaches this unit (a hook on the gradient of the unit's output)."""
        if torch.is_grad_enabled():
            for t in _tensors(output):
                if t.requires_grad:
                    t.register_hook(self.pre_backward)
        if not (self.is_root and torch.is_grad_enabled()):
            # BEGIN ASSIGN5_5_3
            self.free()
            # END ASSIGN5_5_3
        return output

    def pre_backward(self, grad):
        self.gather()
        return grad

    def post_accumulate_grad(self, param):
        """When every parameter of the unit has its gradient: reduce-scatter, then free the unit."""
        self.ready += 1
        if self.ready == len(self.params):
            self.reduce_gradients()
            self.free()


class FullyShardedModel:
    """ZeRO-3 over ``group``: every module in ``units`` (e.g. the transformer blocks) a unit, and
    the rest of ``model`` the root unit.

    The model is used as before (``loss = loss_fn(model, batch); loss.backward()``), with the
    optimizer built over :meth:`shard_parameters` (1/dp of every parameter) and
    :meth:`finish_backward` called after ``backward`` (it reduces the units some of whose
    parameters received no gradient, and frees the root)::

        fsdp = FullyShardedModel(model, model.transformer.h, group=dp_group)
        opt = torch.optim.Adam(fsdp.shard_parameters(), lr=...)
        opt.zero_grad(); loss_fn(model, batch).backward(); fsdp.finish_backward(); opt.step()

    Every rank must build it from the same weights (same seed). Every forward pass is
    collective (all ranks of ``group`` must run it); for work that differs between ranks
    (decoding), gather everything first with :meth:`summon_full_params`.

    Raises:
        ValueError: a parameter shared between two units (tie weights inside one unit).
    """

    def __init__(self, model: nn.Module, units, group=None):
        self.model, self.group = model, group
        owner: dict[int, str] = {}
        self.units: list[ShardedUnit] = []
        names = {id(p): n for n, p in model.named_parameters()}
        for i, module in enumerate(units):
            params = [p for p in unique_parameters(module.parameters()) if p.requires_grad]
            for p in params:
                if id(p) in owner:
                    raise ValueError(f"parameter {names.get(id(p))} is in two units; tied weights must be in one unit")
                owner[id(p)] = f"unit{i}"
            self.units.append(self.make_unit(module, params, group, f"unit{i}"))
        rest = [p for p in unique_parameters(model.parameters()) if p.requires_grad and id(p) not in owner]
        self.root = self.make_unit(model, rest, group, "root", is_root=True)
        self.units.append(self.root)
        self.param_names = [[names[id(p)] for p in u.params] for u in self.units]
        self._handles = []
        for unit in self.units:
            self._handles.append(unit.module.register_forward_pre_hook(unit.pre_forward))
            self._handles.append(unit.module.register_forward_hook(unit.post_forward))
            for p in unit.params:
                self._handles.append(p.register_post_accumulate_grad_hook(unit.post_accumulate_grad))

    def make_unit(self, module: nn.Module, params: list[nn.Parameter], group, name: str,
                  is_root: bool = False) -> ShardedUnit:
        """One unit (:class:`ShardedUnit`); hybrid sharding (:mod:`memory.hsdp`) makes its own kind."""
        return ShardedUnit(module, params, group, name, is_root)

    def shard_parameters(self) -> list[nn.Parameter]:
        """This rank's slices, one per unit (give these to the optimizer)."""
        return [u.shard for u in self.units]

    def finish_backward(self) -> None:
        """After ``backward``: reduce the gradients of units not all of whose parameters got one
        (collective: every rank calls it), and free every unit."""
        for unit in self.units:
            if unit.ready:
                unit.reduce_gradients()
            unit.free()

    def held_full_bytes(self) -> int:
        """Bytes of full (unsharded) parameters held now, over all units."""
        return sum(u.held_bytes() for u in self.units)

    @contextlib.contextmanager
    def summon_full_params(self):
        """Every unit gathered for the ``with`` block (collective), freed after."""
        for unit in self.units:
            unit.gather()
            unit.keep_gathered = True
        try:
            yield self.model
        finally:
            for unit in self.units:
                unit.keep_gathered = False
                unit.free()

    def full_state(self) -> dict[str, torch.Tensor]:
        """``{parameter name: full tensor}`` (collective; copies, so they outlive the gathering)."""
        with self.summon_full_params():
            return {n: p.detach().clone() for n, p in self.model.named_parameters()}

    def full_gradients(self) -> dict[str, torch.Tensor]:
        """``{parameter name: full mean gradient}`` gathered from the shards' ``grad`` (collective)."""
        out = {}
        for unit, names in zip(self.units, self.param_names):
            if unit.shard.grad is None:
                continue
            full = collectives.all_gather(unit.shard.grad.detach(), 0, group=self.group)
            offset = 0
            for p, n, name in zip(unit.params, unit.numels, names):
                out[name] = full[offset:offset + n].view(p.shape).clone()
                offset += n
        return out

    def remove_hooks(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles.clear()
