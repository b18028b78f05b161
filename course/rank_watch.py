"""Keeping ranks on a short leash: they die with their parent, and they can say where they are.

* :func:`die_with_parent` — a rank asks the kernel to kill it when the process that started it
  dies (Linux ``prctl(PR_SET_PDEATHSIG, SIGKILL)``), and a watchdog thread polls the launcher where
  that is not enough (the launcher's fork server started it) or not available. So a launcher
  killed by SIGTERM, SIGKILL or a notebook's interrupt leaves no rank running, and no rank writes
  results after the kill.
* :func:`name_process` — a rank is named ``rank<r>`` (``pool-rank<r>`` in the test suite's reused
  ranks) in ``ps``, ``top`` and ``/proc/<pid>/comm``.
* :func:`enable_stack_dumps` / :func:`where_ranks_are` — every rank registers Python's
  ``faulthandler`` on SIGUSR1; when a run hangs or one rank times out in a collective, the
  launcher asks every living rank for its stack and tells the ranks that wait inside a
  ``torch.distributed`` call from those that never reached it.
"""
from __future__ import annotations

import ctypes
import faulthandler
import os
import re
import signal
import threading
import time
from dataclasses import dataclass
from pathlib import Path

PR_SET_PDEATHSIG = 1
PR_SET_NAME = 15
_FRAME = re.compile(r'^\s+File "(?P<path>[^"]+)", line (?P<line>\d+) in (?P<func>\S+)', re.M)


def die_with_parent(parent_pid: int) -> str:
    """Make this process die when the launcher ``parent_pid`` dies.

    The kernel is asked to kill this process when its parent dies (Linux ``prctl(PR_SET_PDEATHSIG,
    SIGKILL)``). When the launcher is not the parent but the grandparent — the rank was forked by the
    launcher's fork server (:func:`course.launch.process_context`), which stays up while any process it
    forked is alive — a watchdog thread also polls the launcher every half second, as it does wherever
    ``prctl`` is missing.

    Returns ``"pdeathsig"``, ``"pdeathsig+watchdog"`` or ``"watchdog"`` (how). Exits at once if the
    launcher is already gone.
    """
    parent = os.getppid()
    how = "watchdog"
    try:
        if ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) == 0:
            how = "pdeathsig"
    except (OSError, AttributeError):
        pass
    if os.getppid() != parent or not _alive(parent_pid):  # gone before the request took effect
        os._exit(1)
    if how == "watchdog" or parent != parent_pid:
        def watch():
            while os.getppid() == parent and _alive(parent_pid):
                time.sleep(0.5)
            os._exit(1)
        threading.Thread(target=watch, daemon=True, name="die-with-parent").start()
        if how == "pdeathsig":
            how = "pdeathsig+watchdog"
    return how


