"""Counted collectives: every communication of tensor parallelism goes through here.

The autograd functions of :mod:`tensor_parallel.mappings` call :func:`all_reduce`,
:func:`all_gather` and :func:`reduce_scatter` instead of ``torch.distributed``
directly, so a :class:`CommCounter` can record each call: its ``kind``, the ``bytes``
of the full tensor it is about (the tensor all-reduced, the gathered output, the
reduce-scatter input) and the ``traffic_bytes`` one rank sends with a ring algorithm:

* all-reduce of N bytes: ``2 (p-1)/p N`` (a reduce-scatter followed by an all-gather),
* all-gather to N bytes, reduce-scatter from N bytes: ``(p-1)/p N`` each,

where p is the world size. This is why sequence parallelism (Korthikanti et al. 2022,
Sec. 4.2.2) costs the same traffic as plain tensor parallelism (Shoeybi et al. 2019,
Sec. 3): each all-reduce becomes one all-gather plus one reduce-scatter.

Each record also carries the ``scope`` (``"embedding"``, ``"blocks"``, ``"head"``,
``"grad_sync"``, ...) and ``phase`` (``"forward"``, ``"backward"``, ``"step"``) it happened
in: forward scopes are set with :func:`region`, backward scopes by :func:`mark_backward`
markers placed in the forward pass (autograd runs them when the backward pass reaches
that point).

The process group is the default one: in this course ``world_size == tp_size``.
"""
from __future__ import annotations

import contextlib
from collections import defaultdict
from dataclasses import dataclass

import torch
import torch.distributed as dist

_ACTIVE: list["CommCounter"] = []
_SCOPE: list[tuple[str | None, str | None]] = [(None, None)]  # (scope, phase) now


@dataclass(frozen=True)
class CommRecord:
    """One collective call as seen by one rank (bytes in bytes, not elements)."""

    kind: str           # "all_reduce", "all_gather" or "reduce_scatter"
    bytes: int          # size of the full tensor (all-reduced / gathered output / reduce-scatter input)
    traffic_bytes: float  # bytes this rank sends with a ring algorithm
    scope: str | None
    phase: str | None
    shape: tuple


class CommCounter:
    """Records the collectives issued while it is active (``with CommCounter() as c:``).

    ``summary(scope=None, phase=None)`` returns ``{kind: {"count", "bytes",
    "traffic_bytes"}}`` over the matching records; ``reset()`` forgets them.
    """

    def __init__(self):
        self.records: list[CommRecord] = []

    def __enter__(self) -> "CommCounter":
        _ACTIVE.append(self)
        return self

    def __exit__(self, *exc) -> None:
        _ACTIVE.remove(self)

    def reset(self) -> None:
        self.records.clear()

    def select(self, scope: str | None = None, phase: str | None = None) -> list[CommRecord]:
        return [r for r in self.records
                if (scope is None or r.scope == scope) and (phase is None or r.phase == phase)]

    def summary(self, scope: str | None = None, phase: str | None = None) -> dict[str, dict[str, float]]:
        out: dict[str, dict[str, float]] = defaultdict(lambda: {"count": 0, "bytes": 0, "traffic_bytes": 0.0})
        for r in self.select(scope, phase):
            out[r.kind]["count"] += 1
            out[r.kind]["bytes"] += r.bytes
            out[r.kind]["traffic_bytes"] += r.traffic_bytes
        return {k: dict(v) for k, v in sorted(out.items())}

    def counts(self, scope: str | None = None, phase: str | None = None) -> dict[str, int]:
        """``{kind: number of calls}`` over the matching records."""
        return {k: int(v["count"]) for k, v in self.summary(scope, phase).items()}


def _record(kind: str, full: torch.Tensor, world_size: int) -> None:
    if not _ACTIVE:
        return
    nbytes = full.numel() * full.element_size()
    share = (world_size - 1) / world_size
    traffic = 2 * share * nbytes if kind == "all_reduce" else share * nbytes
    scope, phase = _SCOPE[-1]
    rec = CommRecord(kind, nbytes, traffic, scope, phase, tuple(full.shape))
    for counter in _ACTIVE:
        counter.records.append(rec)


@contextlib.contextmanager
def region(scope: str, phase: str = "forward"):
    """Label the collectives issued inside the ``with`` block (forward pass, optimizer step)."""
    _SCOPE.append((scope, phase))
    try:
        yield
    finally:
        _SCOPE.pop()


def set_backward_scope(scope: str | None) -> None:
    """Label the collectives from now on as ``(scope, "backward")`` (used by :func:`mark_backward`)."""
    _SCOPE[0] = (scope, "backward")


class _BackwardMarker(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, scope):
        ctx.scope = scope
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        set_backward_scope(ctx.scope)
        return grad, None


def mark_backward(x: torch.Tensor, scope: str) -> torch.Tensor:
    """Identity on ``x``; when the backward pass reaches it, later collectives count as ``scope``.

    Place it on the output of a part of the model: the backward pass of that part starts there.
    """
    if not torch.is_grad_enabled() or not x.requires_grad:
        return x
    return _BackwardMarker.apply(x, scope)


def tp_rank() -> int:
    """This rank's index in the tensor-parallel group (0 without a process group)."""
    return dist.get_rank() if dist.is_initialized() else 0


def tp_world_size() -> int:
    """Size of the tensor-parallel group, ``tp_size`` (1 without a process group)."""
    return dist.get_world_size() if dist.is_initialized() else 1


def _all_reduce(x: torch.Tensor, op) -> torch.Tensor:
    p = tp_world_size()
    if p == 1:
        return x
    out = x.contiguous().clone()
    _record("all_reduce", out, p)
    dist.all_reduce(out, op=op)
    return out


def all_reduce(x: torch.Tensor) -> torch.Tensor:
    """Sum of ``x`` over the ranks (a new tensor, same shape; ``x`` is left unchanged)."""
    return _all_reduce(x, dist.ReduceOp.SUM)


def all_reduce_max(x: torch.Tensor) -> torch.Tensor:
    """Element-wise maximum of ``x`` over the ranks (a new tensor; counted as an all-reduce)."""
    return _all_reduce(x, dist.ReduceOp.MAX)


def all_gather(x: torch.Tensor, dim: int) -> torch.Tensor:
    """Concatenation of every rank's ``x`` along ``dim`` (rank order); the size of ``dim`` grows p times."""
    p = tp_world_size()
    if p == 1:
        return x
    x = x.contiguous()
    parts = [torch.empty_like(x) for _ in range(p)]
    dist.all_gather(parts, x)
    out = torch.cat(parts, dim=dim)
    _record("all_gather", out, p)
    return out


def reduce_scatter(x: torch.Tensor, dim: int) -> torch.Tensor:
    """Sum of ``x`` over the ranks, of which rank r keeps the r-th of p equal chunks along ``dim``.

    Raises:
        ValueError: the size of ``dim`` is not divisible by the world size.
    """
    p = tp_world_size()
    if p == 1:
        return x
    if x.size(dim) % p:
        raise ValueError(f"reduce_scatter: size {x.size(dim)} of dim {dim} is not divisible by world size {p}")
    _record("reduce_scatter", x, p)
    chunks = [c.contiguous() for c in x.chunk(p, dim=dim)]
    out = torch.empty_like(chunks[0])
    dist.reduce_scatter(out, chunks, op=dist.ReduceOp.SUM)
    return out
