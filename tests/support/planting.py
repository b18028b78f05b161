"""Running a graded test's workers with a planted wrong solution (the test of the test).

A graded test must fail on every plausible wrong solution. The wrong solutions are kept in
``tests/instructor/planted.py`` (instructor-only: they are near-copies of the reference and stay out
of the student release and of the grading copies), each with the targets it replaces; the tests in
``tests/instructor/test_planted.py`` run a graded test's checks with each one planted and see them
fail. A worker that takes a ``planted`` argument runs its cases inside :func:`planting`; graded runs
pass None, which plants nothing and imports nothing from ``tests/instructor``.
"""
from __future__ import annotations

import contextlib


@contextlib.contextmanager
def planting(name: str | None):
    """Replace the targets of the planted wrong solution ``name`` (None: nothing) for the duration of the
    block, in this process, and restore them after it (pooled ranks are reused by later tests).

    Raises:
        KeyError: no planted solution of that name.
    """
    if name is None:
        yield
        return
    from tests.instructor.planted import plant

    with plant(name):
        yield
