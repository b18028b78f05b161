"""PyTorch's flight recorder for a run: switched on, dumped by every rank as it ends (also on a timeout), read back.

The flight recorder (``torch/csrc/distributed/c10d/FlightRecorder.hpp``) keeps, in every process, a ring
buffer of the last ``TORCH_FR_BUFFER_SIZE`` operations its process groups were asked for (the older name
``TORCH_NCCL_TRACE_BUFFER_SIZE`` is the fallback; torch 2.13's default is 2000, 0 switches it off): for each
one the group (name and description), the **sequence number** of the collective in that group, the operation
(``gloo:all_reduce``), the tensors' sizes and dtypes, and where in Python it was called. It is read once, when
the process's first group forms: set the variable before the ranks start (:func:`switch_on`).

What is added here (docs/architecture.md, "The flight recorder"):

* :func:`launch_recorded` / :func:`recorded_worker` — a run whose every rank writes its records into
  ``run_dir/rank<r>.json`` when its worker ends, returned or raised: a rank whose collective times out
  (gloo raises after the group's ``collective_timeout``) dumps what it and its groups did before the error
  goes to the launcher. Only the records of this run are kept (the test suite's pooled ranks hold earlier
  runs' records too). A copy in torch's own format goes to ``run_dir/torch/rank_<r>`` for torch's analyser,
  ``python -m torch.distributed.flight_recorder.fr_trace run_dir/torch`` (``torchfrtrace``): torch's own records
  only, the collectives (it pairs sends and receives by NCCL's numbering, which the ones added below do not follow).
* **point-to-point on gloo.** Torch 2.13's gloo records collectives only; NCCL records sends and receives
  too (``nccl:send 0->1``, ``nccl:recv 1<-0``, numbered by ``p2p_seq_id`` per group). While a rank records,
  every send and receive of a host tensor (the ones gloo carries) is added to its records in NCCL's form
  (``gloo:send 0->1``), so the analysis reads one format on both back-ends. CUDA tensors are left to NCCL's
  own recorder.
* **the groups' members.** Gloo leaves the dump's ``pg_config`` empty; each rank writes its groups' global
  ranks and descriptions from ``torch.distributed``.
* **two recorders on GPUs.** A ``cpu:gloo,cuda:nccl`` group (the course's on GPUs) records its host-tensor
  operations in gloo's recorder and its CUDA ones in NCCL's, each numbering the group's collectives on its own;
  both are dumped, NCCL's under the group name ``<group>:nccl``.
* :func:`load_records` — every rank's dump as :class:`Record` s in the order the rank posted them.

Source: PyTorch's tutorial "Flight Recorder for Debugging Stuck Jobs" (pytorch.org/tutorials) and
``torch/distributed/flight_recorder/components/types.py`` (the fields, ``Op``'s names ``send a->b``/``recv b<-a``).
"""
from __future__ import annotations

import copy
import json
import os
import pickle
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch
import torch.distributed as dist
from torch.distributed import distributed_c10d as c10d

BUFFER_ENV = "TORCH_FR_BUFFER_SIZE"
LEGACY_BUFFER_ENV = "TORCH_NCCL_TRACE_BUFFER_SIZE"  # read when BUFFER_ENV is not set (torch < 2.6 knew only this)
DEFAULT_BUFFER = 2000  # torch 2.13's own default (FlightRecorder.hpp)
TORCH_DUMPS = "torch"  # run_dir/torch/rank_<r>: torch's pickle format, for torchfrtrace
_P2P = ("isend", "irecv", "send", "recv", "batch_isend_irecv")
# Frames of these files are the machinery, not the caller: the innermost frame outside them is "where".
_LIBRARY = ("/torch/", "/site-packages/", "/multiprocessing/", "course/flight_recorder.py", "course/nccl_rules.py",
            "course/launch", "threading.py")


