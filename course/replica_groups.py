"""Replica groups under torchft's lighthouse: the launcher's path for per-step fault tolerance.

:func:`course.launch.launch` runs one process group; when a rank dies, the whole group is gone and the run
restarts every rank from the latest checkpoint (``max_restarts``). :func:`launch_replica_groups` runs ``replicas``
**replica groups** instead, each a process group of ``group_size`` ranks of its own holding a full copy of the
model, coordinated by torchft (Meta's fault-tolerance library for PyTorch, as torchtitan uses it):

* the **lighthouse** (``torchft._torchft.LighthouseServer``) runs inside this process — started here, shut down
  here, so it never outlives the launcher. Every replica group's ``torchft.Manager`` heartbeats to it and, before
  each step, asks it for a **quorum**: the groups that take the step together. It issues one when every group that
  heartbeats has asked (or, after ``join_timeout_ms``, with those that have, if at least ``min_replicas``); a group
  whose heartbeats stop for ``heartbeat_timeout_ms`` is dropped;
* the ranks start as :func:`course.launch.launch` starts them (its fork server, its rank set-up
  :func:`course.launch.setup_worker`: ``dist`` is the group's own process group), and die with this process;
* none of them starts its first step before every group's manager heartbeats (a start barrier), so the first
  quorum holds them all;
* a planned **fault** (:class:`Fault`) SIGKILLs every rank of a group when it reaches a step
  (:func:`fault_point`), and, with ``policy="heal"``, starts the group again when the others reach a later step
  (they wait there until its ranks are up): the new group asks for a quorum, is told it is behind, and **heals** — loads the weights, the
  optimizer state and the step from a live peer (torchft's checkpoint transport) — and joins the same step. With
  ``policy="restart_all"`` every group is stopped and started again instead, each resuming from its latest
  checkpoint (``LLMSYS_RESTART_COUNT``, :func:`course.checkpoint.resolve_resume`): the stop-the-world recovery it
  is compared with.

Inside a rank, :func:`replica` tells which group it belongs to and where the lighthouse is, :func:`report` sends
the launcher an event (the run's log: ``ReplicaRun.events``), :func:`fault_point` is where a planned kill lands.
Sources: torchft's ``Manager`` and lighthouse (the library's documentation, "Manager" and "Lighthouse");
Llama 3 report (Dubey et al. 2024), Sec. 3.3.4, on interruptions at scale.
"""
from __future__ import annotations

import multiprocessing.connection
import os
import pickle
import signal
import tempfile
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from course.rank_watch import die_with_parent, enable_stack_dumps, name_process

REPLICA_ENV = "LLMSYS_REPLICA_GROUP"        # "group,replicas,incarnation"
LIGHTHOUSE_ENV = "TORCHFT_LIGHTHOUSE"       # torchft's own name for the lighthouse address
FAULT_ENV = "LLMSYS_FAULT_STEP"             # the step at which this incarnation waits to be killed
HOLD_ENV = "LLMSYS_HOLD_STEPS"              # the steps at which the others wait for a restarted group (the drill)
_CHANNEL: dict = {}                         # in a rank: the launcher's queue, this rank's place


@dataclass(frozen=True)
class Fault:
    """A planned failure: every rank of replica group ``group`` is SIGKILLed at step ``at_step`` (after its
    forward pass: :func:`fault_point`); with ``policy="heal"`` the group is started again when the others reach step
    ``restart_at_step`` (None: never), and they wait there until its ranks are up."""

    group: int
    at_step: int
    restart_at_step: int | None = None


@dataclass(frozen=True)
class ReplicaInfo:
    """What a rank knows of its replica group (:func:`replica`)."""

    group: int          # 0 .. replicas - 1
    replicas: int       # replica groups the run started with
    incarnation: int    # 0 for the first start of the group, 1 after its restart, ...
    lighthouse: str     # the lighthouse's address (http://127.0.0.1:PORT)


