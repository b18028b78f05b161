"""The ranked plans (``python -m project.planner --preset llama-7b --n_devices 1024 --hardware h100``): every mesh
the model and batch allow, each the planner's prediction, the fitting ones first by step time; ``--verify`` builds
one fake rank of each (``python -m project.planner.verify``) in a subprocess, bounded in time. The ranking is checked
against predict() itself and the validity rules, never against wall-clock time."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

from course.hardware import HARDWARE
from project.planner.cli import main
from project.planner.config import PlanConfig
from project.planner.search import plan_candidates, rank_plans
from project.planner.step import predict

ROOT = Path(__file__).resolve().parents[2]


def ranking(**values):
    return PlanConfig.for_test(**(dict(preset="llama-7b", hardware="h100", n_devices=1024, vocab_size=32000) | values))


@pytest.mark.needs_solution  # the planner replays the schedules' action lists (assignment 5.2.4)
def test_the_ranked_plans_are_printed_best_first(capsys):
    assert main(["--preset", "llama-7b", "--n_devices", "1024", "--hardware", "h100", "--vocab_size", "32000",
                 "--top", "3"]) == 0
    out = capsys.readouterr().out
    lines = [line.split() for line in out.splitlines() if line[:3].strip().isdigit()]
    assert [int(line[0]) for line in lines] == [1, 2, 3]
    for line in lines:
        dp, pp, tp, cp = (int(x) for x in line[1:5])
        assert dp * pp * tp * cp == 1024 and 32 % tp == 0 and pp <= 32


@pytest.mark.needs_solution  # the planner replays the schedules' action lists (assignment 5.2.4)
def test_every_candidate_is_valid_and_the_ranking_is_predicts():
    config = ranking(top=5)
    assert config.ranking and (config.batch_size, config.model_max_length, config.vocab_size) == (1024, 4096, 32000)
    for c in plan_candidates(config):
        assert c["dp"] * c["pp"] * c["tp"] == 1024 and 32 % c["tp"] == 0 and c["pp"] <= 32
        assert config.batch_size % (c["dp"] * c["micro_batches"]) == 0
    plans = rank_plans(config, HARDWARE["h100"])
    fits = [p.prediction.fits for p in plans]
    assert fits == sorted(fits, reverse=True) and any(fits)  # the fitting ones first
    steps = [p.prediction.step_s for p in plans if p.prediction.fits]
    assert steps == sorted(steps)
    best = plans[0]
    again = predict(PlanConfig.for_test(**best.config.record()), HARDWARE["h100"])
    assert again.step_s == best.prediction.step_s and again.memory_bytes <= again.usable_memory_bytes
    # the best of a mesh's micro-batchings: no other micro-batching of the top mesh that fits is faster
    top = best.dims
    for c in plan_candidates(config):
        if (c["dp"], c["pp"], c["tp"]) == (top["dp"], top["pp"], top["tp"]):
            other = predict(PlanConfig.for_test(**(best.config.record() | c)), HARDWARE["h100"])
            assert not other.fits or other.step_s >= best.prediction.step_s


def test_no_mesh_no_ranking_and_bad_input_is_a_clear_message(capsys):
    assert not ranking(dp=8, pp=4, tp=32, batch_size=64, micro_batches=1).ranking
    with pytest.raises(SystemExit) as exit_:
        main(["--preset", "llama-7b", "--dp", "2", "--verify"])
    assert exit_.value.code == 2 and "--verify" in capsys.readouterr().err
    for gone in ("--model", "--gpus", "--overlap"):  # no former names: argparse refuses them
        with pytest.raises(SystemExit) as exit_:
            main([gone, "x"])
        assert exit_.value.code == 2


@pytest.mark.needs_solution  # the fake rank runs the reference ZeRO, TP and pipeline-stage code
def test_verify_builds_the_top_plans_fake_ranks():
    # about 10 s on 2 idle cores (two fake ranks of the tiny model); the bound kills the child well after that
    done = subprocess.run([sys.executable, "-m", "project.planner", "--preset", "tiny", "--n_devices", "8",
                           "--hardware", "h100", "--vocab_size", "1000", "--batch_size", "16", "--model_max_length",
                           "64", "--top", "1", "--verify"], cwd=ROOT, capture_output=True, text=True, timeout=180,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stderr[-3000:]
    rows = [line for line in done.stdout.splitlines() if "held" in line and "planned" in line]
    assert rows, done.stdout
    for row in rows:  # parameters, gradients and optimizer state: the fake rank's bytes are the planner's, but for
        # Adam's step counters (4 bytes per tensor stepped; the tiny model has fewer than 64 tensors) and ZeRO's
        # padding (none at ZeRO-0, the ranked plans' default here)
        parts = row.split(": ", 1)[1].split(" B), ")
        assert len(parts) == 3, row
        for part in parts:
            difference = int(part.rsplit("(", 1)[1].replace(" B)", "").replace(",", ""))
            assert 0 <= difference <= (4 * 64 if part.startswith("optimizer") else 0), row
