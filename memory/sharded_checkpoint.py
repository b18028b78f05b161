"""Checkpoints of ZeRO-1/2/3 runs that load at another number of ranks (``--zero N --checkpoint_every``).

ZeRO keeps its state in flat fp32 buffers: one for the whole model (ZeRO-1/2, :class:`memory.zero.ZeroOptimizer`)
or one per unit (ZeRO-3, :class:`memory.fsdp.FullyShardedModel`), of which dp rank r owns the slice
``[r n, (r + 1) n)`` with ``n = ceil(numel / dp)`` (:func:`memory.zero.shard_range`; the padding past
``numel`` holds nothing). That is exactly how ``torch.distributed.tensor``'s ``Shard(0)`` cuts a 1-D tensor of
``numel`` elements over dp ranks (``torch.chunk``: pieces of ``ceil(numel / dp)``, the last shorter or
empty). So each flat buffer — the parameters, Adam's ``exp_avg`` and ``exp_avg_sq`` — is saved as a
``DTensor`` of global shape ``(numel,)``, ``Shard(0)`` over the dp group, whose local piece *is* this rank's
slice (a view: loading writes into the buffers in place). The key and the global shape do not depend on
dp; ``torch.distributed.checkpoint`` records which rank wrote which range, and a run at another dp reads
the ranges its slices need from whichever files hold them — the checkpoint reshards. (The same idea as the
3D part's layout-independent keys, three_d/training.py, one level down: a flat range instead of a layer.)

With hybrid sharding (:mod:`memory.hsdp`) the DTensor lives on the shard group; the replicas write the same
ranges under the same keys and DCP stores each once.

Layout (under :data:`ZERO_FLAT` for ZeRO-1/2, :data:`ZERO_UNITS` for ZeRO-3, one entry per unit)::

    {"names": [parameter names, in flat order], "params": DTensor (numel,), "exp_avg": DTensor (numel,),
     "exp_avg_sq": DTensor (numel,), "step": tensor ()}

ZeRO-1 and ZeRO-2 share a layout (and load each other's checkpoints); ZeRO-3 has another (its units);
plain data parallelism keeps ``torch.distributed.checkpoint.state_dict``'s per-parameter layout.
:func:`checkpoint_family` tells them apart from a checkpoint's metadata, before any process starts.
"""
from __future__ import annotations

import torch
from torch.distributed.tensor import DTensor, Shard

from course import collectives

ZERO_FLAT = "zero_flat"    # ZeRO-1/2: one flat buffer
ZERO_UNITS = "zero3"       # ZeRO-3 / HSDP: one flat buffer per unit
FAMILIES = {ZERO_FLAT: "--zero 1 or 2", ZERO_UNITS: "--zero 3", "model": "--zero 0"}


class _Meshes:
    """One 1-D ``DeviceMesh`` per process group (made once; ``DeviceMesh.from_group`` runs no collective)."""

    def __init__(self):
        self._made: dict[int, object] = {}

    def of(self, group, device_type: str):
        import torch.distributed as dist
        from torch.distributed.device_mesh import DeviceMesh

        group = group if group is not None else dist.group.WORLD
        if id(group) not in self._made:
            self._made[id(group)] = DeviceMesh.from_group(group, device_type)
        return self._made[id(group)]


MESHES = _Meshes()


def flat_piece(local: torch.Tensor, numel: int, group) -> DTensor:
    """This rank's slice ``local`` of a flat buffer of ``numel`` elements as a ``DTensor`` of shape
    ``(numel,)``, ``Shard(0)`` over ``group``; its local tensor is ``local`` without the padding (a view).

    Raises:
        ValueError: ``local`` is not a slice of the ``ceil(numel / dp)`` elements a rank owns.
    """
    dp, rank = collectives.group_size(group), collectives.group_rank(group)
    size = -(-numel // dp)
    if local.numel() != size:
        raise ValueError(f"a rank's slice of {numel} elements over {dp} ranks has {size} elements, not {local.numel()}")
    valid = max(0, min(size, numel - rank * size))
    mesh = MESHES.of(group, local.device.type)
    return DTensor.from_local(local.detach()[:valid], mesh, [Shard(0)], run_check=False,
                              shape=torch.Size([numel]), stride=(1,))


def adam_state(optimizer, param: torch.nn.Parameter) -> dict:
    """``optimizer``'s Adam/AdamW state of ``param``, made (zeros, step 0) if no step has run yet — a fresh
    optimizer must hold the tensors a checkpoint is loaded into."""
    state = optimizer.state[param]
    if not state:
        state.update(step=torch.tensor(0.0, device="cpu"), exp_avg=torch.zeros_like(param),
                     exp_avg_sq=torch.zeros_like(param))
    return state


def flat_state(shard: torch.nn.Parameter, numel: int, optimizer, group, names: list[str]) -> dict:
    """The checkpoint entry of one flat buffer (module docstring): this rank's ``shard`` and its Adam state."""
    state = adam_state(optimizer, shard)
    return {"names": list(names), "params": flat_piece(shard, numel, group),
            "exp_avg": flat_piece(state["exp_avg"], numel, group),
            "exp_avg_sq": flat_piece(state["exp_avg_sq"], numel, group), "step": state["step"]}


def check_names(loaded: list[str], expected: list[str], what: str) -> None:
    """After loading: the checkpoint's buffer holds the same parameters in the same order.

    Raises:
        ValueError: it does not (another model, or another unit layout), naming the first difference.
    """
    if list(loaded) != list(expected):
        diff = next((f"{a!r} vs {b!r}" for a, b in zip(loaded, expected) if a != b),
                    f"{len(loaded)} vs {len(expected)} parameters")
        raise ValueError(f"--resume: the checkpoint's {what} holds other parameters than this run's ({diff}); "
                         "resume with the model (--preset, --vocab_size, --model_max_length) it was written with")


def gather_flat(flat: torch.Tensor, shard: torch.Tensor, group) -> None:
    """ZeRO-1/2 after loading: every rank's loaded slice all-gathered into the whole flat buffer (in ``group``)."""
    with torch.no_grad():
        flat.copy_(collectives.all_gather(shard.detach(), 0, group=group))


def checkpoint_family(path) -> str | None:
    """Which layout wrote checkpoint ``path``: :data:`ZERO_FLAT`, :data:`ZERO_UNITS`, ``"model"`` (plain data
    parallelism) or None (none of them); read from its ``.metadata`` alone (no process group needed)."""
    from torch.distributed.checkpoint import FileSystemReader

    keys = FileSystemReader(str(path)).read_metadata().state_dict_metadata
    for family in (ZERO_FLAT, ZERO_UNITS, "model"):
        if any(k.startswith(family + ".") for k in keys):
            return family
    return None