@dataclass
class ReplicaRun:
    """What :func:`launch_replica_groups` returns.

    Attributes:
        results: ``{(group, incarnation, rank): the worker's return value}`` of every rank that finished.
        events: ``[{"time", "group", "incarnation", "rank", "kind", "step", ...}]`` in arrival order: the ranks'
            :func:`report` calls, and the launcher's own ``kill``, ``start`` and ``stop_all`` (``rank`` None).
        started: seconds (``time.time()``) when the first ranks were started.
        lighthouse: the lighthouse's address (shut down when the run returns).
        pids: every process the run started (all ended when it returns).
    """

    results: dict = field(default_factory=dict)
    events: list = field(default_factory=list)
    started: float = 0.0
    lighthouse: str = ""
    pids: list = field(default_factory=list)

    def of(self, kind: str, group: int | None = None) -> list[dict]:
        return [e for e in self.events if e["kind"] == kind and (group is None or e["group"] == group)]


def replica() -> ReplicaInfo:
    """The calling rank's :class:`ReplicaInfo`.

    Raises:
        RuntimeError: outside a rank of :func:`launch_replica_groups`.
    """
    text = os.environ.get(REPLICA_ENV)
    if not text:
        raise RuntimeError("replica() is only available in a rank started by course.replica_groups."
                           "launch_replica_groups")
    group, replicas, incarnation = (int(x) for x in text.split(","))
    return ReplicaInfo(group, replicas, incarnation, os.environ[LIGHTHOUSE_ENV])


def _send(message: tuple) -> None:
    """One message to the launcher, through this rank's own pipe (written by this process alone: a group SIGKILLed
    in mid-write damages only its own pipe, which the launcher then closes — a queue shared by every rank would keep
    its write lock held by the dead process, and every other rank's messages would stop)."""
    with _CHANNEL["lock"]:
        _CHANNEL["pipe"].send(message)


def report(kind: str, step: int | None = None, **data) -> None:
    """Send the launcher an event of this rank (nothing outside :func:`launch_replica_groups`)."""
    if not _CHANNEL:
        return
    info = _CHANNEL["info"]
    _send(("event", None, dict(time=time.time(), group=info.group, incarnation=info.incarnation,
                               rank=_CHANNEL["rank"], kind=kind, step=step, **data)))


def fault_point(step: int) -> None:
    """Where a planned kill lands: report ``fault_point`` and, if this incarnation is planned to die at ``step``,
    wait for the launcher's SIGKILL (so the kill falls at this point of the step, every time). While a killed group
    is started again (at its fault's ``restart_at_step``), the others wait here until its ranks are up (the drill's
    hold: on a laptop they would otherwise finish a short run before a new process has imported torch; the wait is
    reported as ``held``)."""
    report("fault_point", step)
    if os.environ.get(FAULT_ENV) == str(step):
        time.sleep(600)  # the launcher kills this process within milliseconds
        raise RuntimeError(f"replica group was meant to be killed at step {step}, and was not")
    if _CHANNEL and str(step) in os.environ.get(HOLD_ENV, "").split(","):
        began = time.time()
        if not _CHANNEL["hold"].wait(timeout=_CHANNEL["timeout"]):
            raise RuntimeError("the restarted replica group never came up (the drill's hold)")
        report("held", step, seconds=time.time() - began)


def wait_for_start() -> None:
    """Report that this rank's manager heartbeats, then wait for every group's (the start barrier)."""
    report("ready")
    if _CHANNEL and not _CHANNEL["go"].wait(timeout=_CHANNEL["timeout"]):
        raise RuntimeError("the other replica groups never became ready (start barrier)")


