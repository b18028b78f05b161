"""One launcher for every script, notebook and test (docs/architecture.md, "The launcher").

``launch(worker, world_size, *args)`` runs ``worker(rank, world_size, *args)`` in
``world_size`` processes that form one ``torch.distributed`` process group:

* **spawn mode** (the default): it starts the processes itself on 127.0.0.1 with a
  free port; gloo and one CPU thread-share each on CPU, NCCL and one GPU each
  (``cuda:rank``) on GPUs.
* **torchrun mode**: when ``RANK`` and ``WORLD_SIZE`` are already in the
  environment (``torchrun``, ``srun``), it joins that group (``env://``, which reads
  ``MASTER_ADDR``/``MASTER_PORT``) and runs the worker in this process only. This is
  the multi-node path.

Every wait is bounded: the process group has a collective timeout, and the whole run a
wall-clock limit. If a rank raises, the run ends with that rank's traceback
(:class:`RankFailure`); if a rank hangs, the run ends naming the rank(s) that never reached
the collective the others wait in (every rank reports its stack, :mod:`course.rank_watch`).
No process is left behind: the ranks die with the launcher, also when it is killed.
``max_restarts`` starts every rank again after a failure (the workers resume from their
latest checkpoint, :mod:`course.checkpoint`); under torchrun, torchrun restarts them and each
attempt forms its group in a store namespace of its own.
"""
from __future__ import annotations

import datetime
import os
import pickle
import queue as queue_module
import re
import signal
import socket
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from course.rank_watch import die_with_parent, enable_stack_dumps, hang_report, where_ranks_are

# Collective timeout of the process group (seconds): a rank blocked this long in a
# collective raises instead of waiting forever.
DEFAULT_COLLECTIVE_TIMEOUT = 120.0
_TIMED_OUT = re.compile(r"timed? ?out|timeout|connection closed by peer", re.I)


class RankFailure(RuntimeError):
    """A rank raised, died or hung. ``rank`` names it; the message carries its traceback."""

    def __init__(self, rank: int | None, message: str):
        super().__init__(message)
        self.rank = rank


@dataclass(frozen=True)
class DistContext:
    """What a worker may ask about the run it is part of (see :func:`context`)."""

    rank: int
    world_size: int
    local_rank: int
    backend: str
    device: torch.device


_CONTEXT: DistContext | None = None


def context() -> DistContext:
    """The :class:`DistContext` of the calling worker. Raises RuntimeError outside :func:`launch`."""
    if _CONTEXT is None:
        raise RuntimeError("context() is only available inside a worker started by course.launch.launch")
    return _CONTEXT


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def in_torchrun() -> bool:
    """True when the environment already describes a process group (torchrun, srun)."""
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ


def resolve_device_backend(device: str | None = "auto", backend: str | None = "auto",
                           world_size: int = 1) -> tuple[str, str]:
    """Choose ``(device_type, backend)``.

    ``device`` is ``"auto"``, ``"cpu"`` or ``"cuda"``; ``backend`` is ``"auto"``,
    ``"gloo"`` or ``"nccl"``. ``auto`` picks CUDA + NCCL when enough GPUs are visible for
    one per local rank, else CPU + gloo.

    Raises:
        ValueError: unknown names, NCCL on CPU, or CUDA asked for but not available.
    """
    device = device or "auto"
    backend = backend or "auto"
    if device not in ("auto", "cpu", "cuda"):
        raise ValueError(f"--device must be auto, cpu or cuda, not {device!r}")
    if backend not in ("auto", "gloo", "nccl"):
        raise ValueError(f"--backend must be auto, gloo or nccl, not {backend!r}")
    local = int(os.environ.get("LOCAL_WORLD_SIZE", world_size))
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() and torch.cuda.device_count() >= local else "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda was asked for, but no CUDA GPU is visible; use --device cpu")
    if backend == "auto":
        backend = "nccl" if device == "cuda" else "gloo"
    if backend == "nccl" and device != "cuda":
        raise ValueError("the nccl backend needs --device cuda; use --backend gloo on CPU")
    return device, backend


