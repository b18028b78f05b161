"""The one event recorder: what a rank did, as spans on one clock, and the Chrome / Perfetto trace of a run.

A :class:`Span` is one piece of a rank's work: a name, a **row** (the kind of work, :data:`ROWS`), its
start and end on the clock of :func:`course.measure.now` (the wall clock in seconds, read after the
device's queued work has run, so a span on a GPU is the work to its completion), and arguments. Spans
are added, while a :class:`Recorder` is active (``with recording(Recorder(device)) as rec:``), by:

* ``pipeline.StageRunner``: the forward ``F``, backward ``B`` and weight-gradient ``W`` of every
  micro-batch and chunk (row ``compute``; args ``kind``, ``micro_batch``, ``chunk``, ``cpu_s``);
* :mod:`course.collectives`: every counted collective and send/recv (row ``communication``; name
  ``"<kind> <group>"``, args ``kind``, ``group``, ``bytes``, ``traffic_bytes``, ``peer``, ``scope``,
  ``phase``);
* every ``torch.optim`` optimizer's ``step()`` (row ``compute``, name ``optimizer``: torch's global
  optimizer-step hooks, installed while a recorder is active), the forward and backward of
  :func:`course.epoch_runner.supervised_step` and its gradient synchronisation (``gradient sync``, row
  ``communication``);
* :func:`course.epoch_runner.run_epochs`: each training step (row ``step``), the evaluation (row
  ``evaluation``) and each checkpoint written or loaded (row ``checkpoint``).

With no recorder active nothing is read and nothing kept (:func:`clock` returns None, so the
collectives do not synchronise a GPU for a clock nobody reads). Several recorders may be active at once
(a run's, and a training mode's own recorder of its last step); each gets every span.

A run's trace (``--trace FILE``, :func:`write_run_trace`): every rank's spans are gathered to rank 0,
which writes one JSON file in the Trace Event Format (Google, "Trace Event Format": complete events
``"ph": "X"`` with ``ts``/``dur`` in microseconds, metadata ``"ph": "M"``) that ``chrome://tracing`` and
https://ui.perfetto.dev load: one process per rank named by its mesh coordinates, one thread (row) per
kind of work, times in microseconds since the run's first span. With ``--profile`` the rank's
``torch.profiler`` events (:mod:`course.profiler`) are put in the same process, on the same clock.

:func:`time_breakdown` cuts a step into categories (every instant counted once).
"""
from __future__ import annotations

import contextlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Sequence

import torch

from course.measure import now, timer_name

ROWS = ("compute", "communication", "step", "evaluation", "checkpoint")  # a trace thread each, in this order


@dataclass
class Span:
    """One piece of work of one rank: ``start``/``end`` in seconds on :func:`course.measure.now`'s clock."""

    name: str
    row: str
    start: float
    end: float
    args: dict = field(default_factory=dict)

    def as_dict(self) -> dict:
        """``{"name", "row", "start", "end", "args"}`` (what results files, workers and traces hold)."""
        return {"name": self.name, "row": self.row, "start": self.start, "end": self.end, "args": dict(self.args)}


