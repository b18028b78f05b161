"""Counted communication: collectives and point-to-point transfers that name their group.

The parts call :func:`all_reduce`, :func:`all_gather`, :func:`reduce_scatter`,
:func:`all_to_all_single`, :func:`isend` and :func:`recv` from here instead of ``torch.distributed`` directly, for
two reasons:

* **every call takes its process group** (``group``; ``None`` means the whole world, which
  is the right group only when the run has a single parallelism), so nothing talks to the
  world by accident when data, pipeline and tensor parallelism are combined on one mesh
  (docs/architecture.md, "The device mesh");
* a :class:`CommCounter` can record each call: its ``kind``, the ``group`` it ran in (by
  name: ``"tp"``, ``"dp"``, ``"pp"``, ``"embedding"``, ``"world"``), the ``bytes`` of the full
  tensor it is about (the tensor all-reduced, the gathered output, the reduce-scatter
  input, the tensor sent or received) and the ``traffic_bytes`` one rank sends with a ring
  algorithm in a group of p ranks:

  * all-reduce of N bytes: ``2 (p-1)/p N`` (a reduce-scatter followed by an all-gather),
  * all-gather to N bytes, reduce-scatter from N bytes: ``(p-1)/p N`` each,
  * all-to-all of N bytes (this rank's input): the bytes of the chunks that go to the other
    ranks, ``(p-1)/p N`` when the splits are equal (a chunk to itself is not sent),
  * send of N bytes: N (a receive sends nothing).

  This is why sequence parallelism (Korthikanti et al. 2022, Sec. 4.2.2) costs the same
  traffic as plain tensor parallelism (Shoeybi et al. 2019, Sec. 3): each all-reduce
  becomes one all-gather plus one reduce-scatter.

Each record also carries the ``scope`` (``"embedding"``, ``"blocks"``, ``"head"``,
``"grad_sync"``, ...) and ``phase`` (``"forward"``, ``"backward"``, ``"step"``) it happened
in: forward scopes are set with :func:`region`, backward scopes by :func:`mark_backward`
markers placed in the forward pass (autograd runs them when the backward pass reaches
that point).

While the course's event recorder is active (:mod:`course.trace`), each counted call is also a
span of the row ``communication``, named ``"<kind> <group>"`` with the kind, group, bytes, ring
traffic, peer, scope and phase as its arguments: its start and end are :func:`course.measure.now`
(the wall clock, seconds, read after the device's queued work has run — on a GPU a span is the
communication to its completion, not the time to queue it; the clock of ``pipeline.StageRunner``'s
spans), so a run can draw its communication next to its computation. Without an active recorder
no clock is read (and no GPU synchronised): a :class:`CommCounter` only counts. The operations of an
:func:`exchange` span the whole batch, waiting included; a plain :func:`isend`'s span is its posting
only.

Point-to-point follows NCCL's rules (docs/architecture.md, "Point-to-point under NCCL's rules"):
messages between two ranks are matched by order (no tags), and an exchange in which both ranks
send goes through :func:`exchange` / :func:`send_recv` (one ``batch_isend_irecv``), or
:func:`start_exchange` when the batch should run while the rank computes (wait on it later).

Without a process group (one process) the collectives are identities and nothing is recorded.
"""
from __future__ import annotations

import contextlib
from collections import defaultdict
from dataclasses import dataclass

import torch
import torch.distributed as dist

from course import trace

_ACTIVE: list["CommCounter"] = []
_SCOPE: list[tuple[str | None, str | None]] = [(None, None)]  # (scope, phase) now

# ---- groups ---------------------------------------------------------------------------------


_NAMES: dict[int, str] = {}  # id(process group) -> the name the run's mesh gave it


def name_group(group, name: str) -> None:
    """Give ``group`` a name for :class:`CommCounter` records (the mesh names its ``dp``/``pp``/``tp``
    groups; a dimension that spans every rank *is* the world group, and takes the dimension's name)."""
    if group is not None:
        _NAMES[id(group)] = name