def _setup_worker(rank: int, world_size: int, local_rank: int, device_type: str, backend: str,
                  init_method: str | None, collective_timeout: float, store=None) -> DistContext:
    global _CONTEXT
    if device_type == "cuda":
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
    else:
        device = torch.device("cpu")
        # Share the cores between the local ranks instead of oversubscribing them.
        local = int(os.environ.get("LOCAL_WORLD_SIZE", world_size))
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // max(1, local)))
    dist.init_process_group(backend=backend, init_method=None if store is not None else init_method, store=store,
                            rank=rank, world_size=world_size, timeout=datetime.timedelta(seconds=collective_timeout))
    _CONTEXT = DistContext(rank, world_size, local_rank, backend, device)
    from course import nccl_rules

    if nccl_rules.enabled():  # tests named *rendezvous*: gloo held to NCCL's point-to-point rules
        nccl_rules.install()
    return _CONTEXT


def _teardown_worker() -> None:
    global _CONTEXT
    _CONTEXT = None
    from course import nccl_rules

    nccl_rules.uninstall()
    if dist.is_initialized():
        dist.destroy_process_group()


def _spawned_entry(rank, world_size, init_method, device_type, backend, collective_timeout,
                   worker, args, results, init_group, parent_pid, stack_dir, attempt):
    die_with_parent(parent_pid)
    enable_stack_dumps(Path(stack_dir) / f"rank{rank}.stack")
    os.environ["LOCAL_WORLD_SIZE"] = str(world_size)
    os.environ["LLMSYS_RESTART_COUNT"] = str(attempt)
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = init_method[len("tcp://"):].split(":")
    try:
        if init_group:
            _setup_worker(rank, world_size, rank, device_type, backend, init_method, collective_timeout)
        value = worker(rank, world_size, *args)
        # Plain pickle bytes: tensors must not travel as shared-memory handles, which die with this process.
        results.put((rank, "ok", pickle.dumps(value)))
    except BaseException:  # noqa: BLE001 - everything goes back to the parent
        results.put((rank, "error", traceback.format_exc()))
    finally:
        try:
            _teardown_worker()
        except Exception:  # noqa: BLE001
            pass


def _stop(procs) -> None:
    """Terminate, then kill, every process still alive; reap them all."""
    for p in procs:
        if p.is_alive():
            p.terminate()
    deadline = time.monotonic() + 5
    for p in procs:
        p.join(timeout=max(0.0, deadline - time.monotonic()))
    for p in procs:
        if p.is_alive():
            p.kill()
            p.join(timeout=5)


