"""NCCL's ordering rules, enforced on gloo: a test mode that makes CPU runs fail where GPU runs would hang.

Gloo forgives orders of sends and receives that NCCL does not. A program that passes on
CPU can therefore hang on GPUs. Under ``LLMSYS_NCCL_RULES=1`` (set by the tests whose names
hold ``rendezvous``; :func:`course.launch.launch` installs this module in every rank), each
rank's point-to-point traffic goes through an emulator that behaves as NCCL may (rules 1-4), the
making of groups is checked (rule 5), and so is every collective (rule 6):

1. **One ordered stream per process group.** The operations a rank issues in one group run in
   the order they were issued, one after the other (``"group"``, the default: what PyTorch does
   when the process group is initialised eagerly, as :mod:`course.launch` does on GPUs — every
   point-to-point operation of the group then runs on the group's communicator and stream).
   ``LLMSYS_NCCL_STREAMS=pair`` keeps one stream per peer instead (lazy initialisation: a
   communicator per pair). A collective in a group runs after the group's pending
   point-to-point operations, as it would on the same stream.
2. **A send completes only once the peer's matching receive runs** (a rendezvous), whatever
   its size: NCCL buffers small messages, but large ones wait, so code must not rely on it.
3. **Messages are matched by order alone**: tags are ignored (NCCL has none). The k-th send
   from a to b in a group meets b's k-th receive from a; if their sizes or dtypes differ,
   the send raises.
4. **The operations of one** ``batch_isend_irecv`` **start together** (an NCCL group call)
   and complete together.

5. **Making a group is collective, and its name must meet.** On GPUs (the process group bound to the
   device, as :mod:`course.launch` binds it) a group on the run's back-end is made by splitting the
   world's NCCL communicator (``ncclCommSplit``), which every rank of the world must join: torch makes
   the non-members join with a no-colour split — except for a group made with
   ``use_local_synchronization=True``, whose non-members skip the call, so its members wait for them
   unless every rank makes such a group at the same time. Torch names a group made without
   ``use_local_synchronization`` from its count of the groups made so far. So every rank must make the
   same groups, in the same order. A group made by ``split_group`` (``init_device_mesh``'s groups on
   GPUs) or with ``use_local_synchronization=True`` is named from its ranks and the number of groups the
   rank *holds*: its members must hold as many groups as each other, or they wait for each other under
   different names forever. Each rank posts what it makes in the default store and checks it against
   the others before the group is made: a group made by only some ranks, groups made in different
   orders, and names that would not meet raise :class:`NcclRuleError` saying which ranks did what
   (gloo on CPU builds ``init_device_mesh``'s groups with ``new_group`` and names them from the global
   count, which hides the last case there).

6. **Every rank of a group issues the same collectives, in the same order, with sizes that agree.** NCCL
   matches a group's collectives by the order each rank issues them, and each call has one count and one
   datatype: the k-th collective of a group on one rank meets the k-th on every other. Ranks that issue two
   collectives in different orders, or the same one with different dtypes, roots, reduce ops or element counts,
   hang or move the wrong bytes on GPUs (gloo, which matches them the same way, aborts with an unrelated error
   or runs). An all-to-all is a group of sends and receives on NCCL, so its splits may be uneven — MoE dispatch's
   differ between ranks by design — but every pair must agree: rank i's ``input_split_sizes[j]`` (rows of i's
   input) must be rank j's ``output_split_sizes[i]`` (in elements: rows times the row's elements). Before each
   collective of ``torch.distributed`` (``all_reduce``, ``broadcast``, ``reduce``, ``all_gather``,
   ``all_gather_into_tensor``, ``reduce_scatter``, ``reduce_scatter_tensor``, ``all_to_all``,
   ``all_to_all_single``, ``gather``, ``scatter``, ``barrier``, ``all_gather_object``,
   ``broadcast_object_list``; an object collective counts once, its inner collectives are part of it) a rank
   sends the other members of the group a *signature* of its call — the collective, its dtype, root, reduce op,
   the tensor's shape, and the elements it puts in for each group rank and expects from each — and compares all
   of them: ``input i -> j`` against ``output j <- i`` for every pair, which covers the all-to-alls' uneven
   splits, the list forms of all-gather and reduce-scatter, and the equal counts of the others. A mismatch
   raises :class:`NcclRuleError` on every member (before any of them issues the collective, so a caller that
   catches it stays in step) naming the two ranks, the group, the collective's place in the group's sequence
   (``collective #n``, counted from :func:`install`) and both calls; a member that does not issue its
   collective within ``LLMSYS_NCCL_RULES_TIMEOUT`` raises naming the ranks it waited for.

A wait that does not finish within ``LLMSYS_NCCL_RULES_TIMEOUT`` seconds (default 60)
raises with what this rank waits for and what each of its streams holds: the deadlock NCCL
would have, found on a laptop. Two ranks that each send to the other before receiving are
caught this way (tested).

How it is emulated: each rank's operations are queued per stream; an operation (or a batch)
starts when it is first in every stream it uses. A starting receive sends a small *ready*
token (its size and dtype) to its source; a send waits for that token before it moves the
data, and compares the sizes. Tokens and data travel over the same gloo group with tags of
their own, so they are matched by order too; so do the collectives' signatures (a third tag, one
small int64 message from each member to each other per collective, into a receive each rank keeps
posted for its peer's next signature, so that it crosses in one hop: about one message latency added
to each collective, and nothing the flight recorder or the communication counters see).

Installed by :func:`install` (it replaces ``torch.distributed``'s ``isend``, ``irecv``,
``send``, ``recv``, ``batch_isend_irecv`` and ``new_group`` — also the one ``init_device_mesh``
calls — and makes its collectives wait for the group's pending point-to-point operations first, then
check rule 6), so student code that calls ``torch.distributed`` directly is held to the same rules.

Sources: NCCL documentation, "Point-to-point communication" and "Group calls"; PyTorch
``ProcessGroupNCCL`` (eager initialisation reuses the group's communicator for
point-to-point, pytorch/pytorch#129140, #132900); ``torch.distributed.distributed_c10d``'s
``new_group``, ``split_group`` and ``_process_group_name`` (group names) and ``_new_process_group_helper``
(the no-colour split of non-members); for rule 6, NCCL documentation, "Collective Operations" and "NCCL and
MPI" (one count and one datatype per call, on every rank) and "Point-to-point communication: All-to-all"
(an all-to-all as a group of sends and receives), and ``ProcessGroupNCCL::alltoall_base`` (the split sizes
become per-peer sends and receives).
"""
from __future__ import annotations