def buffer_size(environ: dict | None = None) -> int:
    """The flight recorder's ring-buffer length in operations: ``TORCH_FR_BUFFER_SIZE``, else
    ``TORCH_NCCL_TRACE_BUFFER_SIZE``, else torch's default 2000 (0: switched off).

    Raises:
        ValueError: the variable is not a whole number.
    """
    environ = os.environ if environ is None else environ
    for name in (BUFFER_ENV, LEGACY_BUFFER_ENV):
        value = environ.get(name)
        if value not in (None, ""):
            try:
                return int(value)
            except ValueError:
                raise ValueError(f"{name}={value!r} must be a whole number of operations (e.g. 2000)") from None
    return DEFAULT_BUFFER


def switch_on(size: int = DEFAULT_BUFFER) -> int:
    """Switch the flight recorder on for the ranks this process starts from now on: sets
    ``TORCH_FR_BUFFER_SIZE`` to ``size`` unless one of the two variables is already set (kept as it is).
    Returns the size the ranks will use.

    Raises:
        ValueError: ``size`` < 1, or the environment already switches the recorder off (0) — unset the
            variable or give it a number of operations.
    """
    if not isinstance(size, int) or size < 1:
        raise ValueError(f"the flight recorder's buffer holds size >= 1 operations, not {size!r}")
    if not any(os.environ.get(n) for n in (BUFFER_ENV, LEGACY_BUFFER_ENV)):
        os.environ[BUFFER_ENV] = str(size)
    current = buffer_size()
    if current < 1:
        raise ValueError(f"the environment switches the flight recorder off ({BUFFER_ENV} or {LEGACY_BUFFER_ENV} "
                         f"= {current}); unset it or set it to a number of operations, e.g. {DEFAULT_BUFFER}")
    return current


# ---- reading back -------------------------------------------------------------------------------------------

COLLECTIVES_OF_UNEVEN_SIZES = {"all_to_all", "all_to_all_single", "all_to_allv", "gather", "scatter"}


@dataclass(frozen=True)
class Record:
    """One operation as one rank posted it (a flight-recorder entry, normalised).

    ``seq`` is the collective's sequence number in its group (1, 2, ... per group, the same on every member
    for the same collective) or, for a send or receive, the rank's own count of point-to-point operations in
    the group (``p2p_seq_id``: *not* comparable between ranks). ``index`` is the record's place in the rank's
    dump (0: the oldest kept). ``peer`` is the global rank a send goes to or a receive comes from.
    ``sizes`` are the input tensors' shapes (a receive: its buffer's), ``dtypes`` their dtypes."""

    rank: int
    index: int
    group: str
    group_desc: str
    group_ranks: tuple[int, ...]
    seq: int
    op: str
    is_p2p: bool = False
    peer: int | None = None
    sizes: tuple[tuple[int, ...], ...] = ()
    dtypes: tuple[str, ...] = ()
    where: str = ""
    state: str = ""

    @property
    def signature(self) -> tuple:
        """What must be equal on every member of a collective: the operation, and its sizes and dtypes (left out
        for collectives whose sizes differ between ranks by design, e.g. an all-to-all with uneven splits)."""
        if self.op in COLLECTIVES_OF_UNEVEN_SIZES:
            return (self.op,)
        return (self.op, self.sizes, self.dtypes)

    def describe(self) -> str:
        """``all_reduce [[8]] Float`` (``send to 1 [[4]] Float``), and ``at file:line in function`` when known."""
        sizes = "[" + ", ".join("[" + ", ".join(map(str, s)) + "]" for s in self.sizes) + "]"
        op = f"{self.op} {'to' if self.op == 'send' else 'from'} {self.peer}" if self.is_p2p else self.op
        text = f"{op} {sizes} {'/'.join(sorted(set(self.dtypes)))}".rstrip()
        return f"{text} at {self.where}" if self.where else text


def _where(frames: list[dict]) -> str:
    for f in frames or []:
        name = f.get("filename", "")
        if not any(part in name for part in _LIBRARY):
            return f"{name}:{f.get('line')} in {f.get('name')}"
    return ""


def _short_path(path: str) -> str:
    """A frame's file relative to the repository when it is inside it (committed dumps hold no machine path)."""
    root = str(Path(__file__).resolve().parent.parent) + os.sep
    return path[len(root):] if path.startswith(root) else path


