"""A command run in a process session of its own, bounded in time: how the grader runs a key's tests and the
performance step runs a measurement (:mod:`instructor.grade`, :mod:`instructor.performance`).

The whole session is killed with SIGKILL when the command ends as well as when it runs past its time, so that
nothing it started — a rank that outlived its launcher, a worker a test left behind — survives it. (The grader
also kills the processes its run marked, wherever they went: :func:`instructor.grade.kill_leftovers`.)
"""
from __future__ import annotations

import os
import signal
import subprocess
from dataclasses import dataclass
from pathlib import Path


@dataclass
class SessionRun:
    """What :func:`run_in_session` saw: ``output`` (stdout and stderr, merged; what it printed before it was killed
    if it timed out), ``returncode`` (None when it timed out) and ``timed_out``."""

    output: str
    returncode: int | None
    timed_out: bool


def run_in_session(cmd: list[str], *, cwd: Path, env: dict, timeout: float) -> SessionRun:
    """Run ``cmd`` in ``cwd`` with ``env`` in a new process session, for at most ``timeout`` seconds; then kill the
    session's every process (ended or timed out)."""
    proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    timed_out, output = False, ""
    try:
        output, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        timed_out = True
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):  # the session has ended / its group id is no longer ours
            pass
    if timed_out:
        output, _ = proc.communicate()
    return SessionRun(output or "", None if timed_out else proc.returncode, timed_out)