import datetime
import itertools
import os
import threading
import time
from collections import deque

import torch
import torch.distributed as dist
from torch.distributed import distributed_c10d as c10d

from course import collective_signatures as signatures

ENV = "LLMSYS_NCCL_RULES"
TIMEOUT_ENV = "LLMSYS_NCCL_RULES_TIMEOUT"
STREAMS_ENV = "LLMSYS_NCCL_STREAMS"
_READY_TAG, _DATA_TAG = 0x4C4C5901, 0x4C4C5902  # gloo tags of the emulator's own messages
_DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int64, torch.int32, torch.int8,
           torch.uint8, torch.bool, torch.complex64]


def enabled() -> bool:
    """Whether this process runs under the emulated NCCL rules (``LLMSYS_NCCL_RULES=1``)."""
    return os.environ.get(ENV, "") not in ("", "0")


def _timeout() -> float:
    return float(os.environ.get(TIMEOUT_ENV, "60"))


class NcclRuleError(RuntimeError):
    """A program that NCCL would not run: a deadlock, messages matched wrongly, groups made differently, or
    collectives that differ between the ranks of a group."""


class _Op:
    def __init__(self, kind: str, tensor: torch.Tensor, peer: int, group, seq: int):
        if not tensor.is_contiguous():
            raise ValueError(f"{kind}: NCCL needs a contiguous tensor (call .contiguous() first)")
        self.kind, self.tensor, self.peer, self.group, self.seq = kind, tensor, peer, group, seq
        self.group_peer = dist.get_group_rank(group, peer)
        self.state = "queued"

    def describe(self) -> str:
        where = "to" if self.kind == "send" else "from"
        return (f"{self.kind} #{self.seq} {where} rank {self.peer}: {self.tensor.numel()} x {self.tensor.dtype} "
                f"({self.state})")

    def run(self) -> None:
        """Carry out the operation over gloo (blocking; called on the unit's thread)."""
        token = torch.zeros(2, dtype=torch.int64, device="cpu")  # this mode runs on gloo, on the CPU
        if self.kind == "recv":
            token[0], token[1] = self.tensor.numel(), _code(self.tensor.dtype)
            self.state = "ready sent, waiting for the data"
            data = self.group.recv([_wire(self.tensor)], self.group_peer, _DATA_TAG)
            self.group.send([token], self.group_peer, _READY_TAG).wait()
            data.wait()
        else:
            self.state = "waiting for the peer's matching receive to start"
            self.group.recv([token], self.group_peer, _READY_TAG).wait()
            numel, code = int(token[0]), int(token[1])
            if numel != self.tensor.numel() or code != _code(self.tensor.dtype):
                raise NcclRuleError(
                    f"rank {dist.get_rank()} sends {self.tensor.numel()} x {self.tensor.dtype} to rank {self.peer}, but "
                    f"the receive it meets there expects {numel} x {_DTYPES[code] if 0 <= code < len(_DTYPES) else code}: "
                    "NCCL matches messages by order alone (no tags), so both ranks must post the messages between "
                    "them in the same order")
            self.state = "sending the data"
            self.group.send([_wire(self.tensor)], self.group_peer, _DATA_TAG).wait()
        self.state = "done"