def records_of(dump: dict) -> list[Record]:
    """The :class:`Record` s of one rank's course dump (the JSON of :func:`dump_records`), in posting order.

    Raises:
        ValueError: a dump without ``rank`` or ``entries`` (not written by this module).
    """
    if "rank" not in dump or "entries" not in dump:
        raise ValueError("not a course flight-recorder dump (no 'rank' or 'entries'); write it with "
                         "course.flight_recorder.dump_records")
    rank, config = int(dump["rank"]), dump.get("pg_config", {})
    out = []
    for index, e in enumerate(dump["entries"]):
        name, desc = e["process_group"]  # NCCL's records: "<group>:nccl" (see RECORDERS)
        ranks = tuple(json.loads(config.get(name.split(":")[0], {}).get("ranks", "[]")))
        backend, _, text = e["profiling_name"].partition(":")
        parts = text.split(" ")
        op, peer = parts[0], None
        if e.get("is_p2p") and len(parts) > 1:
            local = parts[1].split("->")[1] if op == "send" else parts[1].split("<-")[1]
            peer = ranks[int(local)] if ranks else int(local)
        sizes = e["output_sizes"] if op == "recv" else e["input_sizes"]
        dtypes = e["output_dtypes"] if op == "recv" else e["input_dtypes"]
        seq = e["p2p_seq_id"] if e.get("is_p2p") else e["collective_seq_id"]
        out.append(Record(rank, index, str(name), str(desc), ranks, int(seq), op, bool(e.get("is_p2p")), peer,
                          tuple(tuple(s) for s in sizes), tuple(dtypes), e.get("where", ""), e.get("state", "")))
    return out


def load_records(run_dir: str | Path) -> dict[int, list[Record]]:
    """``{rank: [Record, ...]}`` from every ``rank<r>.json`` in ``run_dir`` (ranks whose dump is missing are absent).

    Raises:
        FileNotFoundError: no folder, or no dump in it (was the run recorded? see :func:`launch_recorded`).
    """
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise FileNotFoundError(f"{run_dir} is not a folder of flight-recorder dumps")
    files = sorted(run_dir.glob("rank*.json"))
    if not files:
        raise FileNotFoundError(f"no rank<r>.json dump in {run_dir}: run the ranks with "
                                "course.flight_recorder.launch_recorded (or recorded_worker) to write them")
    found = {}
    for path in files:
        records = records_of(json.loads(path.read_text()))
        rank = int(json.loads(path.read_text())["rank"])
        found[rank] = records
    return dict(sorted(found.items()))


# ---- recording in a rank -------------------------------------------------------------------------------------

# Torch keeps one recorder per kind of back-end event (FlightRecorder<EventType>): gloo's (host tensors, read by
# _dump_fr_trace) and, in CUDA builds, NCCL's (CUDA tensors, _dump_nccl_trace). Each numbers the collectives of a
# group on its own — a "cpu:gloo,cuda:nccl" group has two sequences (seen on torch 2.11 + an H100: gloo's
# default_pg 1, 2, 3 and NCCL's 1, 2 in one process) —, so NCCL's records are kept under "<group>:nccl".
RECORDERS = {"gloo": "_dump_fr_trace", "nccl": "_dump_nccl_trace"}


def _torch_dump(recorder: str = "gloo") -> dict:
    """This process's flight-recorder buffer of one back-end as torch writes it (with the Python stacks); an empty
    one where torch has no such recorder (NCCL's in a CPU build)."""
    dump = getattr(torch._C._distributed_c10d, RECORDERS[recorder], None)
    if dump is None:
        return {"entries": []}
    return pickle.loads(dump(True, True, False))


def _group_table() -> dict[str, dict[str, str]]:
    """``{group name: {"name", "desc", "ranks"}}`` of the groups this rank holds (torch's ``pg_config`` form)."""
    table = {}
    for group, name in list(c10d._world.pg_names.items()):
        try:
            ranks = dist.get_process_group_ranks(group)
        except (RuntimeError, ValueError):
            continue
        desc = getattr(group, "group_desc", "") or ("default_pg" if group is c10d.GroupMember.WORLD else "undefined")
        table[str(name)] = {"name": str(name), "desc": desc, "ranks": json.dumps(sorted(ranks))}
    return table