def launch(worker: Callable[..., Any], world_size: int, *args: Any, device: str | None = "auto",
           backend: str | None = "auto", timeout: float | None = 600.0,
           collective_timeout: float = DEFAULT_COLLECTIVE_TIMEOUT, init_process_group: bool = True,
           max_restarts: int = 0) -> dict[int, Any]:
    """Run ``worker(rank, world_size, *args)`` on every rank of a process group.

    Args:
        worker: a function defined in an importable module (not a notebook cell or
            ``__main__`` of an interactive session: spawned children import it by name).
            Inside it, :func:`context` gives the rank's device and back-end.
        world_size: number of processes (>= 1). Under torchrun it must match ``WORLD_SIZE``.
        *args: picklable arguments passed to every rank.
        device, backend: see :func:`resolve_device_backend`.
        timeout: wall-clock limit of one attempt in seconds (None: no limit).
        collective_timeout: seconds a rank may block in one collective before it raises.
        init_process_group: False leaves forming the group to the worker (spawn mode only):
            ``MASTER_ADDR``/``MASTER_PORT`` are set for it, and the launcher still bounds
            the run and tears the group down.
        max_restarts: after a rank fails (raises, dies, hangs), start every rank again, up to
            this many times; the workers see ``LLMSYS_RESTART_COUNT`` (the attempt number) and
            resume from their latest checkpoint (spawn mode; under torchrun use torchrun's).

    Returns:
        ``{rank: worker's return value}`` for every rank (spawn mode) or for this
        process's rank only (torchrun mode). Return values must be picklable.

    Raises:
        ValueError: bad ``world_size``, device or back-end; a worker defined in ``__main__``
            of an interactive session.
        RankFailure: a rank raised (its traceback is in the message), died, or did not
            finish within ``timeout`` (the ranks that never reached the collective the
            others wait in are named), on the last attempt.
    """
    if not isinstance(world_size, int) or isinstance(world_size, bool) or world_size < 1:
        raise ValueError(f"world_size must be a whole number >= 1, not {world_size!r}")
    if not isinstance(max_restarts, int) or max_restarts < 0:
        raise ValueError(f"max_restarts must be a whole number >= 0, not {max_restarts!r}")
    if in_torchrun():
        if not init_process_group:
            raise ValueError("init_process_group=False is for spawn mode; under torchrun the group exists")
        return _join_torchrun(worker, world_size, args, device, backend, collective_timeout)

    device_type, backend = resolve_device_backend(device, backend, world_size)
    if device_type == "cuda" and torch.cuda.device_count() < world_size:
        raise ValueError(f"world_size {world_size} needs {world_size} GPUs, "
                         f"but {torch.cuda.device_count()} are visible")
    module = getattr(worker, "__module__", None)
    if module == "__main__":
        import __main__
        if not getattr(__main__, "__file__", None):
            raise ValueError(f"{worker.__name__} is defined in a notebook cell or interactive session; "
                             "spawned processes cannot import it. Move it into a module (a .py file).")
    for attempt in range(max_restarts + 1):
        try:
            return _run_attempt(worker, world_size, args, device_type, backend, timeout, collective_timeout,
                                init_process_group, attempt)
        except RankFailure as exc:
            if attempt == max_restarts:
                raise
            first = str(exc).strip().splitlines()[0]
            print(f"[launch] {first}\n[launch] restarting every rank from the latest checkpoint "
                  f"(restart {attempt + 1} of {max_restarts})", file=sys.stderr, flush=True)
    raise AssertionError("unreachable")


def _run_attempt(worker, world_size, args, device_type, backend, timeout, collective_timeout, init_group,
                 attempt) -> dict[int, Any]:
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    init_method = f"tcp://127.0.0.1:{free_port()}"
    stack_dir = tempfile.mkdtemp(prefix="llmsys_stacks_")
    procs = [ctx.Process(target=_spawned_entry, daemon=True, name=f"rank{rank}",
                         args=(rank, world_size, init_method, device_type, backend, collective_timeout,
                               worker, args, results, init_group, os.getpid(), stack_dir, attempt))
             for rank in range(world_size)]
    outputs: dict[int, Any] = {}
    deadline = None if timeout is None else time.monotonic() + timeout
    try:
        for p in procs:
            p.start()
        while len(outputs) < world_size:
            try:
                rank, status, value = results.get(timeout=0.2)
            except queue_module.Empty:
                for rank, p in enumerate(procs):
                    # A process that ended without reporting died hard (segfault, OOM kill, os._exit, a signal).
                    if rank not in outputs and not p.is_alive() and results.empty():
                        time.sleep(0.5)  # let a report still in the pipe arrive
                        if results.empty():
                            where = _whereabouts(procs, outputs, stack_dir, exclude=rank)
                            raise RankFailure(rank, f"rank {rank} died with exit code {p.exitcode} "
                                                    "without reporting a result"
                                                    + ("\n" + hang_report(where) if where else ""))
                if deadline is not None and time.monotonic() > deadline:
                    running = [r for r in range(world_size) if r not in outputs]
                    where = where_ranks_are({r: procs[r].pid for r in running}, Path(stack_dir))
                    raise RankFailure(running[0], f"rank(s) {running} did not finish within {timeout:.0f} s "
                                                  f"(hung in a collective?); ranks {sorted(outputs)} finished. "
                                                  f"{hang_report(where)}\nAll processes were stopped.")
                continue
            if status == "error":
                head, report = f"rank {rank} raised", ""
                if _TIMED_OUT.search(value):  # a wait that timed out: the cause is a rank that never came
                    waited = _timed_out_too(results, rank)
                    where = {r: w for r, w in _whereabouts(procs, outputs, stack_dir, exclude=rank).items()
                             if r not in waited}
                    absent = sorted(r for r, w in where.items() if not w.in_collective)
                    if absent:
                        head = (f"rank(s) {absent} never reached the collective that rank {rank} timed out in; "
                                f"rank {rank} raised")
                    elif waited:
                        head = (f"ranks {sorted([rank, *waited])} all timed out waiting, each for a peer that was "
                                f"waiting too: a deadlock (e.g. every rank receives before it sends); rank {rank} "
                                f"raised")
                    report = "\n" + hang_report(where) if where else ""
                    report += "".join(f"\n  rank {r}: timed out waiting at {_innermost_frame(v)}"
                                      for r, v in sorted(waited.items()))
                raise RankFailure(rank, f"{head}:\n{value}{report}")
            outputs[rank] = pickle.loads(value)
        for p in procs:
            p.join(timeout=30)
        return outputs
    finally:
        _stop(procs)
        results.close()
        for f in Path(stack_dir).glob("*"):
            f.unlink(missing_ok=True)
        os.rmdir(stack_dir)