def name_process(name: str) -> None:
    """Show this process as ``name`` (at most 15 bytes) in ``ps``, ``top`` and ``/proc/<pid>/comm`` (Linux; a
    no-op elsewhere): a rank forked by the fork server would otherwise carry the server's command line."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_NAME, ctypes.c_char_p(name.encode()[:15]), 0, 0, 0)
    except (OSError, AttributeError):
        pass


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie — ended, its exit status not yet read — does not)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True


def enable_stack_dumps(path: Path) -> None:
    """On SIGUSR1, write every thread's Python stack to ``path`` (``faulthandler``); on a fatal signal
    (SIGABRT from NCCL's watchdog, SIGSEGV, ...) append it there too, so the launcher can say where the
    rank was when it died (:func:`death_report`)."""
    handle = open(path, "w")  # kept open for the life of the process
    faulthandler.register(signal.SIGUSR1, file=handle, all_threads=True, chain=False)
    faulthandler.enable(file=handle, all_threads=True)


def death_report(rank: int, exitcode: int | None, stack_path: Path | None = None) -> str:
    """``rank R failed: killed by SIGABRT ...``: what is known of a rank that ended without reporting,
    from its exit code and the stack ``faulthandler`` wrote when a fatal signal hit it."""
    if exitcode is not None and exitcode < 0:
        try:
            name = signal.Signals(-exitcode).name
        except ValueError:
            name = f"signal {-exitcode}"
        cause = f"killed by {name}"
        if name == "SIGABRT":
            cause += (" (on GPUs: NCCL's watchdog ends a rank this way when a collective outlives the group's "
                      "timeout or NCCL reports an error; its log above names the operation, WorkNCCL(SeqNum=..., "
                      "OpType=...))")
        elif name == "SIGKILL":
            cause += " (out of memory? the kernel's OOM killer sends SIGKILL)"
    else:
        cause = f"exited with code {exitcode} without reporting a result"
    text = stack_path.read_text(errors="replace").replace("\0", "") if stack_path and stack_path.is_file() else ""
    fatal = text[text.rfind("Fatal Python error"):] if "Fatal Python error" in text else ""
    where = _analyse(rank, fatal).frame if fatal else ""
    return f"rank {rank} failed: {cause}" + (f"\n  at {where}" if where else "")


@dataclass
class RankWhereabouts:
    """Where one rank was when asked: in a ``torch.distributed`` call or not, and the innermost
    frame of the course's or the user's code (``file:line in function``)."""

    rank: int
    in_collective: bool
    collective: str
    frame: str

    def describe(self) -> str:
        if self.in_collective:
            return f"rank {self.rank}: waiting in {self.collective}, called at {self.frame}"
        return f"rank {self.rank}: at {self.frame}" if self.frame else f"rank {self.rank}: (no stack)"


def _analyse(rank: int, text: str) -> RankWhereabouts:
    # faulthandler writes one block per thread, most recent call first; the main thread's block
    # is the one marked "Current thread" (the signal runs on it) or, failing that, the last one.
    blocks = re.split(r"\n(?=Thread 0x|Current thread 0x)", text.strip())
    main = next((b for b in blocks if b.startswith("Current thread")), blocks[-1] if blocks else "")
    frames = [m.groupdict() for m in _FRAME.finditer(main)]
    collective = next((f["func"] for f in frames if "torch/distributed" in f["path"]), "")
    own = next((f for f in frames if "torch/" not in f["path"] and "/multiprocessing/" not in f["path"]
                and "threading.py" not in f["path"]), None)
    frame = f"{own['path']}:{own['line']} in {own['func']}" if own else ""
    return RankWhereabouts(rank, bool(collective), collective, frame)


def where_ranks_are(pids: dict[int, int], stack_dir: Path, wait: float = 1.0) -> dict[int, RankWhereabouts]:
    """Ask each living rank (``{rank: pid}``) for its stack; ``{rank: RankWhereabouts}`` of those that answered."""
    for rank, pid in pids.items():
        path = stack_dir / f"rank{rank}.stack"
        try:
            path.write_text("")
            os.kill(pid, signal.SIGUSR1)
        except OSError:
            continue
    time.sleep(wait)
    found = {}
    for rank in pids:
        path = stack_dir / f"rank{rank}.stack"
        text = path.read_text() if path.is_file() else ""
        if text.strip():
            found[rank] = _analyse(rank, text)
    return found


def hang_report(where: dict[int, RankWhereabouts]) -> str:
    """A message that names the ranks that never reached the collective the others wait in."""
    waiting = sorted(r for r, w in where.items() if w.in_collective)
    absent = sorted(r for r, w in where.items() if not w.in_collective)
    lines = []
    if waiting and absent:
        lines.append(f"rank(s) {absent} never reached the collective that rank(s) {waiting} wait in "
                     f"({where[waiting[0]].collective}).")
    elif waiting:
        lines.append(f"rank(s) {waiting} all wait in collectives (different ones, or a peer that died?).")
    lines += ["Where each rank was:"] + ["  " + where[r].describe() for r in sorted(where)]
    return "\n".join(lines)
