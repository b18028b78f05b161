"""A Chrome / Perfetto trace (``chrome://tracing``, https://ui.perfetto.dev) of every rank's actions.

Built from the results files of a 3D run (:mod:`three_d.training`): each rank's timeline of
the epoch's last batch (forward ``F`` and backward ``B`` of every micro-batch) becomes one
trace process named by the rank's mesh coordinates, its events "complete" events (``"ph": "X"``,
microseconds) on a clock shared by all ranks (each pp group's origin is put back): F/B on the
thread "compute" (tid 0), the rank's communication of the same batch (``comm_timeline``: tp
all-reduces and all-gathers, pp sends and receives, the dp gradient all-reduce, the tied
all-reduce, named ``"<kind> <group>"`` with the bytes in ``args``) on the thread
"communication" (tid 1).

Source: Trace Event Format (Google, "Trace Event Format" document: ``X`` and ``M`` events).
"""
from __future__ import annotations

import json
from pathlib import Path


def chrome_trace(results: dict[int, dict]) -> dict:
    """``{"traceEvents": [...]}`` from ``{rank: results file contents}``."""
    origins = [r.get("time_origin", 0.0) for r in results.values()]
    base = min(origins) if origins else 0.0
    events = []
    for rank, r in sorted(results.items()):
        c = r.get("coordinates", {})
        name = f"rank {rank} (pp {c.get('pp')}, dp {c.get('dp')}, tp {c.get('tp')})"
        events.append({"name": "process_name", "ph": "M", "pid": rank, "args": {"name": name}})
        events.append({"name": "process_sort_index", "ph": "M", "pid": rank, "args": {"sort_index": rank}})
        for tid, thread in enumerate(("compute", "communication")):
            events.append({"name": "thread_name", "ph": "M", "pid": rank, "tid": tid, "args": {"name": thread}})
        shift = r.get("time_origin", 0.0) - base
        for e in r.get("timeline", []):
            events.append({"name": f"{e['kind']}{e['micro_batch']}", "cat": "forward" if e["kind"] == "F" else "backward",
                           "ph": "X", "pid": rank, "tid": 0, "ts": (e["start"] + shift) * 1e6,
                           "dur": (e["end"] - e["start"]) * 1e6, "args": {"micro_batch": e["micro_batch"]}})
        for e in r.get("comm_timeline", []):
            events.append({"name": f"{e['kind']} {e['group']}", "cat": "communication", "ph": "X", "pid": rank,
                           "tid": 1, "ts": (e["start"] + shift) * 1e6, "dur": (e["end"] - e["start"]) * 1e6,
                           "args": {"kind": e["kind"], "group": e["group"], "bytes": e["bytes"]}})
    timers = sorted({r["timer"] for r in results.values() if r.get("timer")})  # course.measure: which clock
    return {"traceEvents": events, "displayTimeUnit": "ms", "otherData": {"timer": ", ".join(timers) or "unknown"}}


def write_chrome_trace(workdir: str, epoch: int, world_size: int, path: str, prefix: str = "three_d_") -> str:
    """Read ``{workdir}/{prefix}rank{r}_results_epoch{epoch}.json`` of every rank, write the trace to ``path``."""
    results = {}
    for rank in range(world_size):
        f = Path(workdir) / f"{prefix}rank{rank}_results_epoch{epoch}.json"
        results[rank] = json.loads(f.read_text())
    Path(path).write_text(json.dumps(chrome_trace(results)))
    return path


CATEGORIES = ("forward", "backward", "tp collectives", "pp send/recv", "dp all-reduce", "tied all-reduce",
              "other communication", "idle")


def comm_category(kind: str, group: str) -> str:
    """Which of :data:`CATEGORIES` a communication call of ``kind`` in ``group`` counts as."""
    if group == "tp":
        return "tp collectives"
    if kind in ("send", "recv"):
        return "pp send/recv"
    if group == "dp":
        return "dp all-reduce"
    if group == "embedding":
        return "tied all-reduce"
    return "other communication"  # the global norm's pp all-reduce, ...


def time_breakdown(events: list, comm: list, start: float, end: float) -> dict[str, float]:
    """Where one rank's step went: seconds per :data:`CATEGORIES`, summing to ``end - start``.

    Args:
        events: the rank's ``(kind, micro_batch, start, end)`` forwards ("F") and backwards ("B").
        comm: its ``(kind, group, start, end)`` communication calls (same clock, seconds).
        start, end: the step's span.

    Every instant of the step counts once, for the first that covers it of: a communication call
    (the tp all-reduces run *inside* a forward or backward and are taken out of it), a forward,
    a backward; an instant covered by none is idle (waiting with nothing posted, or Python
    between calls).
    """
    spans = [(a, b, comm_category(kind, group)) for kind, group, a, b in comm]
    spans += [(a, b, "forward" if kind == "F" else "backward") for kind, _, a, b in events]
    first = [*CATEGORIES[2:-1], "forward", "backward"]  # communication before computation
    rank = {c: i for i, c in enumerate(first)}
    cuts = sorted({start, end, *(min(max(t, start), end) for a, b, _ in spans for t in (a, b))})
    out = dict.fromkeys(CATEGORIES, 0.0)
    for lo, hi in zip(cuts, cuts[1:]):
        mid = (lo + hi) / 2
        covering = [c for a, b, c in spans if a <= mid < b]
        out[min(covering, key=rank.get) if covering else "idle"] += hi - lo
    return out
