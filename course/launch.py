"""One launcher for every script, notebook and test (docs/architecture.md, "The launcher").

``launch(worker, world_size, *args)`` runs ``worker(rank, world_size, *args)`` in
``world_size`` processes that form one ``torch.distributed`` process group:

* **spawn mode** (the default): it starts the processes itself on 127.0.0.1 with a
  free port; gloo and one CPU thread-share each on CPU, one GPU each (``cuda:rank``) on GPUs.
* **torchrun mode**: when ``RANK`` and ``WORLD_SIZE`` are already in the
  environment (``torchrun``, ``srun``), it joins that group (``env://``, which reads
  ``MASTER_ADDR``/``MASTER_PORT``) and runs the worker in this process only, on GPU
  ``cuda:LOCAL_RANK``. This is the multi-node path.

**One place decides the device and the back-end** (:func:`resolve_device_backend`; docs/architecture.md,
"Devices and back-ends"). On CPU the group is gloo. On GPUs it is ``"cpu:gloo,cuda:nccl"``, formed
eagerly with ``device_id=cuda:LOCAL_RANK``: CUDA tensors travel over NCCL, small host tensors
(counts, flags, pickled objects) over gloo, and PyTorch runs each group's point-to-point traffic on
that group's own communicator. ``LLMSYS_DEVICE`` (e.g. ``cpu``, set by the test suite's
``conftest.py``) decides what ``--device auto`` means.

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
import faulthandler
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
from multiprocessing import forkserver
from pathlib import Path
from typing import Any, Callable

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from course import launch_pool, nccl_rules
from course.environment import in_torchrun
from course.rank_watch import (death_report, die_with_parent, enable_stack_dumps, hang_report, name_process,
                               where_ranks_are)

# Collective timeout of the process group (seconds): a rank blocked this long in a
# collective raises instead of waiting forever.
DEFAULT_COLLECTIVE_TIMEOUT = 120.0
# What ``--device auto`` means when set (the test suite sets "cpu": its workers never pick NCCL by themselves).
DEVICE_ENV = "LLMSYS_DEVICE"
# NCCL's watchdog (a thread of every rank) ends a rank whose collective outlived the group's timeout or
# failed: 1 = abort the communicator, then tear the process down (SIGABRT). Set only where the user has not.
NCCL_ENV_DEFAULTS = {"TORCH_NCCL_ASYNC_ERROR_HANDLING": "1"}
_TIMED_OUT = re.compile(r"timed? ?out|timeout|connection closed by peer", re.I)


class RankFailure(RuntimeError):
    """A rank raised, died or hung. ``rank`` names it; the message carries its traceback."""

    def __init__(self, rank: int | None, message: str):
        super().__init__(message)
        self.rank = rank


@dataclass(frozen=True)
class DistContext:
    """What a worker may ask about the run it is part of (see :func:`context`).

    ``backend`` names the back-end of the device (``"gloo"`` or ``"nccl"``); ``group_backend`` is what
    the process group was formed with (``"gloo"``, or ``"cpu:gloo,cuda:nccl"`` on GPUs)."""

    rank: int
    world_size: int
    local_rank: int
    backend: str
    device: torch.device
    group_backend: str = "gloo"


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


def process_group_backend(device_type: str, backend: str) -> str:
    """The back-end string a run's process group is formed with: ``"gloo"`` on CPU, and on CUDA
    ``"cpu:gloo,cuda:nccl"`` (NCCL for CUDA tensors, gloo for host tensors; docs/architecture.md,
    "Devices and back-ends")."""
    return "cpu:gloo,cuda:nccl" if device_type == "cuda" and backend == "nccl" else backend


def visible_gpus() -> int:
    """Number of CUDA GPUs this process sees (0 without CUDA)."""
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def _one_gpu_per_process(visible: int) -> bool:
    """True when this process of a torchrun/srun job was given one GPU of its own (Slurm
    ``--gpus-per-task=1``, ``--gpu-bind``, or a ``CUDA_VISIBLE_DEVICES`` of one GPU per rank). If the
    GPU is in fact shared, NCCL refuses the group ("Duplicate GPU detected") when it forms."""
    names = [d for d in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if d.strip()]
    return in_torchrun() and visible == 1 and len(names) == 1


def local_ranks(world_size: int) -> int:
    """Ranks on this node: torchrun's ``LOCAL_WORLD_SIZE`` (or Slurm's ``SLURM_NTASKS_PER_NODE``)
    under torchrun/srun, else ``world_size`` (spawn mode starts every rank here)."""
    if in_torchrun():
        for name in ("LOCAL_WORLD_SIZE", "SLURM_NTASKS_PER_NODE"):
            if os.environ.get(name, "").isdigit():
                return int(os.environ[name])
    return world_size


def local_rank_from_env(rank: int, world_size: int) -> int:
    """This process's rank on its node: ``LOCAL_RANK`` (torchrun), ``SLURM_LOCALID`` (srun), or the
    global rank when every rank is on this node.

    Raises:
        ValueError: several nodes and no local rank in the environment (the global rank is not a GPU index).
    """
    for name in ("LOCAL_RANK", "SLURM_LOCALID", "OMPI_COMM_WORLD_LOCAL_RANK"):
        if os.environ.get(name, "").isdigit():
            return int(os.environ[name])
    if local_ranks(world_size) == world_size:
        return rank
    raise ValueError(f"rank {rank}: LOCAL_RANK is not set and the run spans several nodes, so the GPU index is "
                     "unknown (the global rank is not one); start the ranks with torchrun, which sets it")


def gpu_index(local_rank: int, n_local: int, visible: int) -> int:
    """The CUDA device of the rank with ``local_rank`` of ``n_local`` ranks on a node whose process sees
    ``visible`` GPUs: ``local_rank`` when the node's GPUs are all visible, 0 when this process was given
    one GPU of its own (``CUDA_VISIBLE_DEVICES`` narrowed per rank).

    Raises:
        ValueError: more ranks on the node than GPUs for them.
    """
    if _one_gpu_per_process(visible):
        return 0
    if n_local > visible:
        raise ValueError(f"{n_local} ranks on this node need {n_local} GPUs (one each), but {visible} "
                         f"{'is' if visible == 1 else 'are'} visible; start at most {visible} ranks per node "
                         "(torchrun --nproc_per_node, --world_size) or use --device cpu")
    if not 0 <= local_rank < n_local:
        raise ValueError(f"LOCAL_RANK {local_rank} is outside 0..{n_local - 1}")
    return local_rank


def resolve_device_backend(device: str | None = "auto", backend: str | None = "auto",
                           world_size: int = 1) -> tuple[str, str]:
    """Choose ``(device_type, backend)`` — the one place a run's device and back-end are decided.

    ``device`` is ``"auto"``, ``"cpu"`` or ``"cuda"``; ``backend`` is ``"auto"``, ``"gloo"`` or
    ``"nccl"``. ``auto`` means ``$LLMSYS_DEVICE`` when set (the test suite pins ``cpu``); else
    CUDA + NCCL when this node has a GPU for each of its ranks (:func:`local_ranks`; a process given
    one GPU of its own counts as one for it), else CPU + gloo. On CUDA the process group is
    ``"cpu:gloo,cuda:nccl"`` (:func:`process_group_backend`).

    Raises:
        ValueError: unknown names; NCCL on CPU; gloo on CUDA (gloo cannot send CUDA tensors); CUDA asked
            for but not available; more ranks on this node than GPUs.
    """
    device = device or "auto"
    backend = backend or "auto"
    if device not in ("auto", "cpu", "cuda"):
        raise ValueError(f"--device must be auto, cpu or cuda, not {device!r}")
    if backend not in ("auto", "gloo", "nccl"):
        raise ValueError(f"--backend must be auto, gloo or nccl, not {backend!r}")
    if device == "auto" and os.environ.get(DEVICE_ENV):
        device = os.environ[DEVICE_ENV]
        if device not in ("auto", "cpu", "cuda"):
            raise ValueError(f"${DEVICE_ENV} must be cpu, cuda or auto, not {device!r}")
    visible, n_local = visible_gpus(), local_ranks(world_size)
    if device == "auto":
        device = "cuda" if visible and (visible >= n_local or _one_gpu_per_process(visible)) else "cpu"
    if device == "cuda" and not visible:
        raise ValueError("--device cuda was asked for, but no CUDA GPU is visible; use --device cpu")
    if device == "cuda":
        gpu_index(0, n_local, visible)  # more ranks than GPUs on this node: refused here, before anything starts
    if backend == "auto":
        backend = "nccl" if device == "cuda" else "gloo"
    if backend == "nccl" and device != "cuda":
        raise ValueError("the nccl backend needs --device cuda; use --backend gloo on CPU")
    if backend == "gloo" and device == "cuda":
        raise ValueError("--backend gloo cannot send or receive CUDA tensors; on --device cuda use --backend nccl "
                         "(the run's group also carries host tensors over gloo), or run on --device cpu")
    return device, backend


def setup_worker(rank: int, world_size: int, local_rank: int, device_type: str, backend: str,
                 init_method: str | None, collective_timeout: float, store=None) -> DistContext:
    """Make this process rank ``rank`` of the run: its device (``cuda:LOCAL_RANK``'s GPU, or its share of
    the CPU threads) and the process group (``init_method`` or ``store``; ``collective_timeout`` in
    seconds). Returns the rank's :class:`DistContext` (also :func:`context` from now on).

    Raises:
        RuntimeError: CUDA was initialised in the fork server before it forked this rank.
    """
    global _CONTEXT
    group_backend = process_group_backend(device_type, backend)
    device_id = None
    if device_type == "cuda":
        if torch.cuda._is_in_bad_fork():  # the fork server initialised CUDA before it forked this rank
            raise RuntimeError("CUDA was initialised in the launcher's fork server before it forked this rank, so "
                               "CUDA cannot be used here: a module in course.launch.RANK_PRELOAD touches the GPU "
                               "when imported; remove it from that list")
        for name, value in NCCL_ENV_DEFAULTS.items():
            os.environ.setdefault(name, value)
        device = torch.device("cuda", gpu_index(local_rank, local_ranks(world_size), visible_gpus()))
        torch.cuda.set_device(device)
        device_id = device  # eager: every group's NCCL communicator exists before its first call
    else:
        device = torch.device("cpu")
        # Share the cores between the local ranks instead of oversubscribing them.
        local = int(os.environ.get("LOCAL_WORLD_SIZE", world_size))
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // max(1, local)))
    dist.init_process_group(backend=group_backend, init_method=None if store is not None else init_method, store=store,
                            rank=rank, world_size=world_size, timeout=datetime.timedelta(seconds=collective_timeout),
                            device_id=device_id)
    _CONTEXT = DistContext(rank, world_size, local_rank, backend, device, group_backend)
    if nccl_rules.enabled():  # tests named *rendezvous*: gloo held to NCCL's point-to-point rules
        nccl_rules.install()
    return _CONTEXT


def teardown_worker() -> None:
    """Undo :func:`setup_worker`: forget the context and destroy the process group (if any)."""
    global _CONTEXT
    _CONTEXT = None
    nccl_rules.uninstall()
    if dist.is_initialized():
        dist.destroy_process_group()


# What the fork server imports once for every rank it starts (:func:`process_context`): torch and
# transformers' GPT-2 (course.model builds it), the largest imports a rank makes — about 4 s of CPU
# each, which on a laptop's few cores was most of a short run (8 ranks on 2 cores: ~15 s before the
# first step). Third-party modules only: the server's ``sys.path`` is Python's default (Python 3.11's
# fork server does not take the caller's), so the course's own modules are imported in each rank, from
# the caller's tree. A name that fails to import is skipped (the rank imports it when it needs it).
RANK_PRELOAD = ["torch", "torch.distributed", "torch.distributed.device_mesh",
                "transformers.models.gpt2.modeling_gpt2"]


def process_context():
    """How ranks are started: ``forkserver``, with :data:`RANK_PRELOAD` imported once by the server.

    A fork server (one per launcher process, started at its first launch and ended with it) forks each
    rank from itself, so ranks start without importing torch and transformers again. Like ``spawn``, it
    never forks a process that holds CUDA state or the caller's threads, so the ranks may use CUDA and
    NCCL as spawned ones do: importing torch does not initialise CUDA, and the server runs with
    ``PYTORCH_NVML_BASED_CUDA_CHECK=1``, so that an import asking ``torch.cuda.is_available()`` asks NVML
    instead of initialising the CUDA driver (which would make CUDA unusable in every rank forked after it).
    A forked rank inherits the server's environment and folder, not the caller's: :func:`adopt_caller` gives it
    the caller's.
    """
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(RANK_PRELOAD)
    added = "PYTORCH_NVML_BASED_CUDA_CHECK" not in os.environ
    if added:
        os.environ["PYTORCH_NVML_BASED_CUDA_CHECK"] = "1"  # the server's environment only: it starts here
    try:
        forkserver.ensure_running()
    finally:
        if added:
            del os.environ["PYTORCH_NVML_BASED_CUDA_CHECK"]
    return ctx


def start_fork_server() -> None:
    """Start the fork server of :func:`process_context` now, without waiting for it: its imports then overlap
    whatever this process does before its first launch (the test suite calls this as it starts)."""
    process_context()


def stop_fork_server() -> None:
    """End the fork server now (its ranks have ended; the test suite calls this as it ends). Left alone it would
    end by itself once it sees its launcher gone — but only after the imports it may still be busy with, and
    until then it holds the launcher's output open (a caller reading that output to its end waits for it)."""
    server = forkserver._forkserver  # the module's one server (no public handle on it)
    pid = getattr(server, "_forkserver_pid", None)
    if pid is None:
        return
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    server._stop()  # closes its sockets and reaps it


