"""An elastic run on one machine: three "nodes" (torchrun agents, one rank each) — one is killed, one joins.

    python project/elastic_demo.py                       # tiny GPT-2, 48 steps, ~1 min on 2 cores
    python project/elastic_demo.py --figure elastic.png  # and the figure: world size and loss over the steps

What it does, with ``python project/elastic.py --nnodes 1:2 --nproc_per_node 1`` on 127.0.0.1 for every node:

1. starts node 0 (it hosts the c10d rendezvous: the node at ``--rdzv_endpoint`` must outlive the run) and, once
   its rendezvous store listens, node 1: the run trains at world 2;
2. after step ``--kill_after`` kills node 1's agent with SIGKILL (its worker dies with it): node 0's worker loses
   its peer, its agent restarts it (``--max_restarts``), the rendezvous closes with node 0 alone, and the run goes
   on at world 1 from the latest checkpoint (``--checkpoint_every``), each step's two micro-batches on one rank;
3. once that world-1 attempt has trained ``--join_after`` steps, lets node 2 join: node 2's agent was started at the beginning
   and held before its rendezvous (so that it joins at once instead of after its imports); node 0's agent sees
   it waiting, stops its worker, and the run goes on at world 2 again — from the latest checkpoint.

Each attempt's rank 0 prints what changed and what it cost; at the end the run's log and results file
(``<workdir>/work/elastic_log.jsonl``, ``<workdir>/work/rank0_results_epoch0.json``, ``elastic`` entry) hold every
attempt, step, loss and restart (:mod:`course.elastic`), and ``<workdir>/elastic_demo.json`` the results with the
machine it ran on and its load (``course.benchmarking.machine``: the seconds lost depend on it).
``tests/course/test_elastic.py`` runs it and checks the losses against the uninterrupted run's, the data order and
that no process is left.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

if __name__ == "__main__":  # run as a file: import the packages of the tree this script sits in
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from course.elastic import log_path, read_events  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
ELASTIC = str(REPO / "project" / "elastic.py")
# Node 2's agent: checks its request and imports what the agent needs, then waits for a line on stdin before it
# joins (end of input: it leaves without joining).
HELD = ("import sys; sys.path.insert(0, {repo!r}); import project.elastic as e, torch.distributed.run; "
        "request = e.parse(sys.argv[1:]); line = sys.stdin.readline(); "
        "sys.exit(e.run_agent(*request) if line else 0)")
SMALL = ["--preset", "tiny", "--batch_size", "8", "--model_max_length", "32", "--vocab_size", "1000",
         "--max_train_examples", "2000", "--n_bleu", "0", "--max_val_batches", "1", "--quiet", "--dropout", "0"]


@dataclass
class DemoRun:
    """What :func:`run_demo` saw: the agents' exit codes and output (``node0`` ... ``node2``), the step after which
    node 1 was killed and when (wall clock), the pids of node 1's agent and of its workers at the kill, and the
    run's log events."""

    workdir: Path
    returncodes: dict = field(default_factory=dict)
    outputs: dict = field(default_factory=dict)
    killed_after: int | None = None
    killed_at: float | None = None
    killed_pids: set = field(default_factory=set)
    events: list = field(default_factory=list)


def _children(pid: int) -> set[int]:
    """The processes whose parent is ``pid`` (from /proc; empty where there is none)."""
    found = set()
    for entry in Path("/proc").iterdir() if Path("/proc/self/stat").exists() else []:
        if entry.name.isdigit():
            try:
                if int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1]) == pid:
                    found.add(int(entry.name))
            except (OSError, ValueError, IndexError):
                continue
    return found


