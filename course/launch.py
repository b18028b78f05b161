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
(:class:`RankFailure`); if a rank hangs, the run ends naming it. No process is left
behind in either case.
"""
from __future__ import annotations

import datetime
import os
import pickle
import queue as queue_module
import socket
import time
import traceback
from dataclasses import dataclass
from typing import Any, Callable

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

# Collective timeout of the process group (seconds): a rank blocked this long in a
# collective raises instead of waiting forever.
DEFAULT_COLLECTIVE_TIMEOUT = 120.0


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
                  init_method: str, collective_timeout: float) -> DistContext:
    global _CONTEXT
    if device_type == "cuda":
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
    else:
        device = torch.device("cpu")
        # Share the cores between the local ranks instead of oversubscribing them.
        local = int(os.environ.get("LOCAL_WORLD_SIZE", world_size))
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // max(1, local)))
    dist.init_process_group(backend=backend, init_method=init_method, rank=rank, world_size=world_size,
                            timeout=datetime.timedelta(seconds=collective_timeout))
    _CONTEXT = DistContext(rank, world_size, local_rank, backend, device)
    return _CONTEXT


def _teardown_worker() -> None:
    global _CONTEXT
    _CONTEXT = None
    if dist.is_initialized():
        dist.destroy_process_group()


def _spawned_entry(rank, world_size, init_method, device_type, backend, collective_timeout,
                   worker, args, results, init_group):
    os.environ["LOCAL_WORLD_SIZE"] = str(world_size)
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
           collective_timeout: float = DEFAULT_COLLECTIVE_TIMEOUT, init_process_group: bool = True) -> dict[int, Any]:
    """Run ``worker(rank, world_size, *args)`` on every rank of a process group.

    Args:
        worker: a function defined in an importable module (not a notebook cell or
            ``__main__`` of an interactive session: spawned children import it by name).
            Inside it, :func:`context` gives the rank's device and back-end.
        world_size: number of processes (>= 1). Under torchrun it must match ``WORLD_SIZE``.
        *args: picklable arguments passed to every rank.
        device, backend: see :func:`resolve_device_backend`.
        timeout: wall-clock limit of the whole run in seconds (None: no limit).
        collective_timeout: seconds a rank may block in one collective before it raises.
        init_process_group: False leaves forming the group to the worker (spawn mode only):
            ``MASTER_ADDR``/``MASTER_PORT`` are set for it, and the launcher still bounds
            the run and tears the group down.

    Returns:
        ``{rank: worker's return value}`` for every rank (spawn mode) or for this
        process's rank only (torchrun mode). Return values must be picklable.

    Raises:
        ValueError: bad ``world_size``, device or back-end; a worker defined in ``__main__``
            of an interactive session.
        RankFailure: a rank raised (its traceback is in the message), died, or did not
            finish within ``timeout`` (the ranks still running are named).
    """
    if not isinstance(world_size, int) or isinstance(world_size, bool) or world_size < 1:
        raise ValueError(f"world_size must be a whole number >= 1, not {world_size!r}")
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

    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    init_method = f"tcp://127.0.0.1:{free_port()}"
    procs = [ctx.Process(target=_spawned_entry, daemon=True, name=f"rank{rank}",
                         args=(rank, world_size, init_method, device_type, backend, collective_timeout,
                               worker, args, results, init_process_group))
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
                    # A process that ended without reporting died hard (segfault, OOM kill, os._exit).
                    if rank not in outputs and not p.is_alive() and results.empty():
                        time.sleep(0.5)  # let a report still in the pipe arrive
                        if results.empty():
                            raise RankFailure(rank, f"rank {rank} died with exit code {p.exitcode} "
                                                    "without reporting a result")
                if deadline is not None and time.monotonic() > deadline:
                    running = [r for r in range(world_size) if r not in outputs]
                    raise RankFailure(running[0], f"rank(s) {running} did not finish within {timeout:.0f} s "
                                                  f"(hung in a collective?); ranks {sorted(outputs)} finished. "
                                                  "All processes were stopped.")
                continue
            if status == "error":
                raise RankFailure(rank, f"rank {rank} raised:\n{value}")
            outputs[rank] = pickle.loads(value)
        for p in procs:
            p.join(timeout=30)
        return outputs
    finally:
        _stop(procs)
        results.close()


def _join_torchrun(worker, world_size, args, device, backend, collective_timeout):
    env_world = int(os.environ["WORLD_SIZE"])
    if world_size != env_world:
        raise ValueError(f"world_size {world_size} does not match torchrun's WORLD_SIZE={env_world}; "
                         "leave --world_size out or make them agree")
    rank = int(os.environ["RANK"])
    local_rank = int(os.environ.get("LOCAL_RANK", rank))
    device_type, backend = resolve_device_backend(device, backend, world_size)
    _setup_worker(rank, world_size, local_rank, device_type, backend, "env://", collective_timeout)
    try:
        return {rank: worker(rank, world_size, *args)}
    finally:
        _teardown_worker()


def default_world_size(fallback: int) -> int:
    """``WORLD_SIZE`` from torchrun when set, else ``fallback``."""
    return int(os.environ["WORLD_SIZE"]) if in_torchrun() else fallback