def _code(dtype) -> int:
    return _DTYPES.index(dtype) if dtype in _DTYPES else len(_DTYPES)


def _wire(tensor: torch.Tensor) -> torch.Tensor:
    return torch.view_as_real(tensor) if tensor.is_complex() else tensor


class _Unit:
    """One operation, or the operations of one batch: they start together and complete together."""

    def __init__(self, ops: list[_Op], streams: list):
        self.ops, self.streams = ops, streams
        self.done = threading.Event()
        self.error: BaseException | None = None
        self.started = False

    def describe(self) -> str:
        inner = "; ".join(op.describe() for op in self.ops)
        return f"[batch: {inner}]" if len(self.ops) > 1 else inner


class _Engine:
    """This rank's streams and the threads that carry out what is first in them."""

    def __init__(self):
        self.lock = threading.Condition()
        self.streams: dict = {}
        self.seq = itertools.count()
        self.per_pair = os.environ.get(STREAMS_ENV, "group") == "pair"

    def _keys(self, ops: list[_Op]) -> list:
        keys = []
        for op in ops:
            key = (id(op.group), op.peer) if self.per_pair else (id(op.group),)
            if key not in keys:
                keys.append(key)
        return keys

    def submit(self, ops: list[_Op]) -> _Unit:
        unit = _Unit(ops, self._keys(ops))
        with self.lock:
            for key in unit.streams:
                self.streams.setdefault(key, deque()).append(unit)
        threading.Thread(target=self._run, args=(unit,), daemon=True, name="nccl-rules").start()
        return unit

    def _first_everywhere(self, unit: _Unit) -> bool:
        return all(self.streams[key][0] is unit for key in unit.streams)

    def _run(self, unit: _Unit) -> None:
        with self.lock:
            while not self._first_everywhere(unit):
                self.lock.wait()
            unit.started = True
        errors: list[BaseException] = []

        def one(op: _Op):
            try:
                op.run()
            except BaseException as exc:  # noqa: BLE001 - handed to whoever waits
                errors.append(exc)

        threads = [threading.Thread(target=one, args=(op,), daemon=True) for op in unit.ops]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        unit.error = errors[0] if errors else None
        with self.lock:
            for key in unit.streams:
                self.streams[key].popleft()
            self.lock.notify_all()
        unit.done.set()

    def report(self) -> str:
        with self.lock:
            lines = []
            for key, queue in self.streams.items():
                if queue:
                    name = _group_label(queue[0].ops[0].group)
                    peer = f", peer {key[1]}" if len(key) > 1 else ""
                    lines.append(f"  stream of group {name}{peer}: " + " -> ".join(u.describe() for u in queue))
            return "\n".join(lines) or "  (every stream is empty)"

    def drain(self, group) -> None:
        """Wait until this rank's pending point-to-point operations in ``group`` are done."""
        with self.lock:
            pending = [u for key, q in self.streams.items() if key[0] == id(group) for u in q]
        for unit in pending:
            _wait(unit, "a collective in the same group (it runs after them on the group's stream)")