def _replica_entry(group, replicas, incarnation, rank, group_size, init_method, device_type, backend,
                   collective_timeout, lighthouse, fault_step, resume, worker, args, pipe, go, hold, hold_steps,
                   barrier_timeout, parent_pid, stack_dir, env, cwd):
    import threading

    from course.launch import adopt_caller, setup_worker, teardown_worker

    die_with_parent(parent_pid)
    name_process(f"replica{group}.rank{rank}")
    adopt_caller(env, cwd)
    enable_stack_dumps(Path(stack_dir) / f"replica{group}.{incarnation}.rank{rank}.stack")
    os.environ[REPLICA_ENV] = f"{group},{replicas},{incarnation}"
    os.environ[LIGHTHOUSE_ENV] = lighthouse
    os.environ["LLMSYS_RESTART_COUNT"] = str(incarnation if resume else 0)  # resume from the latest checkpoint
    if fault_step is not None:
        os.environ[FAULT_ENV] = str(fault_step)
    if hold_steps and not incarnation:
        os.environ[HOLD_ENV] = ",".join(str(s) for s in hold_steps)
    os.environ["LOCAL_WORLD_SIZE"], os.environ["LOCAL_RANK"] = str(group_size), str(rank)
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = init_method[len("tcp://"):].split(":")
    if device_type == "cuda":  # each group sees its own GPUs, as LOCAL_RANK 0 .. group_size - 1
        os.environ["CUDA_VISIBLE_DEVICES"] = ",".join(str(group * group_size + r) for r in range(group_size))
    _CHANNEL.update(pipe=pipe, lock=threading.Lock(), go=go, hold=hold, timeout=barrier_timeout, rank=rank,
                    info=ReplicaInfo(group, replicas, incarnation, lighthouse))
    try:
        setup_worker(rank, group_size, rank, device_type, backend, init_method, collective_timeout)
        value = worker(rank, group_size, *args)
        _send(("ok", (group, incarnation, rank), pickle.dumps(value)))
    except BaseException:  # noqa: BLE001 - everything goes back to the parent
        _send(("error", (group, incarnation, rank), traceback.format_exc()))
    finally:
        try:
            teardown_worker()
        except Exception:  # noqa: BLE001
            pass
        pipe.close()


def start_lighthouse(min_replicas: int, join_timeout_ms: int, heartbeat_timeout_ms: int):
    """torchft's lighthouse in this process: ``(server, "http://127.0.0.1:PORT")``; ``server.shutdown()`` ends it."""
    os.environ.setdefault("RUST_LOG", "warn")  # torchft's servers log every quorum at INFO
    from torchft._torchft import LighthouseServer

    server = LighthouseServer(bind="[::]:0", min_replicas=min_replicas, join_timeout_ms=join_timeout_ms,
                              heartbeat_timeout_ms=heartbeat_timeout_ms)
    port = server.address().rsplit(":", 1)[1]
    return server, f"http://127.0.0.1:{port}"


def _live_stacks(procs: dict, stack_dir: str) -> str:
    """Where every live rank is: each writes its threads' Python stacks on SIGUSR1 (:func:`enable_stack_dumps`);
    the innermost frames of its main thread, for the message of a run that did not finish."""
    live = [(g, r, p) for g, ps in procs.items() for r, p in enumerate(ps) if p.is_alive()]
    for _, _, p in live:
        os.kill(p.pid, signal.SIGUSR1)
    time.sleep(1.0)  # (faulthandler writes from a signal handler, at once)
    lines = []
    for path in sorted(Path(stack_dir).glob("replica*.stack")):
        text = path.read_text(errors="replace").strip()
        if text:
            blocks = text.split("\n\n")
            main = next((b for b in blocks if b.startswith("Current thread")), blocks[-1]).splitlines()
            lines.append(f"\n{path.stem}:\n  " + "\n  ".join(main[:8]))
    return "".join(lines)