def adopt_caller(env: dict, cwd: str) -> None:
    """Take the caller's environment and working folder (a forked rank starts with the fork server's)."""
    os.environ.clear()
    os.environ.update(env)
    try:
        os.chdir(cwd)
    except OSError:
        pass


def _spawned_entry(rank, world_size, init_method, device_type, backend, collective_timeout,
                   worker, args, results, init_group, parent_pid, stack_dir, attempt, env, cwd):
    die_with_parent(parent_pid)
    name_process(f"rank{rank}")
    adopt_caller(env, cwd)
    enable_stack_dumps(Path(stack_dir) / f"rank{rank}.stack")
    os.environ["LOCAL_WORLD_SIZE"], os.environ["LOCAL_RANK"] = str(world_size), str(rank)
    os.environ["LLMSYS_RESTART_COUNT"] = str(attempt)
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = init_method[len("tcp://"):].split(":")
    try:
        if init_group:
            setup_worker(rank, world_size, rank, device_type, backend, init_method, collective_timeout)
        value = worker(rank, world_size, *args)
        # Plain pickle bytes: tensors must not travel as shared-memory handles, which die with this process.
        results.put((rank, "ok", pickle.dumps(value)))
    except BaseException:  # noqa: BLE001 - everything goes back to the parent
        results.put((rank, "error", traceback.format_exc()))
    finally:
        try:
            teardown_worker()
        except Exception:  # noqa: BLE001
            pass