def _group_label(group) -> str:
    from course.collectives import group_name

    try:
        return group_name(group)
    except Exception:  # noqa: BLE001
        return "?"


_ENGINE: _Engine | None = None


def _engine() -> _Engine:
    global _ENGINE
    if _ENGINE is None:
        _ENGINE = _Engine()
    return _ENGINE


def _wait(unit: _Unit, what: str, timeout: float | None = None) -> None:
    limit = _timeout() if timeout is None else min(timeout, _timeout())
    if not unit.done.wait(limit):
        raise NcclRuleError(
            f"rank {dist.get_rank()} waited {limit:.0f} s for {unit.describe()} ({what}) — a deadlock under NCCL's "
            "point-to-point rules (operations of a group run in issue order; a send completes only when the peer's "
            "matching receive runs; batch_isend_irecv starts its operations together). Pair each exchange in one "
            "batch_isend_irecv, or post the operations in an order that is safe on both ranks. "
            f"This rank's streams:\n{_engine().report()}")
    if unit.error is not None:
        raise unit.error


class EmulatedWork:
    """What an emulated ``isend``/``irecv``/``batch_isend_irecv`` returns (``wait``, ``is_completed``)."""

    def __init__(self, unit: _Unit, op: _Op):
        self.unit, self.op = unit, op

    def wait(self, timeout=None) -> bool:
        seconds = timeout.total_seconds() if hasattr(timeout, "total_seconds") else timeout
        _wait(self.unit, f"its {self.op.kind}", seconds)
        return True

    def is_completed(self) -> bool:
        return self.unit.done.is_set()

    def is_success(self) -> bool:
        return self.unit.done.is_set() and self.unit.error is None

    def _source_rank(self) -> int:
        return dist.get_group_rank(self.op.group, self.op.peer)


def _group(group):
    return c10d._group_or_default_group(group)


def _peer(group, peer, group_peer) -> int:
    if peer is None and group_peer is None:
        raise NcclRuleError("a receive from any source: NCCL has none; name the source rank")
    return c10d._canonicalize_group_rank(group, peer, group_peer, return_global=True)


def isend(tensor, dst=None, group=None, tag=0, group_dst=None):
    group = _group(group)
    op = _Op("send", tensor, _peer(group, dst, group_dst), group, next(_engine().seq))
    return EmulatedWork(_engine().submit([op]), op)


def irecv(tensor, src=None, group=None, tag=0, group_src=None):
    group = _group(group)
    op = _Op("recv", tensor, _peer(group, src, group_src), group, next(_engine().seq))
    return EmulatedWork(_engine().submit([op]), op)


def send(tensor, dst=None, group=None, tag=0, group_dst=None):
    isend(tensor, dst, group, tag, group_dst).wait()


def recv(tensor, src=None, group=None, tag=0, group_src=None):
    work = irecv(tensor, src, group, tag, group_src)
    work.wait()
    return work.op.peer


def batch_isend_irecv(p2p_op_list):
    if not p2p_op_list:
        raise ValueError("batch_isend_irecv needs at least one P2POp")
    group = _group(p2p_op_list[0].group)
    if any(_group(op.group) is not group for op in p2p_op_list):
        raise ValueError("every operation of one batch_isend_irecv must use the same group (as torch requires)")
    engine = _engine()
    ops = []
    for p2p in p2p_op_list:
        name = getattr(p2p.op, "__name__", "")
        kind = "send" if name == "isend" else "recv" if name == "irecv" else None
        if kind is None:
            raise ValueError(f"a P2POp's op must be isend or irecv, not {p2p.op!r}")
        ops.append(_Op(kind, p2p.tensor, p2p.peer, group, next(engine.seq)))
    unit = engine.submit(ops)
    return [EmulatedWork(unit, op) for op in ops]


# ---- making groups (rule 5) -----------------------------------------------------------------------------

_KEY = "llmsys_nccl_rules"  # the default store's keys of these checks (removed once every rank has read them)


class _Creations:
    """What this rank has made since :func:`install`: its world-collective creations, and per rank list the
    creations whose names come from the groups a rank holds."""

    def __init__(self):
        self.collective = 0
        self.named: dict[tuple, int] = {}