def forget_run() -> None:
    """Forget what a run left here: the names given to its groups, its active :class:`CommCounter` records and
    its scope (a pooled rank, :mod:`course.launch_pool`, calls this before each run it takes)."""
    _NAMES.clear()
    _ACTIVE.clear()
    del _SCOPE[1:]
    _SCOPE[0] = (None, None)


def group_name(group) -> str:
    """A short name for ``group``: the name the mesh gave it (``"tp"``, ``"dp"``, ``"pp"``,
    ``"embedding"``), else the description it was created with, else ``"world"`` for the
    default group."""
    if group is None and dist.is_initialized():
        group = dist.group.WORLD
    if id(group) in _NAMES:
        return _NAMES[id(group)]
    if group is None or group is dist.group.WORLD:
        return "world"
    desc = getattr(group, "group_desc", "") or ""
    if desc.startswith("mesh_"):
        return desc[len("mesh_"):]
    return desc if desc not in ("", "undefined") else str(group.group_name)


def group_size(group=None) -> int:
    """Number of ranks in ``group`` (None: the world); 1 without a process group."""
    return dist.get_world_size(group) if dist.is_initialized() else 1


def group_rank(group=None) -> int:
    """This rank's index in ``group`` (None: the world); 0 without a process group."""
    return dist.get_rank(group) if dist.is_initialized() else 0


def global_rank(group, group_rank_: int) -> int:
    """The global rank of rank ``group_rank_`` of ``group`` (send/recv address peers by global rank)."""
    if group is None or not dist.is_initialized():
        return group_rank_
    return dist.get_global_rank(group, group_rank_)


# ---- the counter ------------------------------------------------------------------------------


@dataclass(frozen=True)
class CommRecord:
    """One communication call as seen by one rank (bytes in bytes, not elements)."""

    kind: str             # "all_reduce", "all_gather", "reduce_scatter", "all_to_all", "send" or "recv"
    bytes: int            # size of the full tensor (all-reduced / gathered output / reduce-scatter or all-to-all input / sent)
    traffic_bytes: float  # bytes this rank sends (ring algorithm for collectives)
    scope: str | None
    phase: str | None
    shape: tuple
    group: str = "world"  # name of the group it ran in (see group_name)
    peer: int | None = None  # send/recv: the other rank (global rank)