class Recorder:
    """Keeps the spans of one rank while active (:func:`recording`).

    Args:
        device: the rank's device: spans this recorder times itself (:meth:`span`, optimizer steps)
            read :func:`course.measure.now` on it.
        max_steps: keep the spans of the last ``max_steps`` training steps only (a step begins at
            :func:`step`); spans outside any step (evaluation, checkpoints) are all kept. None: keep all.

    Attributes:
        timer: the clock's name (:func:`course.measure.timer_name`).
    """

    def __init__(self, device=None, *, max_steps: int | None = None):
        if max_steps is not None and max_steps < 1:
            raise ValueError(f"max_steps must be >= 1 (training steps kept), not {max_steps}")
        self.device = None if device is None else torch.device(device)
        self.max_steps = max_steps
        self.timer = timer_name(self.device)
        self._steps: dict[int | None, list[Span]] = {None: []}
        self._step: int | None = None

    # ---- adding ---------------------------------------------------------------------------------
    def add(self, span: Span) -> Span:
        self._steps.setdefault(self._step, []).append(span)
        return span

    def begin_step(self, index: int) -> None:
        """Spans from now on belong to training step ``index`` (the oldest steps beyond ``max_steps`` go)."""
        self._step = index
        self._steps.setdefault(index, [])
        if self.max_steps is not None:
            steps = [s for s in self._steps if s is not None]
            for old in steps[:max(0, len(steps) - self.max_steps)]:
                del self._steps[old]

    def end_step(self) -> None:
        self._step = None

    @contextlib.contextmanager
    def span(self, name: str, row: str, **args):
        """Time the ``with`` block on this recorder's device and keep it as a span (yields the args dict,
        which the block may fill in)."""
        start = now(self.device)
        try:
            yield args
        finally:
            self.add(Span(name, row, start, now(self.device), args))

    # ---- reading --------------------------------------------------------------------------------
    @property
    def spans(self) -> list[Span]:
        """Every kept span, by start time."""
        return sorted((s for kept in self._steps.values() for s in kept), key=lambda s: s.start)

    def select(self, row: str | None = None, **args) -> list[Span]:
        """The kept spans of ``row`` (None: any) whose args hold every ``args`` item."""
        return [s for s in self.spans if (row is None or s.row == row)
                and all(s.args.get(k) == v for k, v in args.items())]

    def clear(self) -> None:
        self._steps, self._step = {None: []}, None

    def export(self) -> list[dict]:
        """The kept spans as dicts (:meth:`Span.as_dict`), by start time."""
        return [s.as_dict() for s in self.spans]


# ---- the active recorders ----------------------------------------------------------------------

_ACTIVE: list[Recorder] = []
_OPTIMIZER: dict = {"hooks": None, "open": []}


def active() -> bool:
    """Whether any recorder is active (spans are being kept)."""
    return bool(_ACTIVE)


def _optimizer_pre(optimizer, args, kwargs) -> None:
    _OPTIMIZER["open"].append(clock(_ACTIVE[-1].device) if _ACTIVE else None)


def _optimizer_post(optimizer, args, kwargs) -> None:
    start = _OPTIMIZER["open"].pop() if _OPTIMIZER["open"] else None
    if start is not None and not _OPTIMIZER["open"]:  # the outermost step only (ZeRO wraps an optimizer)
        record("optimizer", "compute", start, now(_ACTIVE[-1].device) if _ACTIVE else start,
               optimizer=type(optimizer).__name__)


@contextlib.contextmanager
def recording(recorder: Recorder):
    """Make ``recorder`` active in the ``with`` block (it gets every span added meanwhile); yields it."""
    from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

    if _OPTIMIZER["hooks"] is None:
        _OPTIMIZER["hooks"] = (register_optimizer_step_pre_hook(_optimizer_pre),
                               register_optimizer_step_post_hook(_optimizer_post))
    _ACTIVE.append(recorder)
    try:
        yield recorder
    finally:
        _ACTIVE.remove(recorder)
        if not _ACTIVE:
            for handle in _OPTIMIZER["hooks"]:
                handle.remove()
            _OPTIMIZER["hooks"], _OPTIMIZER["open"] = None, []


def clock(device=None) -> float | None:
    """:func:`course.measure.now` on ``device`` while a recorder is active, else None (no clock read, no GPU
    synchronised): the start of a span that :func:`record` ends."""
    return now(device) if _ACTIVE else None


def add(span: Span) -> Span:
    """Give ``span`` to every active recorder; returns it."""
    for recorder in _ACTIVE:
        recorder.add(span)
    return span


def record(name: str, row: str, start: float, end: float, **args) -> Span:
    """A span from ``start`` to ``end`` (seconds on :func:`course.measure.now`'s clock), given to every
    active recorder; returns it (made even with none active: the stage runner keeps its own)."""
    return add(Span(name, row, start, end, args))