class _P2PLog:
    """The sends and receives of host tensors this rank posts, as NCCL's recorder would write them."""

    def __init__(self):
        self.entries: list[dict] = []
        self.counts: dict[str, int] = {}
        self.original: dict[str, Callable] = {}
        self.inside = False  # torch's send calls isend (and recv irecv): one record per operation the caller posts

    def calls(self, kind: str, function: Callable, tensor, peer, group, group_peer, *rest, **options):
        if self.inside:
            return function(tensor, peer, group, *rest, **options)
        self.note(kind, tensor, peer, group, group_peer)
        self.inside = True
        try:
            return function(tensor, peer, group, *rest, **options)
        finally:
            self.inside = False

    def note(self, kind: str, tensor, peer, group, group_peer) -> None:
        try:
            self._note(kind, tensor, peer, group, group_peer)
        except (RuntimeError, ValueError, TypeError, KeyError):
            pass  # a call torch will refuse (a peer outside the group, ...): torch's own error is the one to see

    def _note(self, kind: str, tensor, peer, group, group_peer) -> None:
        if not isinstance(tensor, torch.Tensor) or tensor.device.type != "cpu":
            return  # CUDA tensors travel over NCCL, whose own recorder writes them
        group = c10d._group_or_default_group(group)
        name = str(c10d._world.pg_names.get(group, "?"))
        if group_peer is None:
            group_peer = dist.get_group_rank(group, peer) if group is not c10d.GroupMember.WORLD else peer
        me = dist.get_rank(group)
        self.counts[name] = self.counts.get(name, 0) + 1
        size, dtype = [list(tensor.shape)], [_dtype_name(tensor.dtype)]
        frames = [{"name": f.name, "filename": f.filename, "line": f.lineno} for f in _stack()]
        self.entries.append({
            "process_group": [name, getattr(group, "group_desc", "") or "undefined"],
            "profiling_name": f"gloo:{kind} {me}->{group_peer}" if kind == "send" else f"gloo:{kind} {me}<-{group_peer}",
            "collective_seq_id": 0, "p2p_seq_id": self.counts[name], "op_id": 0, "is_p2p": True,
            "input_sizes": size if kind == "send" else [], "input_dtypes": dtype if kind == "send" else [],
            "output_sizes": size if kind == "recv" else [], "output_dtypes": dtype if kind == "recv" else [],
            "time_created_ns": time.time_ns(), "state": "scheduled", "retired": False, "timeout_ms": 0,
            "frames": frames, "source": "course",
        })

    def install(self) -> None:
        self.original = {name: getattr(dist, name) for name in _P2P}
        original = self.original
        log = self

        def isend(tensor, dst=None, group=None, tag=0, group_dst=None):
            return log.calls("send", original["isend"], tensor, dst, group, group_dst, tag, group_dst=group_dst)

        def irecv(tensor, src=None, group=None, tag=0, group_src=None):
            return log.calls("recv", original["irecv"], tensor, src, group, group_src, tag, group_src=group_src)

        def send(tensor, dst=None, group=None, tag=0, group_dst=None):
            return log.calls("send", original["send"], tensor, dst, group, group_dst, tag, group_dst=group_dst)

        def recv(tensor, src=None, group=None, tag=0, group_src=None):
            return log.calls("recv", original["recv"], tensor, src, group, group_src, tag, group_src=group_src)

        def batch_isend_irecv(p2p_op_list):
            if log.inside:
                return original["batch_isend_irecv"](p2p_op_list)
            ops = []
            for p in p2p_op_list:
                kind = "send" if getattr(p.op, "__name__", "") == "isend" else "recv"
                log.note(kind, p.tensor, p.peer, p.group, getattr(p, "group_peer", None))
                op = original["isend"] if kind == "send" else original["irecv"]
                ops.append(dist.P2POp(op, p.tensor, p.peer, p.group, p.tag) if p.peer is not None
                           else dist.P2POp(op, p.tensor, None, p.group, p.tag, group_peer=p.group_peer))
            log.inside = True
            try:
                return original["batch_isend_irecv"](ops)
            finally:
                log.inside = False

        replacements = {"isend": isend, "irecv": irecv, "send": send, "recv": recv,
                        "batch_isend_irecv": batch_isend_irecv}
        for name, function in replacements.items():  # torch.distributed's names only: torch's own code compares
            function.__wrapped__ = original[name]     # ops with distributed_c10d's isend/irecv (batch_isend_irecv)
            setattr(dist, name, function)
        self.original["_check_op"] = c10d._check_op
        check = self.original["_check_op"]

        def check_op(op):  # P2POp checks its op against the module's isend/irecv: accept these and the ones they wrap
            if op not in (isend, irecv, original["isend"], original["irecv"]):
                check(op)
        c10d._check_op = check_op

    def uninstall(self) -> None:
        for name, function in self.original.items():
            setattr(c10d if name.startswith("_") else dist, name, function)
        self.original = {}