def stop_processes(procs) -> None:
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

    device_type, backend = resolve_device_backend(device, backend, world_size)  # also: a GPU for each rank
    module = getattr(worker, "__module__", None)
    if module == "__main__":
        import __main__  # the running script itself: looked at only for a worker defined there
        if not getattr(__main__, "__file__", None):
            raise ValueError(f"{worker.__name__} is defined in a notebook cell or interactive session; "
                             "spawned processes cannot import it. Move it into a module (a .py file).")
    if launch_pool.active() and init_process_group and not max_restarts and module != "__main__":
        return launch_pool.run(worker, world_size, args, device_type, backend, timeout, collective_timeout, RANKS)
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
    ctx = process_context()
    results = ctx.Queue()
    init_method = f"tcp://127.0.0.1:{free_port()}"
    stack_dir = tempfile.mkdtemp(prefix="llmsys_stacks_")
    procs = [ctx.Process(target=_spawned_entry, daemon=True, name=f"rank{rank}",
                         args=(rank, world_size, init_method, device_type, backend, collective_timeout,
                               worker, args, results, init_group, os.getpid(), stack_dir, attempt,
                               dict(os.environ), os.getcwd()))
             for rank in range(world_size)]
    try:
        for p in procs:
            p.start()
        outputs = collect_results(procs, results, Path(stack_dir), timeout)
        for p in procs:
            p.join(timeout=30)
        return outputs
    finally:
        stop_processes(procs)
        results.close()
        for f in Path(stack_dir).glob("*"):
            f.unlink(missing_ok=True)
        os.rmdir(stack_dir)