class CommCounter:
    """Counts the communication issued while it is active (``with CommCounter() as c:``).

    ``summary(scope=None, phase=None, group=None)`` returns ``{kind: {"count", "bytes",
    "traffic_bytes"}}`` over the matching records; ``by_group()`` the same per group name;
    ``reset()`` forgets them. When each call happened is the event recorder's
    (:mod:`course.trace`): a counter reads no clock.
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

    def select(self, scope: str | None = None, phase: str | None = None, group: str | None = None) -> list[CommRecord]:
        return [r for r in self.records
                if (scope is None or r.scope == scope) and (phase is None or r.phase == phase)
                and (group is None or r.group == group)]

    def summary(self, scope: str | None = None, phase: str | None = None,
                group: str | None = None) -> dict[str, dict[str, float]]:
        out: dict[str, dict[str, float]] = defaultdict(lambda: {"count": 0, "bytes": 0, "traffic_bytes": 0.0})
        for r in self.select(scope, phase, group):
            out[r.kind]["count"] += 1
            out[r.kind]["bytes"] += r.bytes
            out[r.kind]["traffic_bytes"] += r.traffic_bytes
        return {k: dict(v) for k, v in sorted(out.items())}

    def by_group(self, scope: str | None = None, phase: str | None = None) -> dict[str, dict[str, dict[str, float]]]:
        """``{group name: {kind: {"count", "bytes", "traffic_bytes"}}}``."""
        return {name: self.summary(scope, phase, name) for name in sorted({r.group for r in self.records})}

    def counts(self, scope: str | None = None, phase: str | None = None, group: str | None = None) -> dict[str, int]:
        """``{kind: number of calls}`` over the matching records."""
        return {k: int(v["count"]) for k, v in self.summary(scope, phase, group).items()}


def _clock(x: torch.Tensor) -> float | None:
    """The start or end of a call: :func:`course.measure.now` on ``x``'s device while an event recorder is
    active (:func:`course.trace.clock`; None otherwise: no clock read, no synchronisation)."""
    return trace.clock(x.device)


RING_STEPS = {"all_reduce": lambda p: 2 * (p - 1), "all_gather": lambda p: p - 1, "reduce_scatter": lambda p: p - 1,
              "all_to_all": lambda p: p - 1, "send": lambda p: 1, "recv": lambda p: 0}


def ring_traffic_bytes(kind: str, nbytes: float, p: int) -> float:
    """Bytes one rank sends for a ``kind`` call about a tensor of ``nbytes`` in a group of ``p`` ranks, with
    the ring algorithm (module docstring): all-reduce ``2 (p-1)/p N``; all-gather, reduce-scatter and an
    all-to-all of equal chunks ``(p-1)/p N``; send ``N``; recv 0. The one formula the counter records and
    the planner (:mod:`project.planner`) predicts with (Thakur et al. 2005, Sec. 4; Patarasuk and Yuan 2009).

    Raises:
        ValueError: an unknown kind.
    """
    if kind not in RING_STEPS:
        raise ValueError(f"unknown communication kind {kind!r}; one of {tuple(RING_STEPS)}")
    if kind in ("send", "recv"):
        return float(nbytes) if kind == "send" else 0.0
    share = (p - 1) / p
    return (2 if kind == "all_reduce" else 1) * share * nbytes


def _record(kind: str, full: torch.Tensor, group, peer: int | None = None, start: float | None = None,
            traffic: float | None = None) -> None:
    if not _ACTIVE and start is None:
        return
    end = _clock(full)
    nbytes = full.numel() * full.element_size()
    p = group_size(group)
    if traffic is None:
        traffic = ring_traffic_bytes(kind, nbytes, p)
    scope, phase = _SCOPE[-1]
    rec = CommRecord(kind, nbytes, traffic, scope, phase, tuple(full.shape), group_name(group), peer)
    for counter in _ACTIVE:
        counter.records.append(rec)
    if start is not None and end is not None:  # course.trace: a span for every active recorder
        trace.record(f"{kind} {rec.group}", "communication", start, end, kind=kind, group=rec.group, bytes=nbytes,
                     traffic_bytes=traffic, peer=peer, scope=scope, phase=phase)


@contextlib.contextmanager
def region(scope: str, phase: str = "forward"):
    """Label the communication issued inside the ``with`` block (forward pass, optimizer step)."""
    _SCOPE.append((scope, phase))
    try:
        yield
    finally:
        _SCOPE.pop()


def set_backward_scope(scope: str | None) -> None:
    """Label the communication from now on as ``(scope, "backward")`` (used by :func:`mark_backward`)."""
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
    """Identity on ``x``; when the backward pass reaches it, later communication counts as ``scope``.

    Place it on the output of a part of the model: the backward pass of that part starts there.
    """
    if not torch.is_grad_enabled() or not x.requires_grad:
        return x
    return _BackwardMarker.apply(x, scope)


# ---- counted collectives ------------------------------------------------------------------------


def all_reduce(x: torch.Tensor, group=None, op=dist.ReduceOp.SUM) -> torch.Tensor:
    """``op`` (default SUM) of ``x`` over the ranks of ``group``: a new tensor, same shape; ``x`` unchanged."""
    if group_size(group) == 1:
        return x
    out = x.contiguous().clone()
    start = _clock(out)
    dist.all_reduce(out, op=op, group=group)
    _record("all_reduce", out, group, start=start)
    return out


def all_reduce_max(x: torch.Tensor, group=None) -> torch.Tensor:
    """Element-wise maximum of ``x`` over ``group`` (a new tensor; counted as an all-reduce)."""
    return all_reduce(x, group, dist.ReduceOp.MAX)


def all_gather(x: torch.Tensor, dim: int, group=None) -> torch.Tensor:
    """Concatenation of every rank's ``x`` along ``dim`` in group-rank order; ``dim`` grows p times."""
    p = group_size(group)
    if p == 1:
        return x
    x = x.contiguous()
    parts = [torch.empty_like(x) for _ in range(p)]
    start = _clock(x)
    dist.all_gather(parts, x, group=group)
    out = torch.cat(parts, dim=dim)
    _record("all_gather", out, group, start=start)
    return out


