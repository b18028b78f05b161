"""Ranks started once and reused: a pool of processes per world size, for the test suite.

Starting ``world_size`` processes costs seconds on a laptop — Python, ``import torch``, the
process group, and ``transformers`` when a worker builds GPT-2 — and the test suite starts
hundreds of runs. While a pool is enabled (:func:`enable`, which the repository's ``conftest.py``
calls for the pytest session), :func:`course.launch.launch` hands a run to a pool of processes
that already form a process group of that size, instead of starting new ones (as DeepSpeed's
``DistributedTest(reuse_dist_env=True)`` and PyTorch's ``MultiProcContinuousTest`` do):

* one pool per ``(world_size, device type, back-end, collective timeout)``, started at its first
  run and kept until :func:`shutdown` (the end of the test session);
* each run gets a fresh state: the environment of the caller at the time of the call (so a test's
  ``monkeypatch.setenv`` reaches the ranks), NCCL-rules mode installed or not accordingly, the
  course's group names and communication counters cleared, torch's thread count, default dtype and
  grad mode restored, the working directory restored, and the process groups the run created
  destroyed when it ends;
* a run that fails in any way — a rank raises, dies or hangs — ends its pool: the ranks are
  stopped and the next run starts a new one, so nothing of a broken run leaks into the next. The
  caller sees the same :class:`course.launch.RankFailure` as with fresh processes.

Runs that need processes of their own are never pooled: under torchrun, with ``max_restarts``,
with ``init_process_group=False``, or inside :func:`disabled` (tests of the launcher itself,
which kill, restart and count processes). Worker output goes to a log file per rank in the pool's
folder (the caller's terminal may belong to a test that has ended).
"""
from __future__ import annotations

import contextlib
import multiprocessing.util
import os
import pickle
import signal
import sys
import tempfile
import time
import traceback
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed import distributed_c10d as c10d

from course import collectives, nccl_rules
from course.rank_watch import die_with_parent, enable_stack_dumps, name_process

_ENABLED = False
_DISABLED_DEPTH = 0
_POOLS: dict[tuple, "_Pool"] = {}


def enable() -> None:
    """Reuse ranks from here on (until :func:`shutdown`)."""
    global _ENABLED
    _ENABLED = True


def shutdown() -> None:
    """Stop every pool's processes and stop pooling."""
    global _ENABLED
    _ENABLED = False
    close_pools()


def close_pools() -> None:
    """Stop every pool's processes (pooling stays on: the next run starts a new pool). Every pool is asked
    to stop first, then each is waited for: their ranks leave their groups at the same time."""
    pools = list(_POOLS.values())
    _POOLS.clear()
    for pool in pools:
        pool.ask_to_stop()
    for pool in pools:
        pool.close()


@contextlib.contextmanager
def disabled():
    """Runs inside the ``with`` block get fresh processes (launcher tests); no pooled process is left
    running meanwhile."""
    global _DISABLED_DEPTH
    close_pools()
    _DISABLED_DEPTH += 1
    try:
        yield
    finally:
        _DISABLED_DEPTH -= 1


def active() -> bool:
    return _ENABLED and _DISABLED_DEPTH == 0


def run(worker, world_size: int, args: tuple, device_type: str, backend: str, timeout: float | None,
        collective_timeout: float, launcher) -> dict:
    """Run ``worker`` on a pool of ``world_size`` ranks (see the module docstring); ``{rank: value}``.

    ``launcher`` is :data:`course.launch.RANKS` (a :class:`course.launch.RankLife`), given by the launcher,
    which calls this: its rank set-up, result collection and process stopping are the pool's too (handed
    in, so that this module does not import the launcher back).

    Raises:
        course.launch.RankFailure: as :func:`course.launch.launch` (the pool is then closed).
    """
    key = (world_size, device_type, backend, collective_timeout)
    pool = _POOLS.get(key)
    if pool is None or not pool.alive():
        if pool is not None:
            pool.close()
        pool = _POOLS[key] = _Pool(world_size, device_type, backend, collective_timeout, launcher)
    try:
        return pool.run(worker, args, timeout)
    except BaseException:
        pool.close()
        _POOLS.pop(key, None)
        raise