def collect_results(procs, results, stack_dir: Path, timeout: float | None) -> dict[int, Any]:
    """Wait for every rank's ``(rank, "ok"|"error", payload)`` on ``results``: ``{rank: value}``.

    Raises:
        RankFailure: a rank raised (its traceback; if it timed out waiting, the ranks that never
            came are named), died without reporting, or the run passed ``timeout`` seconds.
    """
    world_size = len(procs)
    outputs: dict[int, Any] = {}
    deadline = None if timeout is None else time.monotonic() + timeout
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
                        raise RankFailure(rank, death_report(rank, p.exitcode, Path(stack_dir) / f"rank{rank}.stack")
                                          + ("\n" + hang_report(where) if where else ""))
            if deadline is not None and time.monotonic() > deadline:
                running = [r for r in range(world_size) if r not in outputs]
                where = where_ranks_are({r: procs[r].pid for r in running}, stack_dir)
                raise RankFailure(running[0], f"rank(s) {running} did not finish within {timeout:.0f} s "
                                              f"(hung in a collective?); ranks {sorted(outputs)} finished. "
                                              f"{hang_report(where)}\nAll processes were stopped.")
            continue
        if status == "error":
            head, report = f"rank {rank} raised", ""
            died = _died(procs, outputs, exclude=rank) if _TIMED_OUT.search(value) else None
            if died is not None:  # its peer died (SIGABRT of NCCL's watchdog, a crash): that is the cause
                raise RankFailure(died, death_report(died, procs[died].exitcode, Path(stack_dir) / f"rank{died}.stack")
                                  + f"\nrank {rank} then raised (its peer was gone):\n{value}")
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
                            f"waiting too: a deadlock, operations that do not match (crossed sends and receives, a "
                            f"collective posted on another group; the flight recorder's dumps say which); rank "
                            f"{rank} raised")
                elif outputs:  # the peers it waited for had returned: they skipped the collective
                    head = (f"rank(s) {sorted(outputs)} had already returned when rank {rank} timed out waiting "
                            f"in a collective (or lost its peer in it): they never posted it; rank {rank} raised")
                report = "\n" + hang_report(where) if where else ""
                report += "".join(f"\n  rank {r}: timed out waiting at {_innermost_frame(v)}"
                                  for r, v in sorted(waited.items()))
            raise RankFailure(rank, f"{head}:\n{value}{report}")
        outputs[rank] = pickle.loads(value)
    return outputs