def _stack():
    import traceback

    return list(reversed(traceback.extract_stack()[:-2]))  # innermost first, as torch writes frames


def _dtype_name(dtype) -> str:
    return {torch.float32: "Float", torch.float64: "Double", torch.float16: "Half", torch.bfloat16: "BFloat16",
            torch.int64: "Long", torch.int32: "Int", torch.int8: "Char", torch.uint8: "Byte",
            torch.bool: "Bool"}.get(dtype, str(dtype).replace("torch.", ""))


@dataclass
class Recording:
    """Record this rank's operations into ``run_dir`` while the ``with`` block runs (see the module docstring).

    On leaving the block — returned or raised — the rank writes ``run_dir/rank<r>.json`` (the course's form:
    torch's entry fields, the groups' members, ``where`` each operation was called) and
    ``run_dir/torch/rank_<r>`` (torch's pickle form, for torchfrtrace). Exceptions pass through."""

    run_dir: Path
    rank: int
    world_size: int
    start: dict = field(default_factory=dict)
    p2p: _P2PLog = field(default_factory=_P2PLog)
    previous_sigterm: Any = None

    def __enter__(self) -> "Recording":
        Path(self.run_dir, TORCH_DUMPS).mkdir(parents=True, exist_ok=True)
        for recorder in RECORDERS:  # the records of earlier runs in this process stay out
            ids = [e["record_id"] for e in _torch_dump(recorder).get("entries", [])]
            self.start[recorder] = max(ids) + 1 if ids else 0
        self.p2p.install()
        # The launcher stops the ranks still running once one has failed (SIGTERM, then SIGKILL 5 s later): a rank
        # that waits in Python code (the NCCL-rules emulator) then leaves through __exit__ and dumps. A rank blocked
        # inside gloo runs the handler when its own collective times out.
        self.previous_sigterm = signal.signal(signal.SIGTERM, _stopped)
        return self

    def __exit__(self, kind, value, traceback) -> None:
        previous = self.previous_sigterm
        signal.signal(signal.SIGTERM, previous if previous is not None else signal.SIG_DFL)
        self.p2p.uninstall()
        dump_records(self.run_dir, self.rank, self.world_size, self.start, self.p2p.entries)
        if isinstance(value, StoppedByLauncher) and callable(previous):
            previous(signal.SIGTERM, None)  # under torchrun: leave quietly, as course.launch makes a stopped rank do


class StoppedByLauncher(RuntimeError):
    """The launcher stopped this rank (SIGTERM) after another rank failed."""


def _stopped(signum, frame):
    raise StoppedByLauncher("stopped by the launcher (SIGTERM) after another rank failed")


