"""Ungraded: ``project/run_3d.py`` end to end on Multi30k (dp 1 x pp 2 x tp 2 on 4 ranks, 2 steps),
its trace, and its input checks (before any process starts)."""
from __future__ import annotations

import json
import math

import pytest

from project.run_3d import parse_args

STEPS = 2


def _argv(workdir, *extra):
    return ["--batch_size", "8", "--micro_batches", "2", "--max_batches", str(STEPS), "--max_val_batches", "1",
            "--n_bleu", "2", "--dropout", "0", "--workdir", str(workdir), "--quiet", "--timeout", "300", *extra]


@pytest.mark.needs_solution
@pytest.mark.timeout(400)
def test_run_3d_trains_and_writes_results_trace_and_profiles(tmp_path):
    from project.run_3d import main

    trace = tmp_path / "trace.json"
    assert main(_argv(tmp_path, "--dp", "1", "--pp", "2", "--tp", "2", "--trace", str(trace), "--profile")) == 0
    results = [json.loads((tmp_path / f"three_d_rank{r}_results_epoch0.json").read_text()) for r in range(4)]
    for rank, r in enumerate(results):
        for key in ("validation_loss", "bleu", "training_time", "tokens_per_sec", "train_loss"):
            assert math.isfinite(r[key]), f"rank {rank}: {key} = {r[key]}"
        assert r["steps"] == STEPS and r["config"]["mode"] == "three_d"
        assert [e["kind"] for e in r["timeline"]].count("F") == 2 and len(r["timeline"]) == 4
        assert set(r["comm_per_step"]) >= {"pp", "tp", "embedding"}, r["comm_per_step"]
        assert r["coordinates"] == {"pp": rank // 2, "dp": 0, "tp": rank % 2}
    assert len({r["train_loss"] for r in results}) == 1, "ranks disagree about the loss"
    for rank, r in enumerate(results):  # the last step's communication, on the same clock, inside the step
        begin, end = r["step_span"]
        comm = r["comm_timeline"]
        assert all(begin <= e["start"] <= e["end"] <= end for e in comm + r["timeline"]), (rank, begin, end, comm)
        kinds = [(e["kind"], e["group"]) for e in comm]
        assert kinds.count(("send", "pp")) == 2 and kinds.count(("recv", "pp")) == 2, kinds  # 2 micro-batches
        assert ("all_reduce", "tp") in kinds and kinds.count(("all_reduce", "embedding")) == 1, kinds
        last_backward = max(e["end"] for e in r["timeline"] if e["kind"] == "B")
        tied, = [e for e in comm if e["group"] == "embedding"]
        assert tied["start"] >= last_backward and tied["bytes"] > 0, "the tied all-reduce follows the schedule"

    # the run's trace (course.trace): a process per rank named by its coordinates, a thread per row
    events = json.loads(trace.read_text())["traceEvents"]
    assert all({"ph", "pid", "tid"} <= set(e) for e in events)
    names = {e["pid"]: e["args"]["name"] for e in events if e["name"] == "process_name"}
    assert names[3] == "rank 3 (pp 1, dp 0, tp 1)" and len(names) == 4
    rows = {(e["pid"], e["tid"]): e["args"]["name"] for e in events if e["name"] == "thread_name"}
    spans = [dict(e, row=rows[(e["pid"], e["tid"])]) for e in events if e["ph"] == "X"]
    for rank, r in enumerate(results):
        mine = [e for e in spans if e["pid"] == rank]
        steps = sorted((e for e in mine if e["row"] == "step"), key=lambda e: e["ts"])
        assert [e["name"] for e in steps] == [f"step {n}" for n in range(STEPS)]
        for n, step in enumerate(steps):  # F and B of 2 micro-batches, the optimizer, the communication: inside
            inside = [e for e in mine if step["ts"] <= e["ts"] and e["ts"] + e["dur"] <= step["ts"] + step["dur"] + 1
                      and e["row"] in ("compute", "communication")]
            compute = sorted(e["name"] for e in inside if e["row"] == "compute")
            assert compute == ["B0", "B1", "F0", "F1", "optimizer"], (rank, n, compute)
            comm = [e["name"] for e in inside if e["row"] == "communication"]
            assert comm.count("send pp") == 2 and comm.count("recv pp") == 2, (rank, n, comm)
            assert comm.count("all_reduce embedding") == 1 and "all_reduce tp" in comm, (rank, n, comm)
            assert all(e["args"]["bytes"] > 0 for e in inside if e["row"] == "communication")
        assert {e["name"] for e in mine if e["row"] == "evaluation"} >= {"evaluation", "validation loss"}
        profiled = [e for e in mine if e["row"].startswith("torch.profiler")]  # --profile: on the same clock
        assert any(e["name"].startswith("aten::") for e in profiled), "the rank's torch.profiler events"
        assert steps[0]["ts"] <= min(e["ts"] for e in profiled) <= max(e["ts"] for e in profiled) <= steps[-1]["ts"] + \
            steps[-1]["dur"] + 1e5
        profile = tmp_path / f"three_d_rank{rank}_torch_profile.json"  # named after the run's results and rank
        assert profile.is_file() and profile.stat().st_size < 20e6
        assert names[rank] in json.loads(profile.read_text())["traceName"]


@pytest.mark.parametrize("extra,message", [
    (["--dp", "1", "--pp", "5", "--tp", "1"], "--pp 5 is more than the 4 transformer blocks"),
    (["--dp", "1", "--pp", "1", "--tp", "3"], "--tp 3 does not divide"),
    (["--dp", "3", "--pp", "1", "--tp", "1"], "not divisible by --dp 3 x --micro_batches 2"),
    (["--dp", "0"], "--dp must be a whole number"),
    (["--max_grad_norm", "0"], "--max_grad_norm must be positive"),
])
def test_bad_input_stops_before_any_process_starts(tmp_path, capsys, extra, message):
    with pytest.raises(SystemExit):
        parse_args(_argv(tmp_path, "--preset", "tiny", *extra))
    assert message in capsys.readouterr().err


def test_time_breakdown_gives_every_instant_of_the_step_to_one_category():
    from three_d.trace import time_breakdown

    def span(row, start, end, **args):
        return {"name": "", "row": row, "start": start, "end": end, "args": args}

    spans = [span("compute", 0.0, 1.0, kind="F"), span("compute", 2.0, 4.0, kind="B"),
             span("compute", 4.5, 4.9, optimizer="AdamW"), span("step", -0.5, 5.0)]  # not counted: steps, optimizer
    spans += [span("communication", a, b, kind=kind, group=group) for kind, group, a, b in
              [("all_reduce", "tp", 0.5, 0.7), ("recv", "pp", 1.0, 1.5), ("all_reduce", "embedding", 4.0, 4.25),
               ("all_reduce", "dp", 4.25, 4.5), ("send", "pp", 3.0, 3.5)]]
    got = time_breakdown(spans, -0.5, 5.0)
    want = {"forward": 0.8, "backward": 1.5, "tp collectives": 0.2, "pp send/recv": 1.0, "dp all-reduce": 0.25,
            "tied all-reduce": 0.25, "other communication": 0.0, "idle": 1.5}
    assert got == pytest.approx(want, abs=1e-12)  # float64 sums of <= 10 lengths of O(1) s: ~10 x 2^-53 ~ 1e-15