def launch_replica_groups(worker: Callable[..., Any], replicas: int, group_size: int, *args: Any,
                          faults: tuple[Fault, ...] = (), policy: str = "heal", min_replicas: int = 1,
                          device: str = "auto", backend: str = "auto", timeout: float = 600.0,
                          collective_timeout: float = 60.0, heartbeat_timeout_ms: int = 2000,
                          join_timeout_ms: int = 30000) -> ReplicaRun:
    """Run ``worker(rank, group_size, *args)`` in ``replicas`` replica groups of ``group_size`` ranks each, under
    torchft's lighthouse (see the module docstring).

    Args:
        worker: a function of an importable module; inside it ``dist`` is its group's process group,
            :func:`replica` its group, and it builds its ``torchft.Manager`` with the lighthouse's address.
        faults: the planned failures (:class:`Fault`), at most one per group.
        policy: ``"heal"`` (a killed group restarts alone and heals from a live peer) or ``"restart_all"``
            (stop-the-world: every group restarts from its latest checkpoint).
        min_replicas: the fewest groups a quorum may have (the lighthouse's ``min_replicas``).
        timeout: wall-clock limit of the whole run (seconds).
        collective_timeout: seconds a rank may wait in one collective of its group.
        heartbeat_timeout_ms, join_timeout_ms: the lighthouse's (torchft_lighthouse --help).

    Returns:
        :class:`ReplicaRun`.

    Raises:
        ValueError: bad sizes, policy or faults, before anything starts.
        course.launch.RankFailure: a rank raised or died unplanned, or the run passed ``timeout``; every process
            is stopped and the lighthouse shut down first.
    """
    from course.launch import RankFailure, free_port, process_context, resolve_device_backend, stop_processes

    if replicas < 1 or group_size < 1:
        raise ValueError(f"replicas ({replicas}) and group_size ({group_size}) must be >= 1")
    if policy not in ("heal", "restart_all"):
        raise ValueError(f"policy must be 'heal' or 'restart_all', not {policy!r}")
    if not 1 <= min_replicas <= replicas:
        raise ValueError(f"min_replicas {min_replicas} must be between 1 and replicas ({replicas})")
    for f in faults:
        if not 0 <= f.group < replicas:
            raise ValueError(f"a fault names replica group {f.group}; the groups are 0 .. {replicas - 1}")
        if f.restart_at_step is not None and f.restart_at_step <= f.at_step:
            raise ValueError(f"group {f.group} is restarted at step {f.restart_at_step}, which must come after its "
                             f"kill at step {f.at_step}")
    if len({f.group for f in faults}) != len(faults):
        raise ValueError("at most one fault per replica group")
    device_type, backend = resolve_device_backend(device, backend, replicas * group_size)
    ctx = process_context()
    pipes: dict = {}                      # each rank's reading end -> (group, incarnation, rank), until its EOF
    ended: set = set()                    # (group, incarnation, rank) whose pipe reached EOF: the process exited
    stack_dir = tempfile.mkdtemp(prefix="llmsys_replicas_")
    run = ReplicaRun(started=time.time())
    procs: dict[int, list] = {}           # group -> its ranks' processes (the latest incarnation)
    every: list = []                      # every process started, for the final stop
    incarnation = dict.fromkeys(range(replicas), 0)
    killed: set[int] = set()              # groups killed on purpose and not (yet) restarted
    pending = {f.group: f for f in faults}
    reached: dict[int, set] = {}          # step -> the (group, rank)s of the current incarnations at its fault point
    server, address = start_lighthouse(min_replicas, join_timeout_ms, heartbeat_timeout_ms)
    run.lighthouse = address
    go = ctx.Event()
    hold = ctx.Event()  # cleared from a kill until the group, started again, is up (fault_point's hold)
    hold.set()
    hold_steps = [f.restart_at_step for f in faults if f.restart_at_step is not None] if policy == "heal" else []
    ready: set = set()

    def log(kind, g=None, **data):
        run.events.append(dict(time=time.time(), group=g, incarnation=None if g is None else incarnation[g],
                               rank=None, kind=kind, step=None, **data))

    def start(g: int, barrier, resume: bool = False) -> None:
        fault = pending.get(g)
        fault_step = fault.at_step if fault is not None and incarnation[g] == 0 else None
        init_method = f"tcp://127.0.0.1:{free_port()}"
        procs[g] = []
        for r in range(group_size):
            reader, writer = ctx.Pipe(duplex=False)
            p = ctx.Process(target=_replica_entry, daemon=True, name=f"replica{g}.rank{r}",
                            args=(g, replicas, incarnation[g], r, group_size, init_method, device_type, backend,
                                  collective_timeout, address, fault_step, resume, worker, args, writer, barrier,
                                  hold, hold_steps, timeout, os.getpid(), stack_dir, dict(os.environ), os.getcwd()))
            p.start()
            writer.close()  # the rank holds the only writing end: its exit is this pipe's EOF
            pipes[reader] = (g, incarnation[g], r)
            procs[g].append(p)
        every.extend(procs[g])
        run.pids.extend(p.pid for p in procs[g])
        log("start", g)

    def kill(g: int) -> None:
        for p in procs[g]:
            if p.is_alive():
                os.kill(p.pid, signal.SIGKILL)
        for p in procs[g]:
            p.join(timeout=10)
        log("kill", g)

    def restart_everyone() -> None:
        nonlocal go
        for g in range(replicas):
            kill(g)
        log("stop_all")
        go = ctx.Event()
        ready.clear()
        for g in range(replicas):
            incarnation[g] += 1
            start(g, go, resume=True)

    def finished() -> bool:
        return all((g, incarnation[g], r) in run.results for g in range(replicas) if g not in killed
                   for r in range(group_size)) and not any(f.restart_at_step is not None for f in pending.values()
                                                            if f.group in killed)

    deadline = time.monotonic() + timeout
    try:
        for g in range(replicas):
            start(g, go)
        inbox: list = []                  # messages read, in order, not yet handled
        while not finished():
            if not inbox:
                for reader in multiprocessing.connection.wait(list(pipes), timeout=0.2):
                    try:
                        inbox.append(reader.recv())
                    except (EOFError, OSError, pickle.UnpicklingError):  # exited (or killed in mid-message)
                        ended.add(pipes.pop(reader))
                        reader.close()
            for g, inc, r in ended:
                if inc == incarnation[g] and g not in killed and (g, inc, r) not in run.results:
                    procs[g][r].join(timeout=5)  # its pipe closes as it exits: its exit status follows at once
                    raise RankFailure(r, f"replica group {g} rank {r} died (exit code {procs[g][r].exitcode}) "
                                         "without a planned fault")
            if time.monotonic() > deadline:
                raise RankFailure(None, f"the replica groups did not finish within {timeout:.0f} s; events so "
                                        f"far: {run.events[-5:]}" + _live_stacks(procs, stack_dir))
            if not inbox:
                continue
            message = inbox.pop(0)
            kind, who, payload = message
            if kind == "error":
                group, inc, rank = who
                if group in killed or inc != incarnation[group]:
                    continue  # a rank of a group being killed, reporting its own death
                raise RankFailure(rank, f"replica group {group} (incarnation {inc}) rank {rank} raised:\n{payload}")
            if kind == "ok":
                group, inc, rank = who
                if inc == incarnation[group]:
                    run.results[(group, inc, rank)] = pickle.loads(payload)
                continue
            event = payload
            if event["incarnation"] != incarnation[event["group"]]:
                continue  # from a group already killed
            run.events.append(event)
            group, step = event["group"], event["step"]
            if event["kind"] == "ready":
                ready.add((group, event["rank"], event["incarnation"]))
                if len(ready) == sum(group_size for g in range(replicas) if g not in killed):
                    go.set()
                if not hold.is_set() and all((group, r, incarnation[group]) in ready for r in range(group_size)):
                    hold.set()  # the returning group's managers heartbeat: the others go on
            if event["kind"] == "fault_point":
                reached.setdefault(step, set()).add((group, event["rank"]))
            fault = next((f for f in pending.values() if event["kind"] == "fault_point" and f.at_step == step
                          and incarnation[f.group] == 0 and f.group not in killed), None)
            # The kill lands once every live rank has reached this step's fault point, after its forward pass: the
            # quorum of the step formed and every group's process group configured, as in a failure mid-step
            # (a kill during another group's reconfiguration is a different drill).
            if fault is not None and {(g, r) for g in range(replicas) if g not in killed
                                      for r in range(group_size)} <= reached[step]:
                if policy == "restart_all":
                    del pending[fault.group]
                    restart_everyone()
                else:
                    if fault.restart_at_step is not None:
                        hold.clear()  # the others will wait for it at its restart step
                    kill(fault.group)
                    killed.add(fault.group)
            if event["kind"] == "fault_point" and policy == "heal" and group not in killed:
                for f in list(pending.values()):
                    if f.group in killed and f.restart_at_step is not None and step >= f.restart_at_step:
                        killed.discard(f.group)
                        incarnation[f.group] += 1
                        del pending[f.group]
                        started_go = ctx.Event()
                        started_go.set()  # a returning group does not wait: the others are training
                        start(f.group, started_go)
        return run
    finally:
        stop_processes(every)
        server.shutdown()
        for reader in pipes:
            reader.close()
        for f in Path(stack_dir).glob("*"):
            f.unlink(missing_ok=True)
        os.rmdir(stack_dir)