def dump_records(run_dir: str | Path, rank: int, world_size: int, since: dict | None = None,
                 p2p_entries: list[dict] | None = None) -> Path:
    """Write this rank's flight-recorder records — of each back-end's recorder, those with ``record_id >=
    since[recorder]`` (default 0), and ``p2p_entries``, merged in the order they were posted — to
    ``run_dir/rank<rank>.json``, and torch's own records to ``run_dir/torch/rank_<rank>`` (gloo's) and
    ``run_dir/torch_nccl/rank_<rank>`` (NCCL's, where there are any); returns the first path. Files are written to
    a temporary name and renamed."""
    run_dir, since = Path(run_dir), since or {}
    config = _group_table()
    entries, version, status = [], "2.10", {}
    for recorder in RECORDERS:
        raw = _torch_dump(recorder)
        kept = [dict(e, source=f"torch:{recorder}") for e in raw.get("entries", [])
                if e["record_id"] >= since.get(recorder, 0)]
        version, status = raw.get("version", version), raw.get("pg_status", status)
        # torch's analyser gets torch's own records only, one back-end per folder: it pairs point-to-point entries by
        # NCCL's numbering (collective_seq_id, op_id, coalesced groups), which the sends and receives added here do
        # not follow, and one group's two sequences would collide
        if kept or recorder == "gloo":
            folder = run_dir / (TORCH_DUMPS if recorder == "gloo" else f"{TORCH_DUMPS}_{recorder}")
            folder.mkdir(parents=True, exist_ok=True)
            _write(folder / f"rank_{rank}", pickle.dumps({
                "version": version, "comm_lib_version": raw.get("comm_lib_version", ""), "pg_config": config,
                "pg_status": status, "entries": copy.deepcopy(kept)}))
        if recorder != "gloo":
            for e in kept:
                e["process_group"] = [f"{e['process_group'][0]}:{recorder}", e["process_group"][1]]
        entries += kept
    entries += [dict(e) for e in (p2p_entries or [])]
    entries.sort(key=lambda e: e["time_created_ns"])  # one thread, one clock: the order the rank posted them
    for i, e in enumerate(entries):
        e["record_id"] = i
        frames = e.pop("frames", [])
        e["where"] = _where([dict(f, filename=_short_path(f["filename"])) for f in frames])
    course_form = {"rank": rank, "world_size": world_size, "version": version, "buffer_size": buffer_size(),
                   "pg_config": config, "entries": entries}
    _write(run_dir / f"rank{rank}.json", json.dumps(course_form, indent=1, sort_keys=True).encode())
    return run_dir / f"rank{rank}.json"


def _write(path: Path, data: bytes) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def recorded_worker(rank: int, world_size: int, run_dir: str, worker: Callable[..., Any], *args: Any) -> Any:
    """``worker(rank, world_size, *args)`` with this rank's operations recorded into ``run_dir`` (:class:`Recording`);
    a worker for :func:`course.launch.launch`."""
    with Recording(Path(run_dir), rank, world_size):
        return worker(rank, world_size, *args)


def launch_recorded(worker: Callable[..., Any], world_size: int, *args: Any, run_dir: str | Path,
                    **options: Any) -> dict[int, Any]:
    """:func:`course.launch.launch` with the flight recorder on (:func:`switch_on`) and every rank's records
    written to ``run_dir`` as it ends (:func:`recorded_worker`). ``options`` are :func:`course.launch.launch`'s
    (``timeout``, ``collective_timeout``: the time after which a rank stuck in a collective raises and dumps).

    Raises:
        ValueError: as :func:`switch_on`, or a ``run_dir`` that holds dumps of another run (choose an empty one).
        course.launch.RankFailure: a rank failed (as :func:`course.launch.launch`); its message ends with where the
            dumps are.
    """
    from course.launch import RankFailure, launch

    run_dir = Path(run_dir)
    if run_dir.is_dir() and any(run_dir.glob("rank*.json")):
        raise ValueError(f"{run_dir} already holds flight-recorder dumps; give each run a folder of its own")
    switch_on()
    run_dir.mkdir(parents=True, exist_ok=True)
    try:
        return launch(recorded_worker, world_size, str(run_dir.resolve()), worker, *args, **options)
    except RankFailure as exc:
        dumped = sorted(int(p.stem[4:]) for p in run_dir.glob("rank*.json"))
        raise RankFailure(exc.rank, f"{exc}\nflight recorder: the dumps of ranks {dumped} are in {run_dir}") from exc
