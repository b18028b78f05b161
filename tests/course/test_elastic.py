"""Elastic training (``project/elastic.py``, :mod:`data_parallel.elastic`, :mod:`course.elastic`).

The run that matters (``project/elastic_demo.py`` on this machine: torchrun agents with ``--nnodes 1:2``, one
rank each): two agents train at world 2; one agent is killed with SIGKILL after step 4 (its worker dies with it);
the survivor re-rendezvouses alone, loads the latest checkpoint (written by 2 ranks: DCP reshards it for 1) and
goes on at world 1 past its next checkpoint; a third agent joins and the run grows back to world 2, from that
checkpoint (written by 1 rank, resharded for 2).

**What must hold, and why exactly.** Every execution of every step — the ones a restart threw away and redid
included, at world 2, 1 and 2 — has the loss of the uninterrupted run, computed here in one process from the
definition (the mean over the global batch's two micro-batches of their mean target-token losses; AdamW): *equal,
not close*. The run's step accumulates the micro-batches' gradients scaled by W/M (1 or 1/2: powers of two, so
every product is exact) and averages over W ranks (a sum of two terms, commutative, exact; a division by 1 or 2,
exact), dropout is off and every process computes with as many threads (the demo's OMP_NUM_THREADS: a reduction
split over another number of threads rounds differently) — so every world computes the same bits
(data_parallel/elastic.py), and the run ends with the uninterrupted run's weights (SHA-256 of every parameter).
The steps' examples are the epoch's global batches in order: within the epoch none is trained twice or skipped.
The lost work is printed (steps redone, seconds) and recorded with ``--nnodes`` and ``--max_restarts`` in the
results file; no process is left behind.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.course.test_fail_safe import assert_all_gone, descendants, needs_proc

REPO = Path(__file__).resolve().parents[2]
STEPS, KILL_AFTER, EVERY, MAX_RESTARTS = 32, 4, 3, 2


def reference_run(workdir: Path, steps: int):
    """The uninterrupted run, in this process, from the definition: per step, the global batch of the epoch's
    shuffle, its two micro-batches' mean losses each backpropagated divided by 2, one AdamW step. Returns
    ``(losses, global batches, the final weights' SHA-256)``."""
    import torch

    from course.loss import model_loss
    from course.model import parameter_fingerprint
    from course.task import build_model, prepare_data
    from data_parallel.data_order import global_batch_indices
    from project.elastic_demo import threads_per_rank
    from project.options.run_data_parallel import DataParallelConfig

    config = DataParallelConfig.for_test(dp=1, preset="tiny", batch_size=8, model_max_length=32, vocab_size=1000,
                                         max_train_examples=2000, dropout=0.0, device="cpu", workdir=str(workdir))
    data = prepare_data(config)  # the run's tokenizer, cached in its folder
    threads = torch.get_num_threads()
    torch.set_num_threads(threads_per_rank())  # as each rank (OMP_NUM_THREADS, project/elastic_demo.py)
    try:
        model = build_model(config, data.tokenizer.vocab_size)
        optimizer = torch.optim.AdamW(model.parameters(), lr=config.learning_rate)
        batches = global_batch_indices(len(data.train), config.batch_size, 1, config.seed)[:steps]
        losses = []
        for positions in batches:
            optimizer.zero_grad(set_to_none=True)
            micro = [model_loss(model, data.collate([data.train[i] for i in half]))
                     for half in (positions[:4], positions[4:])]
            for loss in micro:
                (loss / 2).backward()
            optimizer.step()
            losses.append(sum(loss.item() for loss in micro) / 2)
        fingerprint = parameter_fingerprint(model)
    finally:
        torch.set_num_threads(threads)
    return losses, batches, fingerprint


@needs_proc
@pytest.mark.needs_solution
@pytest.mark.timeout(420)
def test_an_elastic_run_shrinks_and_grows_and_trains_the_uninterrupted_runs_losses(tmp_path):
    from course.elastic import attempts, restarts, trajectory
    from project.elastic_demo import run_demo

    workers: set[int] = set()
    demo = run_demo(tmp_path, steps=STEPS, kill_after=KILL_AFTER, join_after=EVERY + 1, checkpoint_every=EVERY,
                    max_restarts=MAX_RESTARTS, timeout=360, on_kill=lambda agent: workers.update(descendants(agent)))
    output = "\n".join(f"--- {n}:\n{text[-4000:]}" for n, text in demo.outputs.items())
    assert demo.returncodes["node0"] == 0 and demo.returncodes["node2"] == 0, output
    assert workers, "the killed agent had no worker"
    assert_all_gone(workers, within=0.0)  # the killed agent's worker died with it (the run ended long after)

    # the attempts: world 2, node 1 killed -> world 1 (a restart after a failure), node 2 joined -> world 2
    runs, changes = attempts(demo.events), restarts(demo.events)
    assert [a["world_size"] for a in runs] == [2, 1, 2], runs
    lost, joined = changes
    assert lost["cause"] == "a worker failed" and len(lost["nodes_lost"]) == 1 and not lost["nodes_joined"]
    assert joined["cause"] == "membership change" and len(joined["nodes_joined"]) == 1 and not joined["nodes_lost"]
    # world 1 trained EVERY + 1 steps before node 2 joined, so it wrote a checkpoint that the world of 2 resumed from
    assert lost["interrupted_after"] >= KILL_AFTER and runs[1]["steps"][1] >= runs[1]["resumed_step"] + EVERY + 1
    assert joined["resumed_step"] >= lost["resumed_step"] + EVERY
    for change in changes:  # each resumed from a checkpoint at most one interval old
        assert change["resumed_step"] % EVERY == 0 and 0 <= change["steps_redone"] <= EVERY
        assert change["steps_redone"] == change["interrupted_after"] - change["resumed_step"]
        assert change["seconds_lost"] >= change["downtime_seconds"] > 0
    node0 = demo.outputs["node0"]
    checkpoint = tmp_path / "work" / "checkpoints" / f"step{lost['resumed_step']:08d}"
    assert (f"resuming from {checkpoint}: epoch 0, after step {lost['resumed_step']} of it (global step "
            f"{lost['resumed_step']}), written by 2 ranks, continued by 1") in node0, node0[-3000:]
    assert f"(global step {joined['resumed_step']}), written by 1 ranks, continued by 2" in node0, node0[-3000:]
    for change in changes:  # printed: what changed, and what it cost
        assert f"elastic: attempt {change['attempt']} ({change['cause']}" in node0
        assert (f"elastic: back at step {change['interrupted_after']} in attempt {change['attempt']}: lost "
                f"{change['steps_redone']} step(s) and {change['seconds_lost']:.1f} s") in node0

    # the losses: every execution of every step is the uninterrupted run's, bit for bit
    reference, batches, fingerprint = reference_run(tmp_path / "work", STEPS)
    executions = [e for e in demo.events if e["event"] == "step"]
    assert [e["step"] for e in trajectory(demo.events)] == list(range(1, STEPS + 1))
    for e in executions:
        assert e["loss"] == reference[e["step"] - 1], (
            f"step {e['step']} in attempt {e['attempt']} (world {e['world_size']}): {e['loss']} vs the uninterrupted "
            f"run's {reference[e['step'] - 1]}")
    # the data: each step trained on the epoch's global batch of that step (rank 0's micro-batch first) ...
    for e in executions:
        assert e["examples"] == batches[e["step"] - 1], f"step {e['step']}, attempt {e['attempt']}"
    # ... so the run's steps saw the first STEPS x 8 examples of the shuffle, none twice and none skipped
    seen = [i for e in trajectory(demo.events) for i in e["examples"]]
    assert len(seen) == len(set(seen)) == STEPS * 8
    assert seen == [i for b in batches for i in b]

    # the results file: the elastic bounds, --max_restarts, the restarts and their cost
    results = json.loads((tmp_path / "work" / "rank0_results_epoch0.json").read_text())
    elastic = results["elastic"]
    assert (elastic["nnodes"], elastic["min_nodes"], elastic["max_nodes"]) == ("1:2", 1, 2)
    assert elastic["max_restarts"] == MAX_RESTARTS and elastic["micro_batches_per_step"] == 2
    assert elastic["restarts"] == changes and elastic["losses"] == reference
    assert elastic["steps_redone"] == sum(c["steps_redone"] for c in changes)
    assert results["config"]["elastic"] == "1:2" and results["config"]["world_size"] == 2
    assert results["param_sha256"] == fingerprint, "the run's final weights are not the uninterrupted run's"
    print(f"elastic run: {[(c['cause'], c['steps_redone'], round(c['seconds_lost'], 1)) for c in changes]}; "
          f"largest loss difference to the uninterrupted run: "
          f"{max(abs(e['loss'] - reference[e['step'] - 1]) for e in executions)}")


def _elastic(*argv: str, **popen) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, str(REPO / "project" / "elastic.py"), *argv], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True,
                            env=dict(os.environ, OMP_NUM_THREADS="1"), **popen)