@contextlib.contextmanager
def span(name: str, row: str, device=None, **args):
    """Time the ``with`` block as a span for every active recorder (``device``: whose queued work the clock
    waits for; default the innermost recorder's). Does nothing — no clock read — with none active."""
    if not _ACTIVE:
        yield args
        return
    device = _ACTIVE[-1].device if device is None else device
    start = now(device)
    try:
        yield args
    finally:
        record(name, row, start, now(device), **args)


@contextlib.contextmanager
def step(index: int, device=None):
    """Training step ``index``: a span on the row ``step`` for every active recorder, which from then on
    counts the spans as this step's (:class:`Recorder` ``max_steps``)."""
    if not _ACTIVE:
        yield
        return
    for recorder in _ACTIVE:
        recorder.begin_step(index)
    try:
        with span(f"step {index}", "step", device, step=index):
            yield
    finally:
        for recorder in _ACTIVE:
            recorder.end_step()


# ---- what a step's time went to ----------------------------------------------------------------------

def _get(s, key):
    return s[key] if isinstance(s, dict) else getattr(s, key)


def communication_seconds_by_group(spans: Iterable) -> dict[str, float]:
    """``{group name: seconds}``: the summed duration of the ``communication`` spans per group — the time a
    rank spent inside communication calls, waiting for its peers included (an ``isend``'s span is its
    posting only). ``spans``: a :class:`Recorder`'s spans or their dicts."""
    out: dict[str, float] = {}
    for s in spans:
        if _get(s, "row") == "communication":
            group = _get(s, "args").get("group", "world")
            out[group] = out.get(group, 0.0) + _get(s, "end") - _get(s, "start")
    return out


def time_breakdown(spans: Iterable, start: float, end: float, category: Callable[[object], str | None],
                   order: Sequence[str]) -> dict[str, float]:
    """Seconds of ``[start, end]`` per category, every instant counted once, summing to ``end - start``.

    Args:
        spans: :class:`Span` objects or their dicts, on one clock.
        category: a span's category (one of ``order``), or None to leave the span out.
        order: the categories, first wins: an instant covered by spans of several categories counts for
            the first of them in ``order`` (e.g. communication before the computation it runs inside);
            an instant covered by none counts as ``"idle"``.

    Returns:
        ``{category: seconds}`` for every category of ``order`` and ``"idle"``.
    """
    rank = {c: i for i, c in enumerate(order)}
    cut = []
    for s in spans:
        c = category(s)
        if c is None:
            continue
        if c not in rank:
            raise ValueError(f"category {c!r} is not one of {list(order)}")
        cut.append((_get(s, "start"), _get(s, "end"), c))
    times = sorted({start, end, *(min(max(t, start), end) for a, b, _ in cut for t in (a, b))})
    out = dict.fromkeys((*order, "idle"), 0.0)
    for lo, hi in zip(times, times[1:]):
        mid = (lo + hi) / 2
        covering = [c for a, b, c in cut if a <= mid < b]
        out[min(covering, key=rank.get) if covering else "idle"] += hi - lo
    return out


# ---- the Chrome / Perfetto trace -------------------------------------------------------------------

def process_name(rank: int, mesh=None) -> str:
    """``"rank 3 (pp 1, dp 0, tp 1)"``: a rank by its mesh coordinates (``cp``/``ep`` too when they are > 1);
    ``"rank 3"`` without a mesh."""
    if mesh is None:
        return f"rank {rank}"
    d = mesh.dims
    parts = [f"pp {mesh.stage}", f"dp {mesh.dp_rank}"]
    if d.cp > 1:
        parts.append(f"cp {mesh.cp_rank}")
    parts.append(f"tp {mesh.tp_rank}")
    if d.ep > 1:
        parts.append(f"ep {mesh.ep_rank}")
    return f"rank {rank} ({', '.join(parts)})"