class _Pool:
    def __init__(self, world_size: int, device_type: str, backend: str, collective_timeout: float, launcher):
        ctx = launcher.process_context()
        self.launcher = launcher
        self.world_size = world_size
        self.stop_asked = False
        self.folder = Path(tempfile.mkdtemp(prefix="llmsys_pool_"))
        self.tasks = [ctx.Queue() for _ in range(world_size)]
        self.results = ctx.Queue()
        init_method = f"tcp://127.0.0.1:{launcher.free_port()}"
        self.procs = [ctx.Process(target=_pool_entry, daemon=True, name=f"pool-rank{rank}",
                                  args=(rank, world_size, init_method, device_type, backend, collective_timeout,
                                        self.tasks[rank], self.results, os.getpid(), str(self.folder),
                                        launcher.setup_worker, launcher.teardown_worker, launcher.adopt_caller,
                                        dict(os.environ), os.getcwd()))
                      for rank in range(world_size)]
        for p in self.procs:
            p.start()

    def alive(self) -> bool:
        return all(p.is_alive() for p in self.procs)

    def run(self, worker, args: tuple, timeout: float | None) -> dict:
        task = (worker, args, dict(os.environ), os.getcwd())
        for q in self.tasks:
            q.put(task)
        return self.launcher.collect_results(self.procs, self.results, self.folder, timeout)

    def ask_to_stop(self) -> None:
        """Tell every rank to leave its loop (and its process group) after the task it runs."""
        if self.stop_asked:
            return
        self.stop_asked = True
        for q in self.tasks:
            try:
                q.put(None)
            except (ValueError, OSError):
                pass

    def close(self) -> None:
        self.ask_to_stop()
        deadline = time.monotonic() + 2
        for p in self.procs:
            p.join(timeout=max(0.0, deadline - time.monotonic()))
        self.launcher.stop_processes(self.procs)
        for q in [*self.tasks, self.results]:
            q.close()
        for f in self.folder.glob("*"):
            f.unlink(missing_ok=True)
        with contextlib.suppress(OSError):
            self.folder.rmdir()


def _pool_entry(rank, world_size, init_method, device_type, backend, collective_timeout, tasks, results, parent_pid,
                folder, setup_worker, teardown_worker, adopt, env, cwd):
    die_with_parent(parent_pid)
    name_process(f"pool-rank{rank}")
    adopt(env, cwd)
    log = os.open(os.path.join(folder, f"rank{rank}.log"), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(log, 1)
    os.dup2(log, 2)
    enable_stack_dumps(Path(folder) / f"rank{rank}.stack")
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent decides when the pool ends
    os.environ["LOCAL_WORLD_SIZE"] = str(world_size)
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = init_method[len("tcp://"):].split(":")
    setup_worker(rank, world_size, rank, device_type, backend, init_method, collective_timeout)
    baseline = _State.capture()
    try:
        while True:
            task = tasks.get()
            if task is None:  # the pool ends: leave at once (the group and the interpreter's clean-up would
                sys.stdout.flush()  # cost every rank half a second of CPU, and nothing of them is kept) ...
                sys.stderr.flush()
                # ... but free what multiprocessing asks to be freed at exit: the semaphores of locks made in a
                # run (tqdm makes one), which the resource tracker would otherwise report as leaked
                multiprocessing.util._run_finalizers(0)
                os._exit(0)
            worker, args, env, cwd = task
            try:
                baseline.begin(env, cwd)
                value = worker(rank, world_size, *args)
                results.put((rank, "ok", pickle.dumps(value)))
            except BaseException:  # noqa: BLE001 - everything goes back to the parent
                results.put((rank, "error", traceback.format_exc()))
            finally:
                baseline.end()
            sys.stdout.flush()
            sys.stderr.flush()
    finally:
        teardown_worker()


class _State:
    """What a run may change in a pooled rank, and how to put it back."""

    def __init__(self, env, cwd, threads, dtype, groups):
        self.env, self.cwd, self.threads, self.dtype, self.groups = env, cwd, threads, dtype, groups

    @classmethod
    def capture(cls) -> "_State":
        return cls(dict(os.environ), os.getcwd(), torch.get_num_threads(), torch.get_default_dtype(), _groups())

    def begin(self, env: dict, cwd: str) -> None:
        keep = {k: self.env[k] for k in ("LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "LLMSYS_RESTART_COUNT")
                if k in self.env}
        os.environ.clear()
        os.environ.update(env)
        os.environ.update(keep)
        with contextlib.suppress(OSError):
            os.chdir(cwd)
        collectives.forget_run()
        nccl_rules.uninstall()
        if nccl_rules.enabled():
            nccl_rules.install()

    def end(self) -> None:
        nccl_rules.uninstall()
        _destroy_groups_made_since(self.groups, dist.destroy_process_group)
        torch.set_num_threads(self.threads)
        torch.set_default_dtype(self.dtype)
        torch.set_grad_enabled(True)
        os.environ.clear()
        os.environ.update(self.env)
        with contextlib.suppress(OSError):
            os.chdir(self.cwd)


def _groups() -> list:
    """The process groups this rank holds besides the world, in the order they were made (torch's ``pg_map`` is
    a dict: it keeps the order of insertion)."""
    return [g for g in c10d._world.pg_map if g is not c10d.GroupMember.WORLD]


def _destroy_groups_made_since(before: list, destroy) -> list:
    """Destroy (``destroy(group)``, i.e. ``dist.destroy_process_group``) the groups this rank holds that are not in
    ``before``, the last made first, and return them in that order. Every rank made its groups in the same order
    (:mod:`course.nccl_rules`, rule 5), so every rank destroys the groups it shares with another in the same order:
    NCCL's ``ncclCommAbort`` was collective in some versions, and two ranks aborting two shared communicators in
    opposite orders would wait for each other (torch's ``destroy_process_group()`` shuts its groups down in one
    order for the same reason). A set's order — what this was — follows object addresses, different in each rank."""
    kept = set(before)
    made = [g for g in _groups() if g not in kept][::-1]
    for group in made:
        with contextlib.suppress(Exception):
            destroy(group)
    return made
