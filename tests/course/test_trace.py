"""Ungraded: the one event recorder (course.trace) — spans on one clock, nothing read while inactive, the
spans of a pipeline step inside the step with its sends and receives counted, and a trace file that
chrome://tracing and Perfetto load; the run options --trace, --trace_steps and --profile checked before
any process starts."""
from __future__ import annotations

import json
import time
from unittest import mock

import pytest
import torch

from course import trace


def test_spans_go_to_every_active_recorder_and_nothing_is_read_while_none_is():
    with mock.patch.object(trace, "now", side_effect=AssertionError("clock read with no recorder")):
        assert trace.clock("cpu") is None and not trace.active()
        with trace.span("idle", "compute") as args:  # a no-op: no clock read
            args["seen"] = True
        with trace.step(0):
            pass
    outer, inner = trace.Recorder("cpu"), trace.Recorder("cpu")
    before = time.time()
    with trace.recording(outer):
        with trace.span("a", "compute", micro_batch=0):
            time.sleep(0.01)
        with trace.recording(inner):
            made = trace.record("b", "communication", 1.0, 2.0, group="tp")
    assert [s.name for s in outer.spans] == ["b", "a"]  # by start time
    assert [s.name for s in inner.spans] == ["b"] and inner.spans[0] is made
    a = outer.select("compute", micro_batch=0)[0]
    assert a.end - a.start >= 0.01 and before <= a.start and a.end <= time.time()  # course.measure's wall clock
    assert outer.export()[1] == {"name": "a", "row": "compute", "start": a.start, "end": a.end,
                                 "args": {"micro_batch": 0}}
    assert not trace.active()


def test_a_recorder_keeps_the_last_steps_and_every_span_outside_a_step():
    rec = trace.Recorder(max_steps=2)
    with trace.recording(rec):
        for n in range(5):
            with trace.step(n):
                trace.record(f"F{n}", "compute", n, n + 0.5)
        trace.record("evaluation", "evaluation", 9.0, 10.0)
    assert sorted(s.name for s in rec.spans) == ["F3", "F4", "evaluation", "step 3", "step 4"]
    assert rec.select("step", step=4)[0].args == {"step": 4}
    with pytest.raises(ValueError, match="max_steps"):
        trace.Recorder(max_steps=0)