@needs_proc
@pytest.mark.timeout(120)
def test_a_rendezvous_that_times_out_ends_with_a_message_and_no_process(tmp_path):
    from course.launch import free_port

    proc = _elastic("--nnodes", "2:2", "--rdzv_endpoint", f"127.0.0.1:{free_port()}", "--join_timeout", "1",
                    "--mode", "dp", "--checkpoint_every", "2", "--preset", "tiny", "--device", "cpu",
                    "--workdir", str(tmp_path / "work"))
    seen: set[int] = set()
    deadline = time.monotonic() + 100
    while proc.poll() is None and time.monotonic() < deadline:
        seen |= descendants(proc.pid)
        time.sleep(0.1)
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
    output = proc.communicate()[0]
    assert proc.returncode == 1, output[-3000:]
    assert ("elastic run failed: the rendezvous timed out: fewer than MIN=2 node(s) joined the rendezvous "
            "127.0.0.1:") in output, output[-3000:]
    assert "--join_timeout 1 s" in output
    assert not seen, "a worker started although the rendezvous never completed"
    assert_all_gone(seen | {proc.pid}, within=5.0)


@pytest.mark.parametrize("argv,message", [
    (["--mode", "tp"], "--mode tp cannot train elastically"),
    (["--mode", "dp", "--dp", "2", "--checkpoint_every", "2"], "an elastic run's dp is the world torchrun gives"),
    (["--mode", "dp"], "also give --checkpoint_every N"),
    (["--mode", "dp", "--checkpoint_every", "2", "--zero", "1"], "drop --zero"),
    (["--mode", "dp", "--checkpoint_every", "2", "--batch_size", "6"], "does not split into 4 micro-batches"),
    (["--mode", "dp", "--checkpoint_every", "2", "--nnodes", "3:2"], "1 <= MIN <= MAX"),
], ids=["mode", "dp", "checkpoints", "zero", "batch", "bounds"])
def test_a_bad_elastic_request_stops_before_anything_starts(tmp_path, capsys, argv, message):
    from project.elastic import parse

    front = {"--nnodes": "1:4", "--rdzv_endpoint": "127.0.0.1:1"}
    extra = [a for k, v in front.items() if k not in argv for a in (k, v)]
    with pytest.raises(SystemExit) as stop:
        parse([*extra, *argv, "--device", "cpu", "--workdir", str(tmp_path / "work")])
    assert stop.value.code == 2 and message in capsys.readouterr().err


