"""The one answer check of the notebooks' exercises: compare, say right or not yet, give a hint.

A part's ``checks.py`` (e.g. ``data_parallel/labs/checks.py``) works out each exercise's value from its formulas and
calls :func:`report` with the learner's answer.
"""
from __future__ import annotations

import math


def report(name: str, answer, expected, hint: str, rel: float = 1e-6, abs_tol: float = 1e-9) -> bool:
    """Print ``"<name>: right (answer)"`` or ``"<name>: not yet (answer) — hint: <hint>"``; return whether
    ``answer`` is within ``rel`` (relative) or ``abs_tol`` of ``expected`` — or, for a tuple ``expected``
    (an order, a shape), equal to it. A missing or non-numeric answer (e.g. None) is "not yet", never an
    error."""
    try:
        ok = (answer == expected if isinstance(expected, tuple)
              else math.isclose(float(answer), float(expected), rel_tol=rel, abs_tol=abs_tol))
    except (TypeError, ValueError):
        ok = False
    print(f"{name}: {'right' if ok else 'not yet'} ({answer!r})" + ("" if ok else f" — hint: {hint}"))
    return ok
