"""How the launcher words a failed run (:mod:`course.launch`; docs/architecture.md, "The launcher").

Which rank caused a failure, decided from what the launcher saw — the ranks' exit statuses and the order they ended
in — not from any one library's words (:func:`cause_of_failure`; the transports' wording of a lost peer,
:data:`LOST_PEER`, marks a rank as a casualty); the message of the :class:`course.launch.RankFailure` a failed, dead
or hung run ends with (:func:`failure_report`, :func:`overrun_report`), with the casualties after the cause and where
the ranks still running are (:mod:`course.rank_watch`); and the first lines a rank under torchrun prints when its
worker raised (:func:`first_lines`). The launcher raises the failure; this module names its cause and writes it.
"""
from __future__ import annotations

import pickle
import queue as queue_module
import re
import signal
import time
import traceback
from pathlib import Path

from course.rank_watch import death_report, hang_report, where_ranks_are

# How the transports word a wait that failed because of a peer — it died, left, or never came: gloo ("Connection
# closed by peer", "Read error ...: Connection reset by peer", "Write error ...: Broken pipe", "Timed out waiting
# ... for recv operation"), the TCP store ("failed to recv, got 0 bytes", "Connection refused", "Socket Timeout"),
# NCCL ("ncclRemoteError: ... remote process exited or there was a network error", "ncclSystemError: ... unexpected
# exit of a remote peer", "Watchdog caught collective operation timeout", "NCCL communicator was aborted", "Some
# NCCL operations have failed or timed out"). A rank that raised one of these is a casualty, not the cause: the
# launcher looks for the cause in the ranks' exit statuses and the order they ended in (:func:`cause_of_failure`).
LOST_PEER = re.compile(
    r"timed? ?out|timeout|connection (closed|reset) by (remote )?peer|broken pipe|connection refused|"
    r"read error|write error|failed to recv|got 0 bytes|ncclRemoteError|remote process exit|remote peer|"
    r"connection closure|communicator was aborted|watchdog|NCCL operations have failed", re.I)


def cause_of_failure(errors: dict[int, str], deaths: list[int], exitcodes: dict[int, int | None]) -> tuple[str, int]:
    """Which rank caused a failure, from what the launcher saw — not from any one library's words.

    Args:
        errors: ``{rank: traceback}`` of the ranks that reported an error, in the order they arrived.
        deaths: the ranks that ended without reporting, in the order they were seen to end.
        exitcodes: each rank's exit status (negative: killed by that signal).

    Returns:
        ``("died", rank)``: the first rank that died of anything but SIGABRT (SIGKILL, a crash, an exit code) —
        a dead rank cannot have been killed by its peers' errors, and NCCL's watchdog aborts a rank (SIGABRT) *after*
        a peer failed; else ``("raised", rank)``: the first rank whose error is its own (not a lost-peer or timed-out
        wait, :data:`LOST_PEER`); else ``("died", rank)``: the first rank aborted (SIGABRT); else ``("lost", rank)``:
        every error is a wait that failed on a peer that is still alive (a hang or a deadlock: the caller asks where
        each rank is); ``rank`` is then the first to report.

    Raises:
        ValueError: neither an error nor a death to go by.
    """
    abort = -signal.SIGABRT
    hard = [r for r in deaths if exitcodes.get(r) != abort]
    if hard:
        return "died", hard[0]
    own = [r for r, text in errors.items() if not LOST_PEER.search(text)]
    if own:
        return "raised", own[0]
    if deaths:
        return "died", deaths[0]
    if errors:
        return "lost", next(iter(errors))
    raise ValueError("no error and no death to find a cause in")


# A peer's connection closed under a rank: the peer's process ended (or left its group) — its death, if it died, is
# on its way to the launcher (the fork server reports it), so the launcher waits a little longer for it.
_CONNECTION_LOST = re.compile(r"closed by (remote )?peer|reset by (remote )?peer|broken pipe|got 0 bytes|"
                              r"failed to recv|remote process exit|remote peer|connection closure", re.I)


def _settle(procs, results, outputs: dict, errors: dict, deaths: list, grace: float = 1.0,
            lost_grace: float = 5.0) -> None:
    """After a first failure, gather the others for up to ``grace`` seconds, in the order they come (into ``errors``
    and ``deaths``, in place), until every rank has returned, reported or ended: a killed rank's peers report a lost
    connection at about the time it is seen to die, and which came first is what names the cause. While every error
    is a closed connection and no death is seen yet, up to ``lost_grace`` seconds (a loaded machine's fork server
    may take that long to report the death that closed it)."""
    start = time.monotonic()
    while True:
        for r, p in enumerate(procs):
            if r not in outputs and r not in errors and r not in deaths and not p.is_alive() and \
                    p.exitcode not in (0, None):
                deaths.append(r)
        if all(r in outputs or r in errors or r in deaths for r in range(len(procs))):
            return
        waited = time.monotonic() - start
        peer_closed = errors and not deaths and all(_CONNECTION_LOST.search(v) for v in errors.values())
        if waited > (lost_grace if peer_closed else grace):
            return
        try:
            other, status, value = results.get(timeout=0.05)
        except queue_module.Empty:
            continue
        if status == "error":
            errors.setdefault(other, value)
        else:
            outputs[other] = pickle.loads(value)


