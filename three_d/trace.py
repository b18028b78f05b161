"""Where a 3D step's time goes: the 3D categories of the course's event recorder's spans.

The spans themselves — every rank's forwards and backwards and its communication, on one clock —
and the Chrome / Perfetto trace of a run (``project/run_3d.py --trace FILE``) are the course's
event recorder's (:mod:`course.trace`). What is 3D-specific is how a step's time divides: the
communication of the tp group (all-reduces and all-gathers inside the forward and backward
passes), the pipeline's sends and receives, the dp gradient all-reduce and the tied embedding
all-reduce, against computation and idle time (:func:`time_breakdown`).
"""
from __future__ import annotations

from course.trace import time_breakdown as _breakdown

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


def category(span: dict) -> str | None:
    """A span's category (:data:`CATEGORIES`): a communication span by :func:`comm_category`, a forward
    (``F``) or backward (``B``, ``W``) of the stage runner by its kind; None for the others (steps,
    optimizer, evaluation)."""
    args = span["args"]
    if span["row"] == "communication":
        return comm_category(args["kind"], args["group"])
    if span["row"] == "compute" and args.get("kind") in ("F", "B", "W"):
        return "forward" if args["kind"] == "F" else "backward"
    return None


def time_breakdown(spans: list[dict], start: float, end: float) -> dict[str, float]:
    """Where one rank's step went: seconds per :data:`CATEGORIES`, summing to ``end - start``.

    Args:
        spans: the rank's spans of the step (:meth:`course.trace.Span.as_dict`, one clock).
        start, end: the step's span.

    Every instant of the step counts once, for the first that covers it of: a communication call
    (the tp all-reduces run *inside* a forward or backward and are taken out of it), a forward,
    a backward; an instant covered by none is idle (waiting with nothing posted, or Python
    between calls) — :func:`course.trace.time_breakdown` with these categories.
    """
    first = [*CATEGORIES[2:-1], "forward", "backward"]  # communication before computation
    out = _breakdown(spans, start, end, category, first)
    return {c: out[c] for c in CATEGORIES}