def reduce_scatter(x: torch.Tensor, dim: int, group=None) -> torch.Tensor:
    """Sum of ``x`` over ``group``, of which group rank r keeps the r-th of p equal chunks along ``dim``.

    Raises:
        ValueError: the size of ``dim`` is not divisible by the group size.
    """
    p = group_size(group)
    if p == 1:
        return x
    if x.size(dim) % p:
        raise ValueError(f"reduce_scatter: size {x.size(dim)} of dim {dim} is not divisible by the group size {p}")
    start = _clock(x)
    chunks = [c.contiguous() for c in x.chunk(p, dim=dim)]
    out = torch.empty_like(chunks[0])
    dist.reduce_scatter(out, chunks, op=dist.ReduceOp.SUM, group=group)
    _record("reduce_scatter", x, group, start=start)
    return out


def all_to_all_single(x: torch.Tensor, output_split_sizes: list[int] | None = None,
                      input_split_sizes: list[int] | None = None, group=None) -> torch.Tensor:
    """All-to-all along dim 0: chunk j of ``x`` (``input_split_sizes[j]`` rows; equal chunks if None) goes
    to group rank j, and the result holds, in group-rank order, the chunk every rank sent here
    (``output_split_sizes[i]`` rows from group rank i). A new tensor; ``x`` unchanged.

    The split sizes are Python ints that every pair of ranks must agree on (what i sends to j is
    what j expects from i): exchange them first when they are known only at run time. Under NCCL
    ``x`` must be on this rank's GPU. Recorded as ``all_to_all`` with the bytes of ``x`` and, as
    traffic, the bytes of the chunks sent to the other ranks.

    Raises:
        ValueError: a split list whose length is not the group size, or whose sum is not ``x``'s rows.
    """
    p = group_size(group)
    rows = x.shape[0]
    for name, splits in (("input_split_sizes", input_split_sizes), ("output_split_sizes", output_split_sizes)):
        if splits is not None and len(splits) != p:
            raise ValueError(f"all_to_all_single: {name} has {len(splits)} entries for a group of {p} ranks")
    if input_split_sizes is not None and sum(input_split_sizes) != rows:
        raise ValueError(f"all_to_all_single: input_split_sizes {input_split_sizes} sum to {sum(input_split_sizes)}, "
                         f"but the input has {rows} rows")
    if p == 1:
        return x.clone()
    x = x.contiguous()
    out_rows = sum(output_split_sizes) if output_split_sizes is not None else rows
    out = x.new_empty((out_rows, *x.shape[1:]))
    start = _clock(x)
    dist.all_to_all_single(out, x, output_split_sizes, input_split_sizes, group=group)
    mine = group_rank(group)
    row_bytes = x[0].numel() * x.element_size() if rows else 0
    own = (input_split_sizes[mine] if input_split_sizes is not None else rows // p) * row_bytes
    _record("all_to_all", x, group, start=start, traffic=float(x.numel() * x.element_size() - own))
    return out


def isend(tensor: torch.Tensor, dst: int, group=None, counted: bool = True):
    """Start sending ``tensor`` to global rank ``dst`` (a member of ``group``); returns the ``Work`` handle.

    Safe under NCCL only when the peer's matching receive cannot be stuck behind a send of its own
    to this rank: an exchange between two ranks goes through :func:`send_recv` or :func:`exchange`.
    Messages between two ranks are matched by order (NCCL has no tags)."""
    start = _clock(tensor)
    work = dist.isend(tensor, dst, group=group)
    if counted:
        _record("send", tensor, group, dst, start=start)
    return work


def recv(tensor: torch.Tensor, src: int, group=None, counted: bool = True) -> torch.Tensor:
    """Receive into ``tensor`` from global rank ``src`` (a member of ``group``), blocking; returns ``tensor``.
    It meets the next message ``src`` sends to this rank in ``group`` (matched by order)."""
    start = _clock(tensor)
    dist.recv(tensor, src, group=group)
    if counted:
        _record("recv", tensor, group, src, start=start)
    return tensor


@dataclass(frozen=True)
class P2P:
    """One operation of a batch (:func:`exchange`): ``kind`` ``"send"`` or ``"recv"``, the tensor sent
    or received into, and the peer's **global** rank."""

    kind: str
    tensor: torch.Tensor
    peer: int


def exchange(ops: list[P2P], group=None, counted: bool = True) -> None:
    """Post ``ops`` together as one ``torch.distributed.batch_isend_irecv`` (an NCCL group call: the
    operations start together, so two ranks that send to each other and receive from each other
    cannot wait for one another) and wait for all of them.

    Two ranks' batches meet message by message in the order of their operations: the k-th send
    from a to b meets b's k-th receive from a (so both sides list them in the same order).
    Each operation is recorded (kind ``send``/``recv``) with the span of the whole exchange.

    Raises:
        ValueError: an unknown kind, or no operation.
    """
    start_exchange(ops, group, counted).wait()


class PendingExchange:
    """A batch posted by :func:`start_exchange`; :meth:`wait` waits for all of its operations (and
    records them, with the span from posting to the end of the wait)."""

    def __init__(self, ops: list[P2P], works: list, group, counted: bool, start: float | None):
        self.ops, self.works, self.group, self.counted, self.start = ops, works, group, counted, start
        self.done = False

    def wait(self) -> None:
        if self.done:
            return
        for work in self.works:
            work.wait()
        self.done = True
        if self.counted:
            for op in self.ops:
                _record(op.kind, op.tensor, self.group, op.peer, start=self.start)


def start_exchange(ops: list[P2P], group=None, counted: bool = True) -> PendingExchange:
    """Post ``ops`` as one ``batch_isend_irecv`` (like :func:`exchange`) and return at once: compute while
    the transfer runs, then call ``.wait()`` before touching the tensors (ring attention posts step s+1's
    transfer before computing step s; Liu et al. 2023, Sec. 3).

    Raises:
        ValueError: an unknown kind, or no operation.
    """
    if not ops:
        raise ValueError("exchange needs at least one operation")
    p2p = []
    for op in ops:
        if op.kind not in ("send", "recv"):
            raise ValueError(f"a P2P kind is 'send' or 'recv', not {op.kind!r}")
        p2p.append(dist.P2POp(dist.isend if op.kind == "send" else dist.irecv, op.tensor, op.peer, group))
    start = _clock(ops[0].tensor)
    return PendingExchange(list(ops), dist.batch_isend_irecv(p2p), group, counted, start)


def send_recv(send: torch.Tensor, dst: int, recv_into: torch.Tensor, src: int, group=None) -> torch.Tensor:
    """Send ``send`` to global rank ``dst`` and receive from global rank ``src`` into ``recv_into``, in one
    batch (:func:`exchange`), so it is safe when ``dst`` does the same towards this rank (``src == dst``
    in a ring of two, or the pairwise exchanges of recursive doubling). Returns ``recv_into``."""
    exchange([P2P("send", send, dst), P2P("recv", recv_into, src)], group)
    return recv_into
