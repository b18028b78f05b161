"""Elastic training: this node's torchrun agent, for a run that keeps training when nodes leave or join.

    # on every node (the same command; node0 is any node every node can reach)
    python project/elastic.py --nnodes 1:4 --nproc_per_node 8 --rdzv_endpoint node0:29400 --rdzv_id run1 \\
        --max_restarts 3 --mode dp --checkpoint_every 50 --workdir /shared/runs/elastic

runs torchrun's agent in this process with a c10d rendezvous — ``torchrun --nnodes=MIN:MAX --nproc_per_node=G
--rdzv_backend=c10d --rdzv_endpoint=HOST:PORT --rdzv_id=ID --max_restarts=N project/train.py --mode dp ...
--elastic MIN:MAX`` (printed before it starts) — and adds what plain torchrun leaves to the user:

* **the request is checked first** (exit code 2, nothing started): the mode's options by its own configuration,
  and what elasticity needs — a mode whose checkpoints load at another world size (``dp``), ``--checkpoint_every``,
  plain data parallelism, a global batch that splits into ``MAX x G`` micro-batches, no ``--dp`` (the world is
  torchrun's);
* **the workers continue the run** at whatever world the rendezvous gives (:mod:`data_parallel.elastic`: the same
  global batch by gradient accumulation, the same data order, the latest checkpoint resharded by DCP); each
  attempt's rank 0 prints what changed and what it cost, and the run's results file keeps the history
  (:mod:`course.elastic`);
* **failures end with a sentence naming what happened** (exit code 1): a rendezvous that timed out before the run
  started (fewer than MIN nodes came), a world that fell below MIN (nodes were lost and too few re-joined within
  ``--join_timeout``), a node lost with no restarts left (a worker's collective lost its peer), a worker that
  failed for another reason, a rendezvous closed by the other nodes.

The agents' shared TCP store is switched off (``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1``): each rendezvous round's
rank 0 hosts a store of its own, so nothing of an earlier round is read by a later one.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

if __name__ == "__main__":  # run as a file: import the packages of the tree this script sits in
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from course.elastic import describe_cost, describe_restart, log_path, parse_nnodes, read_events, restarts  # noqa: E402
from project.modes import MODES  # noqa: E402

PROG = "elastic.py"
TRAIN_SCRIPT = str(Path(__file__).resolve().parent / "train.py")
_LOST_PEER = ("connection closed by peer", "connection reset by peer", "broken pipe", "connection refused",
              "socket closed", "read error", "peer")


def front_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG, allow_abbrev=False, formatter_class=argparse.ArgumentDefaultsHelpFormatter,
        description="This node's torchrun agent for an elastic run: keeps training when nodes leave or join "
                    "(c10d rendezvous). Every other option is the mode's (python project/train.py --mode dp --help).")
    parser.add_argument("--nnodes", required=True, metavar="MIN:MAX", help="nodes the run may shrink and grow between")
    parser.add_argument("--nproc_per_node", type=int, default=1, help="ranks (GPUs) per node")
    parser.add_argument("--rdzv_endpoint", required=True, metavar="HOST:PORT",
                        help="the rendezvous: a node every node can reach (it hosts the rendezvous store)")
    parser.add_argument("--rdzv_id", default="llmsys-elastic", help="the run's id: the same on every node")
    parser.add_argument("--max_restarts", type=int, default=3,
                        help="restarts after a worker failure (a lost node); nodes joining do not count")
    parser.add_argument("--join_timeout", type=int, default=600,
                        help="seconds a rendezvous waits for MIN nodes (at the start and after a node is lost)")
    parser.add_argument("--last_call_timeout", type=int, default=30,
                        help="seconds a rendezvous with MIN nodes still waits for more, up to MAX")
    parser.add_argument("--monitor_interval", type=float, default=None,
                        help="seconds between the agent's checks of its workers and of nodes waiting to join "
                             "(default: torchrun's)")
    parser.add_argument("--local_addr", default=None, help="this node's address as the others reach it "
                                                           "(default: its host name)")
    parser.add_argument("--mode", required=True, choices=tuple(MODES), help="the training mode (elastic: dp)")
    return parser


def parse(argv: list[str] | None = None):
    """``(front options, the mode's options, the mode's configuration)``, checked on this node before anything
    starts (see the module docstring); exits with code 2 and a message otherwise."""
    from course.config import ConfigError

    parser = front_parser()
    front, rest = parser.parse_known_args(argv)
    try:
        low, high = parse_nnodes(front.nnodes)
    except ValueError as exc:
        parser.error(str(exc))
    if front.nproc_per_node < 1 or front.max_restarts < 0 or min(front.join_timeout, front.last_call_timeout) < 1:
        parser.error("--nproc_per_node must be >= 1, --max_restarts >= 0, --join_timeout and --last_call_timeout "
                     ">= 1 (whole seconds)")
    mode = MODES[front.mode]
    if not mode.config.resumes_at_another_world_size or "elastic" not in mode.config.__dataclass_fields__:
        parser.error(f"--mode {front.mode} cannot train elastically: its checkpoints load at the same number of ranks "
                     "only; an elastic run trains --mode dp")
    prog = f"{PROG} --mode {front.mode}"
    values = vars(mode.config.parser(prog).parse_args(rest))
    if values.get("dp") is not None:
        parser.error(f"--dp {values['dp']}: an elastic run's dp is the world torchrun gives (nodes x "
                     "--nproc_per_node); leave --dp out")
    if values.get("elastic") is not None:
        parser.error("--elastic is set from --nnodes; leave it out")
    config = mode.config(**{**values, "dp": front.nproc_per_node})  # this node's ranks, for the device checks
    try:
        config.resolve()
        config.check()
        from course.checkpoint import checkpoint_root, latest_checkpoint
        from project.options.run_data_parallel import check_elastic

        if latest_checkpoint(checkpoint_root(config.workdir, config.results_prefix)) is None:
            config.check_environment()  # a new run; a node joining a run in progress leaves the checks of its files
            # to the workers, which start once the rendezvous has stopped every worker that writes them
        config.elastic = front.nnodes
        memory, comm = config.memory_options(), config.communication_options()
        check_elastic(config, memory + comm, nproc_per_node=front.nproc_per_node)
    except ConfigError as exc:
        parser.error(str(exc))
    return front, rest, config


def torchrun_args(front, rest: list[str]) -> list[str]:
    """torchrun's command line (without ``torchrun``) for this node's agent."""
    args = [f"--nnodes={front.nnodes}", f"--nproc_per_node={front.nproc_per_node}", "--rdzv_backend=c10d",
            f"--rdzv_endpoint={front.rdzv_endpoint}", f"--rdzv_id={front.rdzv_id}",
            f"--max_restarts={front.max_restarts}",
            f"--rdzv_conf=join_timeout={front.join_timeout},last_call_timeout={front.last_call_timeout}"]
    if front.monitor_interval is not None:
        args.append(f"--monitor_interval={front.monitor_interval:g}")
    if front.local_addr:
        args.append(f"--local_addr={front.local_addr}")
    return [*args, TRAIN_SCRIPT, "--mode", front.mode, *rest, "--elastic", front.nnodes]


def _lost_peer(message: str) -> bool:
    text = message.lower()
    return any(marker in text for marker in _LOST_PEER)


def explain(exc: BaseException, front, events: list[dict]) -> str:
    """The sentence an elastic run ends with when torchrun's agent raised ``exc``; ``events``: the run's log
    (:mod:`course.elastic`) since this agent started."""
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.elastic.rendezvous.api import (RendezvousClosedError, RendezvousConnectionError,
                                                          RendezvousError, RendezvousTimeoutError)

    low, _ = parse_nnodes(front.nnodes)
    where = f"rendezvous {front.rdzv_endpoint} (--rdzv_id {front.rdzv_id})"
    started = [e for e in events if e.get("event") == "start"]
    done = [e["step"] for e in events if e.get("event") == "step"]
    if isinstance(exc, RendezvousTimeoutError):
        if not started:
            return (f"the rendezvous timed out: fewer than MIN={low} node(s) joined the {where} within "
                    f"--join_timeout {front.join_timeout} s; start this command on at least {low} nodes with the same "
                    "--rdzv_endpoint and --rdzv_id, or lower MIN")
        last = started[-1]
        nodes = ", ".join(f"{n['host']}:{n['agent_pid']}" for n in last["nodes"])
        return (f"the world fell below MIN={low} node(s): the last attempt ran on {len(last['nodes'])} node(s) "
                f"({nodes}), the run was interrupted after step {max(done, default=last['resumed_step'])}, and fewer "
                f"than {low} node(s) re-joined the {where} within --join_timeout {front.join_timeout} s; start "
                "agents on more nodes with the same --rdzv_id to continue from the latest checkpoint")
    if isinstance(exc, RendezvousConnectionError):
        return (f"the {where} cannot be reached: the node that hosts it (the one at --rdzv_endpoint) is gone or "
                "unreachable; in a c10d rendezvous that node must outlive the run (choose a node that stays)")
    if isinstance(exc, RendezvousClosedError):
        return (f"the {where} was closed: the run ended on the other nodes (finished, or failed there) before this "
                "node could join it")
    if isinstance(exc, ChildFailedError):
        rank, failure = exc.get_first_failure()
        how = (f"was killed by {failure.signal_name()}" if failure.exitcode < 0 else
               f"exited with code {failure.exitcode}")
        message = failure.message.get("message", "") if isinstance(failure.message, dict) else failure.message
        message = " ".join(str(message).split())[:300]  # a rank's error file (torch's @record): {"message": ...}
        restarts_left = f"no restarts are left (--max_restarts {front.max_restarts})"
        if _lost_peer(message):
            return (f"a node was lost: rank {rank} {how} when its collective lost its peer ({message}), and "
                    f"{restarts_left}")
        return f"rank {rank} {how} ({message}), and {restarts_left}"
    if isinstance(exc, RendezvousError):
        return f"the {where} failed: {type(exc).__name__}: {exc}"
    return f"torchrun's agent failed: {type(exc).__name__}: {exc}"


def print_history(workdir, results_prefix: str = "", nnodes: str | None = None) -> None:
    """The run's attempts and what each restart cost, from its log."""
    events = read_events(log_path(workdir, results_prefix))
    for r in restarts(events):
        print(describe_restart(r, nnodes))
        if r["seconds_lost"] is not None:
            print(describe_cost(r))


def main(argv: list[str] | None = None) -> int:
    return run_agent(*parse(argv))


def run_agent(front, rest: list[str], config) -> int:
    """Run this node's agent for a checked request (:func:`parse`) until the run ends; returns the exit code
    (0; 1 with the explanation on stderr when the run failed; 128 + the signal when the agent was stopped)."""
    args = torchrun_args(front, rest)
    os.environ["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] = "1"
    print("elastic: torchrun " + " ".join(args), flush=True)
    began = time.time()
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.run import parse_args, run

    try:
        run(parse_args(args))
    except SignalException as exc:
        print(f"elastic run stopped: this node's agent received {exc.sigval.name}; its workers were stopped",
              file=sys.stderr, flush=True)
        return 128 + int(exc.sigval)
    except Exception as exc:  # noqa: BLE001 - every failure of the agent ends with its explanation
        events = read_events(log_path(config.workdir, config.results_prefix), since=began)
        print(f"elastic run failed: {explain(exc, front, events)}", file=sys.stderr, flush=True)
        return 1
    print_history(config.workdir, config.results_prefix, front.nnodes)
    return 0


if __name__ == "__main__":
    sys.exit(main())