def test_optimizer_steps_are_spans_while_recording_and_the_hooks_go_away_after():
    from torch.optim.optimizer import _global_optimizer_post_hooks, _global_optimizer_pre_hooks

    before = (len(_global_optimizer_pre_hooks), len(_global_optimizer_post_hooks))
    model = torch.nn.Linear(2, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model(torch.ones(1, 2)).sum().backward()
    rec = trace.Recorder("cpu")
    with trace.recording(rec):
        opt.step()
    opt.step()  # not recorded
    assert [(s.name, s.row, s.args) for s in rec.spans] == [("optimizer", "compute", {"optimizer": "SGD"})]
    assert (len(_global_optimizer_pre_hooks), len(_global_optimizer_post_hooks)) == before


def test_time_breakdown_counts_every_instant_once_first_category_wins():
    spans = [{"row": "c", "start": 0.0, "end": 2.0, "args": {}}, {"row": "m", "start": 1.0, "end": 3.0, "args": {}},
             {"row": "x", "start": 0.0, "end": 9.0, "args": {}}]
    got = trace.time_breakdown(spans, -1.0, 4.0, lambda s: {"c": "compute", "m": "comm"}.get(s["row"]),
                               ("comm", "compute"))
    assert got == pytest.approx({"comm": 2.0, "compute": 1.0, "idle": 2.0})
    with pytest.raises(ValueError, match="not one of"):
        trace.time_breakdown(spans, 0, 1, lambda s: "other", ("comm",))


def _load(path) -> list[dict]:
    """What a trace viewer needs: valid JSON, every event with ph/pid/tid; complete events with ts/dur >= 0."""
    data = json.loads(path.read_text())
    events = data["traceEvents"]
    for e in events:
        assert {"ph", "pid", "tid", "name"} <= set(e), e
        if e["ph"] == "X":
            assert isinstance(e["ts"], (int, float)) and e["dur"] >= 0 and e["ts"] >= 0, e
        else:
            assert e["ph"] == "M" and "args" in e, e
    return events


def test_a_trace_file_names_processes_and_rows_and_starts_at_the_first_span(tmp_path):
    spans = [{"name": "F0", "row": "compute", "start": 100.0, "end": 100.5, "args": {"micro_batch": 0}},
             {"name": "send pp", "row": "communication", "start": 100.5, "end": 100.75, "args": {"bytes": 8}},
             {"name": "F0", "row": "stage 1", "start": 100.25, "end": 101.0, "args": {}}]
    path = trace.write_chrome_trace(tmp_path / "t.json", [{"rank": 1, "name": "rank 1 (pp 1, dp 0, tp 0)",
                                                            "spans": spans[:2], "timer": "host-clock"},
                                                           {"rank": 0, "name": "rank 0", "spans": spans[2:]}])
    events = _load(path)
    assert {e["pid"]: e["args"]["name"] for e in events if e["name"] == "process_name"} == {
        0: "rank 0", 1: "rank 1 (pp 1, dp 0, tp 0)"}
    rows = {(e["pid"], e["tid"]): e["args"]["name"] for e in events if e["name"] == "thread_name"}
    done = {(e["pid"], rows[(e["pid"], e["tid"])], e["name"]): (e["ts"], e["dur"]) for e in events if e["ph"] == "X"}
    assert done == {(1, "compute", "F0"): (0.0, 5e5), (1, "communication", "send pp"): (5e5, 2.5e5),
                    (0, "stage 1", "F0"): (2.5e5, 7.5e5)}
    assert json.loads(path.read_text())["otherData"]["time_origin_unix_s"] == 100.0


def pipeline_step_worker(rank: int, world_size: int, trace_path: str) -> dict:
    """Two 1F1B steps of a 2-stage linear pipeline under a recorder (the second kept); the trace written."""
    from course.collectives import CommCounter
    from course.launch import context
    from course.mesh import Mesh
    from pipeline import StageRunner, schedule_actions

    device, m = context().device, 3
    mesh = Mesh.build(pp=world_size)
    torch.manual_seed(0)
    stage = torch.nn.Linear(4, 4).to(device)
    runner = StageRunner(stage, device, loss_fn=lambda y, t: ((y - t) ** 2).mean(), group=mesh.pp_group)
    inputs = [torch.randn(2, 4, device=device) for _ in range(m)] if mesh.is_first_stage else None
    targets = [torch.zeros(2, 4, device=device) for _ in range(m)] if mesh.is_last_stage else None
    recorder = trace.Recorder(device, max_steps=1)
    with trace.recording(recorder), CommCounter() as counter:
        for n in range(2):
            counter.reset()
            with trace.step(n, device):
                result = runner.run(schedule_actions("1f1b", mesh.stage, world_size, m), inputs, targets)
    trace.write_run_trace(recorder, trace_path, rank=rank, name=trace.process_name(rank, mesh), group=None)
    return {"spans": recorder.export(), "events": result.events, "origin": runner.origin,
            "counts": counter.counts(group="pp")}


@pytest.mark.timeout(120)
@pytest.mark.needs_solution  # calls reference code the student release stubs
def test_a_pipeline_steps_spans_lie_inside_the_step_with_its_sends_and_receives(tmp_path):
    from course.launch import launch

    path = tmp_path / "pipeline.json"
    out = launch(pipeline_step_worker, 2, str(path), timeout=90)
    for rank, r in out.items():
        step, = [s for s in r["spans"] if s["row"] == "step"]
        assert step["name"] == "step 1", "max_steps=1 keeps the last step only"
        inside = [s for s in r["spans"] if s["row"] != "step"]
        assert inside and all(step["start"] <= s["start"] <= s["end"] <= step["end"] for s in inside)
        compute = [s for s in inside if s["row"] == "compute"]
        assert sorted(s["name"] for s in compute) == ["B0", "B1", "B2", "F0", "F1", "F2"]
        assert [(s["args"]["kind"], s["args"]["micro_batch"], s["start"] - r["origin"], s["end"] - r["origin"])
                for s in compute] == [tuple(e) for e in r["events"]], "StepResult.events are the runner's spans"
        comm = [s["name"] for s in inside if s["row"] == "communication"]
        kind = "send" if rank == 0 else "recv"  # stage 0 sends 3 activations and receives 3 gradients; stage 1 mirrors
        assert comm.count("send pp") == comm.count("recv pp") == 3, comm
        assert r["counts"] == {"send": 3, "recv": 3}, r["counts"]
        first = {s["args"]["peer"] for s in inside if s["row"] == "communication" and s["args"]["kind"] == kind}
        assert first == {1 - rank}
    events = _load(path)
    assert {e["args"]["name"] for e in events if e["name"] == "process_name"} == {
        "rank 0 (pp 0, dp 0, tp 0)", "rank 1 (pp 1, dp 0, tp 0)"}
    f0 = {e["pid"]: e["ts"] for e in events if e["ph"] == "X" and e["name"] == "F0"}
    assert f0[0] < f0[1], "one clock: stage 1's first forward starts after stage 0's"


def test_measurement_options_are_checked_before_any_process_starts(tmp_path, capsys):
    from course.config import ConfigError
    from course.preflight import check_measurement_files
    from project.run_data_parallel import DataParallelConfig

    with pytest.raises(SystemExit):
        DataParallelConfig.from_command_line(["--trace_steps", "0"], environment=False)
    assert "--trace_steps must be >= 1" in capsys.readouterr().err
    (tmp_path / "old.json").write_text("{}")
    (tmp_path / "rank0_torch_profile.json").write_text("{}")
    for values, message in ((dict(trace=str(tmp_path)), "is a folder"),
                            (dict(trace=str(tmp_path / "old.json")), "already exists; pass --overwrite"),
                            (dict(profile=True), "already holds profiles of this mode (rank0_torch_profile.json)")):
        with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
            check_measurement_files(DataParallelConfig.for_test(workdir=str(tmp_path), **values))
    check_measurement_files(DataParallelConfig.for_test(workdir=str(tmp_path), trace=str(tmp_path / "new" / "t.json"),
                                                        profile=True, overwrite=True))
    # --overwrite: the old profiles are replaced once the run has succeeded, not by the checks; nothing is created
    assert (tmp_path / "rank0_torch_profile.json").is_file() and not (tmp_path / "new").exists()
    assert issubclass(ConfigError, ValueError)