_CREATIONS = _Creations()


def _meet(key: str, members: list[int], value: str, what: str) -> dict[int, str]:
    """Post ``value`` under ``key`` for this rank, wait for every rank of ``members`` to post theirs, and return
    them all (``what``: this rank's creation, for the message). Raises NcclRuleError naming the ranks that do not
    arrive within the rules' timeout."""
    store = c10d._world.pg_map[c10d._get_default_group()][1]
    rank = dist.get_rank()
    keys = [f"{key}/{r}" for r in members]
    store.set(f"{key}/{rank}", value)
    try:
        store.wait(keys, datetime.timedelta(seconds=_timeout()))
    except Exception:  # noqa: BLE001 - a timeout: say who is missing
        missing = [r for r, k in zip(members, keys) if not store.check([k])]
        raise NcclRuleError(
            f"rank {rank} makes {what} and waited {_timeout():.0f} s for rank(s) {missing} to make it too — a group "
            "made by only some ranks. On GPUs making a group is collective (ncclCommSplit of the world's "
            "communicator, which non-members join too), so every rank of the world must make every group, in the "
            "same order, even those it is not a member of") from None
    values = {r: store.get(k).decode() for r, k in zip(members, keys)}
    if store.add(f"{key}/read", 1) == len(members):  # the last reader removes the keys
        for k in (*keys, f"{key}/read"):
            store.delete_key(k)
    return values


def _check_creation(members: list[int], backend, local: bool, desc, split_on_gpus: bool) -> None:
    """Rule 5 for one group about to be made with ranks ``members`` (sorted)."""
    rank = dist.get_rank()
    label = f"group {members}" + (f" ({desc})" if desc else "")
    # On the run's back-end a group is a split of the world's communicator on GPUs: every rank takes part,
    # except the non-members of a use_local_synchronization group (which then hangs unless every rank makes
    # one at the same time, each its own). On another back-end (gloo beside NCCL) only the names count.
    collective = not local or backend is None
    if collective:
        n = _CREATIONS.collective
        _CREATIONS.collective += 1
        mine = f"local:{label}" if local else label
        made = _meet(f"{_KEY}/collective/{n}", list(range(dist.get_world_size())), mine,
                     f"the world's group creation #{n + 1} ({label})")
        shared = {v for v in made.values() if not v.startswith("local:")}
        if shared and (len(shared) > 1 or len(shared) < len(set(made.values()))):  # ok: one group, or each its own
            what = "; ".join(f"rank {r}: {v.removeprefix('local:')}"
                             + (" (use_local_synchronization)" if v.startswith("local:") else "")
                             for r, v in sorted(made.items()))
            raise NcclRuleError(
                f"the ranks make different groups at the world's group creation #{n + 1} — made in different "
                f"orders, or by only some ranks: {what}. On GPUs making a group is collective over the whole world "
                "(ncclCommSplit; torch names it from its count of the groups made so far), so every rank must make "
                "every group, in the same order, even those it is not a member of")
    if (split_on_gpus or local) and rank in members:  # its members meet under its name
        ranks = tuple(members)
        n = _CREATIONS.named.get(ranks, 0)
        _CREATIONS.named[ranks] = n + 1
        held = len(c10d._world.pg_names)
        counts = {r: int(v) for r, v in _meet(f"{_KEY}/named/{'_'.join(map(str, ranks))}/{n}", members, str(held),
                                              label).items()}
        if len(set(counts.values())) > 1:
            how = "split_group (init_device_mesh's groups on GPUs)" if split_on_gpus else \
                "new_group(use_local_synchronization=True)"
            holds = ", ".join(f"rank {r} holds {c}" for r, c in sorted(counts.items()))
            raise NcclRuleError(
                f"rank {rank}: the {label} made by {how} would get a different name on each rank, and its creation "
                f"would wait forever: torch names such a group from its ranks and the number of groups the rank "
                f"already holds, and here {holds}. Some ranks were left out of a group made earlier (the middle "
                "stages of a pipeline of pp >= 3 are in no embedding group): make groups so that every rank gains "
                "as many (course.mesh.new_groups gives the ranks in no group one of their own), or make this group "
                "without use_local_synchronization")