def _died(procs, outputs, exclude: int, wait: float = 1.0) -> int | None:
    """The first rank (other than ``exclude``) whose process ended without reporting — killed by a signal
    or exited with an error code — within ``wait`` seconds; None if every other rank is alive or done."""
    deadline = time.monotonic() + wait
    while True:
        dead = [r for r, p in enumerate(procs) if r != exclude and r not in outputs and not p.is_alive()
                and p.exitcode not in (0, None)]
        if dead or time.monotonic() > deadline:
            return dead[0] if dead else None
        time.sleep(0.1)


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


_JOINS = [0]  # groups this process has joined under torchrun (a script may launch several times)


def _attempt_store(rank: int, world_size: int, timeout: float):
    """The store this torchrun attempt forms its group in: torchrun's store, under a prefix of the
    attempt (``TORCHELASTIC_RESTART_COUNT``) and of the launch within it (a benchmark launches once
    per configuration; every rank launches the same number of times). After a restart, a plain
    ``env://`` group would read the previous attempt's keys in the same store and hang or fail to
    connect; a fresh namespace per attempt and launch comes up cleanly."""
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    _JOINS[0] += 1
    attempt = f"{attempt}_launch{_JOINS[0]}"
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
    local_rank = local_rank_from_env(rank, world_size)
    die_with_parent(os.getppid())  # the torchrun agent
    # A rank killed by a fatal signal (SIGABRT from NCCL's watchdog) prints its Python stack; torchrun's
    # summary then names the rank and the signal.
    faulthandler.enable(all_threads=True)
    # When torchrun stops the other workers after one failed, they leave quietly: the failing
    # rank's own report stays the first thing printed.
    signal.signal(signal.SIGTERM, lambda *_: os._exit(143))
    device_type, backend = resolve_device_backend(device, backend, world_size)
    store = _attempt_store(rank, world_size, collective_timeout)
    setup_worker(rank, world_size, local_rank, device_type, backend, None, collective_timeout, store=store)
    try:
        return {rank: worker(rank, world_size, *args)}
    except BaseException as exc:
        print(_first_lines(rank, exc), file=sys.stderr, flush=True)
        raise
    finally:
        teardown_worker()