def failure_report(procs, results, outputs: dict, stack_dir, errors: dict, deaths: list) -> tuple[int, str]:
    """``(rank, message)`` of the :class:`course.launch.RankFailure` of a run in which ``errors``
    (``{rank: traceback}``) were reported and ``deaths`` seen: the others are gathered (:func:`_settle`), the cause
    is named (:func:`cause_of_failure`), and the rest say what happened to them."""
    stack_dir = Path(stack_dir)
    _settle(procs, results, outputs, errors, deaths)
    kind, rank = cause_of_failure(errors, deaths, {r: p.exitcode for r, p in enumerate(procs)})
    casualties = "".join(f"\nrank {r} then raised (its peer was gone): {_last_line(v)}" for r, v in errors.items()
                         if r != rank)
    casualties += "".join(f"\n{death_report(r, procs[r].exitcode, stack_dir / f'rank{r}.stack')} (after rank {rank})"
                          for r in deaths if r != rank)
    if kind == "died":
        where = _whereabouts(procs, {**outputs, **errors}, stack_dir, exclude=rank)  # those still running, silent
        return rank, (death_report(rank, procs[rank].exitcode, stack_dir / f"rank{rank}.stack") + casualties
                      + ("\n" + hang_report(where) if where else ""))
    value = errors[rank]
    if kind == "raised":
        return rank, f"rank {rank} raised:\n{value}{casualties}"
    # every report is a wait that failed on a living peer: the cause is a rank that never came
    head, report = f"rank {rank} raised", ""
    waited = {r: v for r, v in errors.items() if r != rank}
    where = {r: w for r, w in _whereabouts(procs, outputs, stack_dir, exclude=rank).items() if r not in waited}
    absent = sorted(r for r, w in where.items() if not w.in_collective)
    if absent:
        head = (f"rank(s) {absent} never reached the collective that rank {rank} timed out in; "
                f"rank {rank} raised")
    elif waited:
        head = (f"ranks {sorted([rank, *waited])} all timed out waiting, each for a peer that was "
                f"waiting too: a deadlock, operations that do not match (crossed sends and receives, a "
                f"collective posted on another group; the flight recorder's dumps say which); rank {rank} raised")
    elif outputs:  # the peers it waited for had returned: they skipped the collective
        head = (f"rank(s) {sorted(outputs)} had already returned when rank {rank} timed out waiting "
                f"in a collective (or lost its peer in it): they never posted it; rank {rank} raised")
    report = "\n" + hang_report(where) if where else ""
    report += "".join(f"\n  rank {r}: timed out waiting at {_innermost_frame(v)}" for r, v in sorted(waited.items()))
    return rank, f"{head}:\n{value}{report}"


def _last_line(traceback_text: str) -> str:
    """The exception line of a traceback (its last non-empty line)."""
    lines = [line for line in traceback_text.strip().splitlines() if line.strip()]
    return lines[-1].strip() if lines else "(no traceback)"


def _innermost_frame(traceback_text: str) -> str:
    """``path:line in function`` of the innermost frame of a traceback outside torch (the caller's wait)."""
    frames = re.findall(r'File "([^"]+)", line (\d+), in (\S+)', traceback_text)
    library = re.compile(r"/site-packages/|/torch/|(^|/)course/[^/]+\.py$")  # torch's and the course library's
    own = [f for f in frames if not library.search(f[0]) or "/tests/" in f[0]] or frames
    return f"{own[-1][0]}:{own[-1][1]} in {own[-1][2]}" if own else "(no traceback)"


def _whereabouts(procs, outputs, stack_dir, exclude: int) -> dict:
    """Where the other ranks still running are: ``{rank: RankWhereabouts}`` (empty if none runs)."""
    running = {r: p.pid for r, p in enumerate(procs) if r not in outputs and r != exclude and p.is_alive()}
    return where_ranks_are(running, Path(stack_dir)) if running else {}


def overrun_report(procs, outputs: dict, stack_dir: Path, timeout: float) -> tuple[int, str]:
    """``(rank, message)`` of a run that passed its wall-clock limit (``timeout`` seconds): the ranks still running
    are named, with where each one is (:func:`course.rank_watch.where_ranks_are`)."""
    running = [r for r in range(len(procs)) if r not in outputs]
    where = where_ranks_are({r: procs[r].pid for r in running}, stack_dir)
    return running[0], (f"rank(s) {running} did not finish within {timeout:.0f} s (hung in a collective?); "
                        f"ranks {sorted(outputs)} finished. {hang_report(where)}\nAll processes were stopped.")


def first_lines(rank: int, exc: BaseException) -> str:
    """``rank r failed: Type: message`` and the innermost line of the course's or the user's code: what a rank
    under torchrun prints first when its worker raised."""
    frames = [f for f in traceback.extract_tb(exc.__traceback__)
              if "site-packages" not in f.filename and "/lib/python" not in f.filename]
    where = f"\n  at {frames[-1].filename}:{frames[-1].lineno}: {(frames[-1].line or '').strip()}" if frames else ""
    text = f"{type(exc).__name__}: {exc}".strip().splitlines()
    return f"rank {rank} failed: {text[0] if text else type(exc).__name__}{where}"