def _checked_new_group(original, split_on_gpus: bool):
    """``new_group`` that first checks rule 5 (``split_on_gpus``: the caller is ``init_device_mesh``, which on
    GPUs makes its groups with ``split_group`` instead)."""
    import inspect

    signature = inspect.signature(original)

    def new_group(*args, **kwargs):
        bound = signature.bind(*args, **kwargs)
        bound.apply_defaults()
        a = bound.arguments
        ranks = a["ranks"]
        local = bool(a["use_local_synchronization"])
        members = sorted(ranks) if ranks is not None else list(range(dist.get_world_size()))
        if not (local and dist.get_rank() not in members):  # a use_local_synchronization non-member skips it
            _check_creation(members, a["backend"], local, a["group_desc"], split_on_gpus)
        return original(*args, **kwargs)

    new_group.__name__ = "new_group"
    new_group.__wrapped__ = original
    return new_group


_ORIGINAL: dict = {}


# ---- collectives: the same sequence on every rank of a group (rule 6; the signatures: course.collective_signatures)

_SIGNATURE_TAG = 0x4C4C5903  # the gloo tag of the signatures the members of a group exchange before a collective


class _Sequences:
    """This rank's count of the collectives it issued in each group since :func:`install`, the groups' members,
    and the calls in progress on this thread (an object collective's inner ones are part of it, not counted)."""

    def __init__(self):
        self.lock = threading.Lock()
        self.count: dict = {}  # group -> collectives issued
        self.members: dict = {}  # group -> (global ranks in group-rank order, this rank's group rank)
        self.local = threading.local()


_SEQUENCES = _Sequences()
# group -> {peer's group rank: (buffer, work)}: the receive this rank keeps posted for each peer's next signature.
# Posted ahead, a signature crosses in one hop (gloo's receiver otherwise first tells the sender it is ready).
# Kept across install/uninstall: a pooled rank's world group outlives a run, and every member of a group that
# ran through consumed as many signatures in it as the others; the entries of destroyed groups go at install.
_POSTED: dict = {}


def _check_sequence(name: str, a: dict, group) -> None:
    """Rule 6 for one collective call on ``group`` (a member): exchange its signature with the other members over
    gloo (a tag of its own, matched by order like the emulator's other messages) and compare them all."""
    seq = _SEQUENCES
    with seq.lock:
        if group not in seq.members:
            ranks = dist.get_process_group_ranks(group)
            seq.members[group] = (ranks, ranks.index(dist.get_rank()))
        members, mine = seq.members[group]
        n = seq.count[group] = seq.count.get(group, 0) + 1
    p = len(members)
    mine_sig = signatures.signature(name, a, p, group)
    sig = torch.tensor(mine_sig, dtype=torch.int64, device="cpu")  # this mode runs on gloo
    peers = [r for r in range(p) if r != mine]
    posted = _POSTED.setdefault(group, {})
    for r in peers:
        if r not in posted:
            posted[r] = _post(group, r, len(mine_sig))
    sends = [group.send([sig], r, _SIGNATURE_TAG) for r in peers]
    deadline = time.monotonic() + _timeout()
    rows, missing = {mine: mine_sig}, []
    for r in peers:
        buffer, work = posted[r]
        try:
            work.wait(datetime.timedelta(seconds=max(deadline - time.monotonic(), 0.001)))
        except Exception:  # noqa: BLE001 - a timeout says who never came; any other error (a peer died) is gloo's
            if deadline - time.monotonic() > 1.0:
                del posted[r]
                raise
            missing.append(members[r])  # (its receive stays posted: the peer may still send)
            continue
        rows[r] = buffer.tolist()
        posted[r] = _post(group, r, len(mine_sig))
    if missing:
        raise NcclRuleError(
            f"rank {dist.get_rank()} issues collective #{n} of group {_group_label(group)} (ranks {members}), "
            f"{signatures.describe(mine_sig, members)}, and waited {_timeout():.0f} s for rank(s) {missing} to issue "
            "theirs — a collective only some ranks of the group issue, or ranks that wait for each other in different "
            f"groups: NCCL would hang here. This rank's point-to-point streams:\n{_engine().report()}")
    for work in sends:
        work.wait()
    rows = [rows[r] for r in range(p)]
    found = signatures.mismatch(rows, members)
    if found is not None:
        raise NcclRuleError(signatures.mismatch_message(n, _group_label(group), members, rows, found))