def _rows(spans: list[dict]) -> dict[str, int]:
    extra = sorted({s["row"] for s in spans} - set(ROWS))
    return {row: tid for tid, row in enumerate((*ROWS, *extra))}


def chrome_trace(ranks: list[dict]) -> dict:
    """The Trace Event Format object ``{"traceEvents": [...], ...}`` of several ranks.

    Args:
        ranks: per rank ``{"rank": int, "name": process name, "spans": [span dicts], "timer": clock name,
            "profile": optional torch.profiler trace (the JSON object, :mod:`course.profiler`)}``.

    Every rank is a process (pid = rank) named ``name``, every row a thread; times are microseconds
    since the earliest span of any rank (``otherData.time_origin_unix_s`` says when that was).
    """
    starts = [s["start"] for r in ranks for s in r["spans"]]
    origin = min(starts) if starts else 0.0
    events: list[dict] = []
    for r in sorted(ranks, key=lambda r: r["rank"]):
        pid, spans = r["rank"], r["spans"]
        events.append({"name": "process_name", "ph": "M", "pid": pid, "tid": 0, "args": {"name": r["name"]}})
        events.append({"name": "process_sort_index", "ph": "M", "pid": pid, "tid": 0, "args": {"sort_index": pid}})
        rows = _rows(spans)
        for row, tid in rows.items():
            if any(s["row"] == row for s in spans) or row in ROWS[:2]:
                events.append({"name": "thread_name", "ph": "M", "pid": pid, "tid": tid, "args": {"name": row}})
        for s in spans:
            events.append({"name": s["name"], "cat": s["row"], "ph": "X", "pid": pid, "tid": rows[s["row"]],
                           "ts": (s["start"] - origin) * 1e6, "dur": max(0.0, s["end"] - s["start"]) * 1e6,
                           "args": s["args"]})
        if r.get("profile"):
            from course.profiler import profile_trace_events

            events += profile_trace_events(r["profile"], pid, origin, first_tid=len(rows))
    timers = sorted({r["timer"] for r in ranks if r.get("timer")})
    return {"traceEvents": events, "displayTimeUnit": "ms",
            "otherData": {"timer": ", ".join(timers) or "unknown", "time_origin_unix_s": origin,
                          "source": "course.trace (docs/architecture.md, 'The event recorder')"}}


def write_chrome_trace(path, ranks: list[dict]) -> Path:
    """Write :func:`chrome_trace` of ``ranks`` to ``path`` (compact JSON, atomically: no half-written trace is
    ever read); returns the path."""
    import os

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(chrome_trace(ranks), separators=(",", ":")))
    os.replace(tmp, path)
    return path


def write_run_trace(recorder: Recorder, path, *, rank: int, name: str, group=None, profile=None) -> Path | None:
    """Every rank's spans to the global rank 0 of ``group`` (None: this process alone), which writes the
    trace to ``path``. Collective over ``group`` (pickled objects: the host's gloo back-end).

    Args:
        recorder: this rank's recorder.
        name: this rank's process name (:func:`process_name`).
        profile: this rank's torch.profiler trace file, put into its process (or None).

    Returns:
        ``path`` on the rank that wrote it, else None.
    """
    import torch.distributed as dist

    mine = {"rank": rank, "name": name, "spans": recorder.export(), "timer": recorder.timer}
    if profile is not None and Path(profile).is_file():
        mine["profile"] = json.loads(Path(profile).read_text())
    if not dist.is_initialized() or dist.get_world_size(group) == 1:
        return write_chrome_trace(path, [mine])
    writer = 0 if group is None else dist.get_global_rank(group, 0)
    everyone = [None] * dist.get_world_size(group) if rank == writer else None
    dist.gather_object(mine, everyone, dst=writer, group=group)
    if rank != writer:
        return None
    return write_chrome_trace(path, everyone)