def threads_per_rank() -> int:
    """The CPU threads of each rank: this machine's cores shared by the (at most) 2 ranks that train at once —
    every agent here is a "node" of the same machine (``OMP_NUM_THREADS``, which elastic runs honour)."""
    return max(1, (os.cpu_count() or 1) // 2)


def _listening(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def run_demo(workdir, *, steps: int = 48, kill_after: int = 4, join_after: int = 2, checkpoint_every: int = 3,
             max_restarts: int = 2, timeout: float = 600.0, extra: list[str] = (), on_kill=None) -> DemoRun:
    """Run the scenario of the module docstring in ``workdir`` (see there); returns the :class:`DemoRun`.

    ``on_kill(agent_pid)`` (optional) is called just before node 1's agent is killed. Every process it started is
    killed (its process group) before it returns, whatever happened.

    Raises:
        TimeoutError: a stage did not come within ``timeout`` seconds (the message names it, with the agents'
            output so far).
    """
    from course.launch import free_port

    workdir = Path(workdir).resolve()  # the agents run in the repository's folder
    work = workdir / "work"
    work.mkdir(parents=True, exist_ok=True)
    port = free_port()
    common = ["--nnodes", "1:2", "--nproc_per_node", "1", "--rdzv_endpoint", f"127.0.0.1:{port}", "--rdzv_id",
              "elastic-demo", "--max_restarts", str(max_restarts), "--join_timeout", "60", "--last_call_timeout", "1",
              "--monitor_interval", "0.2", "--mode", "dp", *SMALL, "--checkpoint_every", str(checkpoint_every),
              "--max_batches", str(steps), "--device", "cpu", "--workdir", str(work), *extra]
    env = dict(os.environ, OMP_NUM_THREADS=str(threads_per_rank()), PYTHONUNBUFFERED="1")
    demo = DemoRun(workdir)
    logs = {name: open(workdir / f"{name}.log", "w") for name in ("node0", "node1", "node2")}
    agents: dict[str, subprocess.Popen] = {}
    log = log_path(work)

    def start(name, command, **kwargs):
        agents[name] = subprocess.Popen(command, stdout=logs[name], stderr=subprocess.STDOUT, start_new_session=True,
                                        env=env, cwd=REPO, **kwargs)

    def wait(condition, what):
        deadline = time.monotonic() + timeout
        while not condition():
            ended = [n for n, p in agents.items() if p.poll() is not None and n != "node1"]
            if ended or time.monotonic() > deadline:
                text = "\n".join(f"--- {n}:\n{(workdir / f'{n}.log').read_text()[-2500:]}" for n in agents)
                why = f"{', '.join(ended)} ended" if ended else f"not within {timeout:g} s"
                raise TimeoutError(f"elastic demo: no {what} ({why})\n{text}")
            time.sleep(0.05)

    def steps_of(world, after_attempt=0):
        return [e for e in read_events(log) if e["event"] == "step" and e["world_size"] == world
                and e["attempt"] > after_attempt]

    try:
        start("node0", [sys.executable, ELASTIC, *common])
        wait(lambda: _listening(port), "rendezvous store of node 0")
        start("node1", [sys.executable, ELASTIC, *common])
        start("node2", [sys.executable, "-c", HELD.format(repo=str(REPO)), *common], stdin=subprocess.PIPE, text=True)
        wait(lambda: [e for e in steps_of(2) if e["step"] >= kill_after], f"step {kill_after} at world 2")
        if on_kill is not None:
            on_kill(agents["node1"].pid)
        demo.killed_pids = {agents["node1"].pid, *_children(agents["node1"].pid)}
        demo.killed_after = max(e["step"] for e in read_events(log) if e["event"] == "step")
        demo.killed_at = time.time()
        os.kill(agents["node1"].pid, signal.SIGKILL)
        wait(lambda: len(steps_of(1)) >= join_after, f"{join_after} steps at world 1 after the kill")
        shrunk = steps_of(1)[0]["attempt"]
        agents["node2"].stdin.write("join\n")
        agents["node2"].stdin.flush()
        wait(lambda: steps_of(2, after_attempt=shrunk), "step at world 2 after node 2 joined")
        for name in ("node0", "node2"):
            try:
                agents[name].wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                raise TimeoutError(f"elastic demo: {name} did not finish within {timeout:g} s") from None
    finally:
        for name, proc in agents.items():
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            demo.returncodes[name] = proc.returncode
        for f in logs.values():
            f.close()
        demo.outputs = {name: (workdir / f"{name}.log").read_text() for name in logs}
        demo.events = read_events(log)
    return demo


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--workdir", default="workdir/elastic_demo", help="a new folder for the run")
    parser.add_argument("--steps", type=int, default=48, help="optimizer steps of the run")
    parser.add_argument("--kill_after", type=int, default=4, help="node 1 is killed once this step is done")
    parser.add_argument("--join_after", type=int, default=2, help="node 2 joins once the run has done this many steps "
                                                                  "at world 1")
    parser.add_argument("--checkpoint_every", type=int, default=3, help="a checkpoint every N steps")
    parser.add_argument("--record", default=None, help="where to write the run's results with the machine it ran on "
                                                       "(default: <workdir>/elastic_demo.json)")
    parser.add_argument("--figure", default=None, help="write the figure of the run to this PNG")
    options = parser.parse_args(argv)
    if Path(options.workdir).exists() and any(Path(options.workdir).iterdir()):
        parser.error(f"--workdir {options.workdir} is not empty; choose a new folder")
    from course.benchmarking import describe, finish, machine

    info = machine(busy_ranks=2)  # the load of other processes, before the ranks start
    demo = run_demo(options.workdir, steps=options.steps, kill_after=options.kill_after, join_after=options.join_after,
                    checkpoint_every=options.checkpoint_every)
    finish(info)
    print(demo.outputs["node0"][-3000:])
    if any(demo.returncodes[n] for n in ("node0", "node2")):
        print(f"the run failed: exit codes {demo.returncodes}", file=sys.stderr)
        return 1
    from course.results import write_json

    text = (Path(options.workdir) / "work" / "rank0_results_epoch0.json").read_text()
    results = json.loads(text.replace(str(Path(options.workdir).resolve()), options.workdir))  # paths as given
    record = write_json(options.record or Path(options.workdir) / "elastic_demo.json", {**results, "machine": info})
    print(f"machine: {describe(info)}\nthe run's results and machine: {record}")
    if options.figure:
        from course.plots.elastic import plot_elastic_run

        print(f"figure: {plot_elastic_run(record, options.figure)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