def test_the_training_refuses_elastic_outside_torchrun_and_outside_its_bounds(monkeypatch):
    from course.config import ConfigError
    from project.options.run_data_parallel import DataParallelConfig

    options = dict(preset="tiny", device="cpu", elastic="1:2", checkpoint_every=2, batch_size=6)
    with pytest.raises(ConfigError, match="start an elastic run with python project/elastic.py"):
        DataParallelConfig.for_test(dp=2, **options)
    for name, value in {"RANK": "0", "WORLD_SIZE": "3", "LOCAL_WORLD_SIZE": "1"}.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("TORCHELASTIC_USE_AGENT_STORE", "False")
    with pytest.raises(ConfigError, match="torchrun started 3 node"):
        DataParallelConfig.for_test(dp=3, **options)
    monkeypatch.setenv("TORCHELASTIC_USE_AGENT_STORE", "True")
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(ConfigError, match="TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1"):
        DataParallelConfig.for_test(dp=2, **options)


def _log(*attempt_specs):
    """A log: per attempt (world size, resumed step, [(step, time)], start time, {node: restart count})."""
    events = []
    for a, (world, resumed, steps, start, nodes) in enumerate(attempt_specs, 1):
        events.append({"event": "start", "attempt": a, "time": start, "world_size": world, "resumed_step": resumed,
                       "nodes": [{"host": "h", "agent_pid": p, "restart_count": c, "ranks": []}
                                 for p, c in nodes.items()]})
        events += [{"event": "step", "attempt": a, "step": s, "time": t, "loss": 1.0, "world_size": world}
                   for s, t in steps]
    return events


