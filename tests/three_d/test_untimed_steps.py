"""Ungraded: without a trace, a 3D training step reads no clock — nothing synchronises the device around its
forwards, backwards, tp all-reduces and pipeline exchanges, and no span is kept — except the epoch's last step,
whose timeline the results file reports; with a trace (an event recorder active) every step is recorded as before.

Every clock read of the course goes through :func:`course.measure.synchronize` (:func:`course.measure.now`
calls it, on the CPU too, where it has nothing to wait for), so counting its calls counts the device
synchronisations a GPU would have done. The former 3D mode recorded every step (so every step synchronised
around every forward, backward and collective). On GPUs ``tests/gpu/test_three_d_nccl.py``
(``test_untimed_3d_steps_do_not_synchronise``) counts the same on CUDA.
"""
from types import SimpleNamespace

import pytest
import torch

from tests.support.three_d import SEQ, VOCAB, dense

STEPS, BATCH, MICRO = 3, 8, 2


def counting_syncs(calls: list):
    """Make :func:`course.measure.synchronize` append to ``calls`` (and still synchronise); returns the undo."""
    from course import measure

    real = measure.synchronize

    def counted(device=None):
        calls.append(device)
        real(device)

    measure.synchronize = counted
    return lambda: setattr(measure, "synchronize", real)


def _data():
    g = torch.Generator().manual_seed(5)
    rows = [torch.randint(0, VOCAB, (SEQ,), generator=g) for _ in range(STEPS * BATCH)]

    def collate(batch):
        ids = torch.stack(batch)
        return {"input_ids": ids, "labels": ids.clone(), "attention_mask": torch.ones_like(ids)}

    return SimpleNamespace(train=rows, collate=collate)


def training_worker(rank: int, world_size: int, layouts: list) -> list:
    """Every layout: an epoch of STEPS 3D steps without a trace, then one step with a recorder active; per step
    the number of clock reads (synchronisations) and what the results would report."""
    from course import trace
    from course.launch import context
    from course.mesh import ParallelDims
    from course.task import worker_env_quiet
    from three_d.rank_setup import setup_rank
    from three_d.training import ThreeDTraining

    worker_env_quiet()
    torch.set_num_threads(1)
    device = context().device
    args = SimpleNamespace(quiet=True, learning_rate=1e-3, batch_size=BATCH, micro_batches=MICRO, schedule="1f1b",
                           max_grad_norm=1.0, seed=0, max_batches=STEPS)
    calls: list = []
    undo = counting_syncs(calls)
    try:
        out = []
        for dp, pp, tp in layouts:
            mode = ThreeDTraining(args, _data(), device, setup_rank(ParallelDims(dp=dp, pp=pp, tp=tp),
                                                                     dense(torch.float32), device))
            mode.training(0)
            batches, steps = mode.epoch_batches(0)
            untraced = []
            for _, batch in zip(range(steps), batches):
                calls.clear()
                mode.train_step(batch)
                untraced.append({"syncs": len(calls), "timeline": [e["kind"] for e in mode.timeline],
                                 "comm": sorted({(c["kind"], c["group"]) for c in mode.comm_timeline})})
            recorder = trace.Recorder(device)
            calls.clear()
            with trace.recording(recorder):
                mode.train_step(batch)
            out.append({"untraced": untraced, "traced_syncs": len(calls),
                        "spans": sorted({(s.row, s.args.get("kind"), s.args.get("group")) for s in recorder.spans},
                                        key=str)})
        return out
    finally:
        undo()


@pytest.mark.needs_solution  # the stage runner's forward and backward steps are assignment 5.2's
@pytest.mark.timeout(150)
def test_only_the_epochs_last_step_is_timed_without_a_trace_and_every_step_with_one():
    from course.launch import launch

    layouts = [(1, 2, 1), (1, 1, 2)]  # pp = 2 (the pipeline's sends and receives), tp = 2 (its all-reduces)
    out = launch(training_worker, 2, layouts, timeout=120)
    for rank, per_layout in out.items():
        for (dp, pp, tp), r in zip(layouts, per_layout):
            where = f"rank {rank}, dp {dp} pp {pp} tp {tp}"
            *untimed, last = r["untraced"]
            for n, step in enumerate(untimed):
                assert step["syncs"] == 0, f"{where}: step {n} (no trace) read the clock {step['syncs']} times"
                assert step["timeline"] == [] and step["comm"] == [], f"{where}: step {n} kept spans"
            assert last["syncs"] > 0 and sorted(last["timeline"]) == ["B"] * MICRO + ["F"] * MICRO, (where, last)
            group = "pp" if pp > 1 else "tp"
            assert any(g == group for _, g in last["comm"]), f"{where}: the last step's {group} communication"
            assert r["traced_syncs"] > 0, f"{where}: a step under a trace must be timed"
            rows = {row for row, _, _ in r["spans"]}
            assert {"compute", "communication"} <= rows, (where, r["spans"])
            assert ("compute", "F", None) in r["spans"] and ("compute", "B", None) in r["spans"], r["spans"]
            assert any(row == "communication" and g == group for row, _, g in r["spans"]), r["spans"]


@pytest.mark.needs_solution  # the stage runner's forward and backward steps are assignment 5.2's
def test_a_runner_built_untimed_reads_no_clock_unless_a_recorder_is_active():
    """The stage runner alone (one stage, this process): ``timed=False`` and no recorder — no clock read and no
    events; a recorder active — the events and spans as a timed runner's; ``timed=True`` (the pipeline
    experiments' runners, whose events are the measurement) — always timed."""
    from course import trace
    from pipeline import StageRunner, schedule_actions

    torch.manual_seed(0)
    stage = torch.nn.Linear(4, 4)
    inputs, targets = [torch.randn(2, 4) for _ in range(2)], [torch.zeros(2, 4) for _ in range(2)]
    actions = schedule_actions("gpipe", 0, 1, 2)
    calls: list = []
    undo = counting_syncs(calls)
    try:
        runner = StageRunner(stage, "cpu", loss_fn=lambda y, t: ((y - t) ** 2).mean(), timed=False)
        calls.clear()
        quiet = runner.run(actions, inputs, targets)
        assert calls == [] and quiet.events == [] and quiet.event_cpu_s == [], "untimed: no clock read, no events"
        assert sorted(quiet.losses) == [0, 1] and all(isinstance(v, float) for v in quiet.losses.values())
        recorder = trace.Recorder("cpu")
        with trace.recording(recorder):
            traced = runner.run(actions, inputs, targets)
        assert [e[:2] for e in traced.events] == [("F", 0), ("F", 1), ("B", 0), ("B", 1)]
        assert [(s.args["kind"], s.args["micro_batch"]) for s in recorder.select("compute")] == \
            [e[:2] for e in traced.events], "the recorder gets the runner's spans"
        calls.clear()
        runner.timed = True
        timed = runner.run(actions, inputs, targets)
        assert len(timed.events) == 4 and len(calls) >= 8, "a timed runner reads the clock around every step"
    finally:
        undo()
