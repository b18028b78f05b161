"""Launching ranks from graded tests: once per worker and arguments, with a short collective timeout,
and a failed launch remembered.

Many graded tests read their cases from one launch. Before, a launch that failed was started
again by every test that needed it: a student's deadlocked ring all-reduce cost 7 launches of
a 30 s collective timeout (266 s) before the key's tests were done. Here a launch runs at most
once per test session; the tests after a failed one fail at once with the same rank's error.

:data:`GRADED_COLLECTIVE_TIMEOUT` bounds every wait of a graded launch: a rank blocked that long
in a collective or point-to-point call raises, and the launcher names the ranks that never
arrived (``course.launch``). A test's own ranks exchange a few small tensors, so no honest wait
comes near it; a deadlock fails the key's first test in well under 30 s.
"""
from __future__ import annotations

from typing import Any, Callable

from course.launch import RankFailure, launch

GRADED_COLLECTIVE_TIMEOUT = 15.0  # seconds a rank may wait in one collective of a graded test's launch
_RUNS: dict[tuple, tuple[bool, Any]] = {}


def launch_once(worker: Callable[..., Any], world_size: int, *args: Any, timeout: float = 120.0,
                collective_timeout: float = GRADED_COLLECTIVE_TIMEOUT, **options: Any) -> dict[int, Any]:
    """``launch(worker, world_size, *args, ...)``'s results, launched on the first call only; later calls
    with the same worker and arguments return them, or raise the first call's failure again.

    Raises:
        course.launch.RankFailure: the launch failed (now or on the first call).
    """
    key = (worker.__module__, worker.__qualname__, world_size, repr(args), repr(sorted(options.items())))
    if key not in _RUNS:
        try:
            _RUNS[key] = (True, launch(worker, world_size, *args, timeout=timeout,
                                       collective_timeout=collective_timeout, **options))
        except RankFailure as exc:
            _RUNS[key] = (False, exc)
            raise
    ok, value = _RUNS[key]
    if not ok:
        raise RankFailure(value.rank, f"{value}\n\n(this launch failed in an earlier test and was not started "
                                      f"again; the error above is that launch's)")
    return value