def test_what_a_restart_cost_is_counted_from_the_log():
    from course.elastic import restarts, summary

    events = _log((2, 0, [(1, 10.0), (2, 11.0), (3, 12.0), (4, 13.0), (5, 14.0)], 9.0, {1: 0, 2: 0}),
                  (1, 3, [(4, 30.0), (5, 32.0), (6, 34.0)], 29.0, {1: 1}),   # node 2 lost: restart after a failure
                  (2, 6, [(7, 60.0)], 59.0, {1: 1, 3: 0}))                  # node 3 joined, nothing to redo
    first, second = restarts(events)
    assert first == {"attempt": 2, "from_world": 2, "to_world": 1, "nodes_lost": ["h:2"], "nodes_joined": [],
                     "cause": "a worker failed", "interrupted_after": 5, "resumed_step": 3, "steps_redone": 2,
                     "downtime_seconds": 15.0, "redo_seconds": 3.0, "seconds_lost": 18.0}
    assert second["cause"] == "membership change" and second["nodes_joined"] == ["h:3"]
    assert (second["steps_redone"], second["downtime_seconds"], second["seconds_lost"]) == (0, 25.0, 25.0)
    record = summary(events)
    assert record["steps"] == [1, 2, 3, 4, 5, 6, 7] and record["step_attempts"] == [1, 1, 1, 2, 2, 2, 3]
    assert (record["steps_redone"], record["seconds_lost"]) == (2, 43.0)
    # a restart whose redone steps are not yet done again has no cost yet
    assert restarts(events[:8])[0]["seconds_lost"] is None


def test_the_failures_of_an_elastic_run_are_named(tmp_path):
    from types import SimpleNamespace

    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, ProcessFailure
    from torch.distributed.elastic.rendezvous.api import (RendezvousClosedError, RendezvousConnectionError,
                                                          RendezvousTimeoutError)

    from project.elastic import explain

    front = SimpleNamespace(nnodes="2:4", rdzv_endpoint="node0:29400", rdzv_id="run1", join_timeout=30,
                            max_restarts=1)
    started = _log((2, 0, [(1, 10.0), (2, 11.0)], 9.0, {7: 0, 8: 0}))
    assert "the rendezvous timed out: fewer than MIN=2 node(s) joined" in explain(RendezvousTimeoutError(), front, [])
    below = explain(RendezvousTimeoutError(), front, started)
    assert "the world fell below MIN=2 node(s): the last attempt ran on 2 node(s) (h:7, h:8)" in below
    assert "interrupted after step 2" in below and "--join_timeout 30 s" in below
    error = tmp_path / "error.json"  # what a rank's error file holds (torch's @record, project/train.py)
    error.write_text(json.dumps({"message": {"message": "RuntimeError: [gloo/transport/tcp/pair.cc:553] Connection "
                                                        "closed by peer [127.0.0.1]:12474",
                                             "extraInfo": {"py_callstack": "...", "timestamp": "0"}}}))
    lost = ChildFailedError("train.py", {0: ProcessFailure(local_rank=0, pid=1, exitcode=1, error_file=str(error))})
    text = explain(lost, front, started)
    assert text.startswith("a node was lost: rank 0 exited with code 1 when its collective lost its peer")
    assert text.endswith("no restarts are left (--max_restarts 1)")
    error.write_text(json.dumps({"message": {"message": "ValueError: bad", "extraInfo": {"timestamp": "0"}}}))
    other = ChildFailedError("train.py", {3: ProcessFailure(local_rank=1, pid=2, exitcode=1, error_file=str(error))})
    assert explain(other, front, started).startswith("rank 3 exited with code 1 (ValueError: bad)")
    assert "the node that hosts it (the one at --rdzv_endpoint) is gone" in explain(
        RendezvousConnectionError(), front, started)
    assert "was closed: the run ended on the other nodes" in explain(RendezvousClosedError(), front, [])