def _gathered(rank: int, world_size: int, worker, *args):
    value = worker(rank, world_size, *args)
    if world_size == 1:
        return [value]
    everyone: list = [None] * world_size
    dist.all_gather_object(everyone, value)  # pickled objects: over gloo on the host
    return everyone


def launch_all(worker: Callable[..., Any], world_size: int, *args: Any, **options: Any) -> dict[int, Any]:
    """:func:`launch`, returning ``{rank: worker's value}`` of **every** rank in every process — also
    under torchrun, where each process runs only its own rank (the values are gathered in the world
    group, ``all_gather_object``). For benchmarks whose report needs every rank's measurements.
    Options and errors as :func:`launch`."""
    out = launch(_gathered, world_size, worker, *args, **options)
    return dict(enumerate(next(iter(out.values()))))


def reports_results() -> bool:
    """Whether this process prints and writes a run's report: always in spawn mode, rank 0 under torchrun."""
    return not in_torchrun() or os.environ.get("RANK") == "0"


def default_world_size(fallback: int) -> int:
    """``WORLD_SIZE`` from torchrun when set, else ``fallback``."""
    return int(os.environ["WORLD_SIZE"]) if in_torchrun() else fallback


@dataclass(frozen=True)
class RankLife:
    """The launcher's side of a rank's life, as :mod:`course.launch_pool` uses it: how processes start
    (:func:`process_context`, :func:`free_port`), how a rank joins and leaves its group
    (:func:`setup_worker`, :func:`teardown_worker`) and takes the caller's environment
    (:func:`adopt_caller`), how results come back (:func:`collect_results`) and how processes end
    (:func:`stop_processes`). Handed to the pool by :func:`launch` (the pool does not import the launcher,
    which imports it)."""

    process_context: Callable[[], Any]
    free_port: Callable[[], int]
    setup_worker: Callable[..., DistContext]
    teardown_worker: Callable[[], None]
    adopt_caller: Callable[[dict, str], None]
    collect_results: Callable[..., dict]
    stop_processes: Callable[[list], None]


RANKS = RankLife(process_context, free_port, setup_worker, teardown_worker, adopt_caller, collect_results,
                 stop_processes)