def _timed_out_too(results, rank: int, wait: float = 1.0) -> dict[int, str]:
    """The other ranks whose own waits timed out (or lost their peer) around the same time as ``rank``'s:
    ``{rank: traceback}`` of the reports that arrive within ``wait`` seconds. Those ranks were waiting
    too, so they are not among the ones that never arrived."""
    found, deadline = {}, time.monotonic() + wait
    while time.monotonic() < deadline:
        try:
            other, status, value = results.get(timeout=max(0.0, deadline - time.monotonic()))
        except queue_module.Empty:
            break
        if other != rank and status == "error" and _TIMED_OUT.search(value):
            found[other] = value
    return found


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


def _attempt_store(rank: int, world_size: int, timeout: float):
    """The store this torchrun attempt forms its group in: torchrun's store, under a prefix of the
    attempt (``TORCHELASTIC_RESTART_COUNT``). After a restart, a plain ``env://`` group would read
    the previous attempt's keys in the same store and hang or fail to connect; a fresh namespace
    per attempt comes up cleanly."""
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    agent_hosts = os.environ.get("TORCHELASTIC_USE_AGENT_STORE", "").lower() == "true"
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world_size,
                          is_master=not agent_hosts and rank == 0, timeout=datetime.timedelta(seconds=timeout))
    return dist.PrefixStore(f"llmsys_attempt{attempt}", store)


def _first_lines(rank: int, exc: BaseException) -> str:
    """``rank r failed: Type: message`` and the innermost line of the course's or the user's code."""
    frames = [f for f in traceback.extract_tb(exc.__traceback__)
              if "site-packages" not in f.filename and "/lib/python" not in f.filename]
    where = f"\n  at {frames[-1].filename}:{frames[-1].lineno}: {(frames[-1].line or '').strip()}" if frames else ""
    text = f"{type(exc).__name__}: {exc}".strip().splitlines()
    return f"rank {rank} failed: {text[0] if text else type(exc).__name__}{where}"


def _join_torchrun(worker, world_size, args, device, backend, collective_timeout):
    env_world = int(os.environ["WORLD_SIZE"])
    if world_size != env_world:
        raise ValueError(f"world_size {world_size} does not match torchrun's WORLD_SIZE={env_world}; "
                         "leave --world_size out or make them agree")
    rank = int(os.environ["RANK"])
    local_rank = int(os.environ.get("LOCAL_RANK", rank))
    die_with_parent(os.getppid())  # the torchrun agent
    # When torchrun stops the other workers after one failed, they leave quietly: the failing
    # rank's own report stays the first thing printed.
    signal.signal(signal.SIGTERM, lambda *_: os._exit(143))
    device_type, backend = resolve_device_backend(device, backend, world_size)
    store = _attempt_store(rank, world_size, collective_timeout)
    _setup_worker(rank, world_size, local_rank, device_type, backend, None, collective_timeout, store=store)
    try:
        return {rank: worker(rank, world_size, *args)}
    except BaseException as exc:
        print(_first_lines(rank, exc), file=sys.stderr, flush=True)
        raise
    finally:
        _teardown_worker()


def default_world_size(fallback: int) -> int:
    """``WORLD_SIZE`` from torchrun when set, else ``fallback``."""
    return int(os.environ["WORLD_SIZE"]) if in_torchrun() else fallback