def _post(group, peer: int, length: int) -> tuple:
    """Post this rank's receive of the next signature of group rank ``peer`` in ``group``: (buffer, work)."""
    buffer = torch.empty(length, dtype=torch.int64, device="cpu")  # a signature: host memory, over gloo
    return buffer, group.recv([buffer], peer, _SIGNATURE_TAG)


def _checked_collective(name, original):
    """``original`` (a collective of ``torch.distributed``) that first waits for the group's pending point-to-point
    operations (rule 1) and checks that every member issues the same call at the same place of the group's
    sequence (rule 6)."""
    import inspect

    signature = inspect.signature(original)

    def wrapper(*args, **kwargs):
        bound = signature.bind(*args, **kwargs)
        bound.apply_defaults()
        a = bound.arguments
        group = _group(a.get("group"))
        local = _SEQUENCES.local
        outermost = not getattr(local, "inside", False)
        if outermost:
            _engine().drain(group)
            if not c10d._rank_not_in_group(group) and group.size() > 1:
                _check_sequence(name, a, group)
        local.inside = True
        try:
            return original(*args, **kwargs)
        finally:
            local.inside = not outermost

    wrapper.__name__ = name
    wrapper.__wrapped__ = original
    return wrapper


def install() -> None:
    """Route this process's point-to-point operations through the emulator (idempotent).

    Called by :mod:`course.launch` in every rank when ``LLMSYS_NCCL_RULES=1``."""
    if _ORIGINAL:
        return
    global _CREATIONS, _SEQUENCES
    from torch.distributed import device_mesh

    _CREATIONS, _SEQUENCES = _Creations(), _Sequences()
    for group in [g for g in _POSTED if g not in c10d._world.pg_map]:  # destroyed since: their receives went too
        del _POSTED[group]
    replacements = {"isend": isend, "irecv": irecv, "send": send, "recv": recv, "batch_isend_irecv": batch_isend_irecv,
                    "new_group": _checked_new_group(c10d.new_group, split_on_gpus=False)}
    _ORIGINAL["device_mesh.new_group"] = device_mesh.new_group  # imported by name there: replaced there too
    device_mesh.new_group = _checked_new_group(c10d.new_group, split_on_gpus=True)
    for name in signatures.COLLECTIVES:
        replacements[name] = _checked_collective(name, getattr(c10d, name))
    for name, function in replacements.items():
        _ORIGINAL[name] = getattr(c10d, name)
        setattr(c10d, name, function)
        setattr(dist, name, function)
    # P2POp checks its op against the module's isend/irecv: accept the originals too.
    original_isend, original_irecv = _ORIGINAL["isend"], _ORIGINAL["irecv"]

    def check_op(op):
        if op not in (isend, irecv, original_isend, original_irecv):
            raise ValueError("Invalid ``op``. Expected ``op`` to be of type ``torch.distributed.isend`` or "
                             "``torch.distributed.irecv``.")
    _ORIGINAL["_check_op"] = c10d._check_op
    c10d._check_op = check_op


def uninstall() -> None:
    """Put ``torch.distributed`` back as it was (tests)."""
    global _ENGINE, _SEQUENCES
    mesh_new_group = _ORIGINAL.pop("device_mesh.new_group", None)
    if mesh_new_group is not None:
        from torch.distributed import device_mesh

        device_mesh.new_group = mesh_new_group
    for name, function in _ORIGINAL.items():
        setattr(c10d, name, function)
        if hasattr(dist, name) and not name.startswith("_"):
            setattr(dist, name, function)
    _ORIGINAL.clear()
    _ENGINE, _SEQUENCES = None, _Sequences()  # (it holds the run's groups)


def wait_all(timeout: float | None = None) -> None:
    """Wait until every point-to-point operation this rank issued is done (end of a worker)."""
    engine = _engine()
    deadline = time.monotonic() + (timeout if timeout is not None else _timeout())
    with engine.lock:
        units = {id(u): u for q in engine.streams.values() for u in q}
    for unit in units.values():
        _wait(unit, "the end of the worker", max(0.0, deadline - time.monotonic()))
