"""Ungraded: ``project/run_pipeline.py`` on real Multi30k data in each mode, and its input checks.

The smoke runs use dropout 0 and the same batches, so every mode minimises the same loss
with the same updates: their training losses and validation losses agree up to float
rounding (the micro-batches sum the loss in a different order).
"""
import json
import math

import pytest

from project.run_pipeline import parse_args

STEPS = 2
ONE_PROCESS = ("sequential", "pipe")  # --single_process


def _argv(workdir, mode, *extra, micro_batches="2"):
    # a slice of the corpus (its own small tokenizer), one validation batch (the same 64 pairs in every mode)
    runs = ["--single_process", mode] if mode in ONE_PROCESS else ["--schedule", mode]
    return [*runs, "--batch_size", "8", "--micro_batches", micro_batches, "--max_batches", str(STEPS),
            "--n_bleu", "2", "--dropout", "0", "--workdir", str(workdir), "--quiet", "--timeout", "240",
            "--vocab_size", "1000", "--max_train_examples", "2000", "--max_val_batches", "1", *extra]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    from project.run_pipeline import main

    workdir = tmp_path_factory.mktemp("pipeline_runs")
    out = {}
    extra = {"interleaved": ["--virtual_stages", "2"], "zb-h1": ["--balance", "auto"]}
    for mode in (*ONE_PROCESS, "1f1b", "interleaved", "zb-h1"):
        assert main(_argv(workdir, mode, *extra.get(mode, []))) == 0, f"{mode} run failed"
        ranks = 1 if mode in ONE_PROCESS else 2
        out[mode] = [json.loads((workdir / f"pipeline_{mode}_rank{r}_results_epoch0.json").read_text())
                     for r in range(ranks)]
    return out


@pytest.mark.needs_solution
@pytest.mark.timeout(400)
def test_each_mode_trains_and_writes_results(runs):
    for mode, results in runs.items():
        for r in results:
            for key in ("validation_loss", "bleu", "training_time", "tokens_per_sec", "train_loss"):
                assert math.isfinite(r[key]), f"{mode}: {key} = {r[key]}"
            assert r["steps"] == STEPS and r["tokens"] > 0
            assert r["config"]["mode"] == mode and r["config"]["pp"] == 2
            assert r["timeline"], f"{mode}: no per-stage timeline"
    assert {e["stage"] for e in runs["pipe"][0]["timeline"]} == {0, 1}
    assert len(runs["pipe"][0]["timeline"]) == 2 * 2  # 2 micro-batches x 2 stages
    assert len(runs["sequential"][0]["timeline"]) == 2  # one micro-batch through 2 stages
    one_f_one_b = runs["1f1b"]
    assert [len(r["timeline"]) for r in one_f_one_b] == [4, 4]  # F and B of 2 micro-batches per stage
    assert [r["peak_in_flight"] for r in one_f_one_b] == [2, 1]
    assert one_f_one_b[0]["param_sha256"] == one_f_one_b[1]["param_sha256"], "stages gathered differently"
    interleaved = runs["interleaved"]
    assert [r["config"]["virtual_stages"] for r in interleaved] == [2, 2]
    assert [len(r["timeline"]) for r in interleaved] == [8, 8]  # F and B of 2 micro-batches x 2 chunks per rank
    zero_bubble = runs["zb-h1"]
    assert [sorted(e["kind"] for e in r["timeline"]) for r in zero_bubble] == [["B", "B", "F", "F", "W", "W"]] * 2
    balance = zero_bubble[0]["config"]["balance"]
    assert sum(balance) == 6 and balance == zero_bubble[1]["config"]["balance"], "the stages disagree on the split"


@pytest.mark.needs_solution
@pytest.mark.timeout(400)
def test_all_modes_compute_the_same_training(runs):
    reference = runs["sequential"][0]
    for mode in ("pipe", "1f1b", "interleaved", "zb-h1"):
        got = runs[mode][-1]
        # Losses of ~6.9 (log 1000), float32 ulp 4.8e-7: the first step's differ by the micro-batches' order of summing
        # (a few ulps); the second follows one AdamW update, which can turn a last-bit gradient difference into up to
        # lr = 1e-3 in a weight whose gradient is near zero, a weight that barely moves the loss (its gradient is near
        # zero: ~lr x |g| per such weight). 1e-4 (~200 ulps) on the training losses, 1e-3 on the validation loss
        # (after both updates, on unseen data), far below what a wrong schedule or split moves (~0.1).
        assert got["train_losses"] == pytest.approx(reference["train_losses"], abs=1e-4), mode
        assert got["validation_loss"] == pytest.approx(reference["validation_loss"], abs=1e-3), mode


@pytest.mark.parametrize("extra,micro_batches,message", [
    (["--pp", "5"], "2", "--pp 5 is more than the 4 transformer blocks"),
    (["--pp", "0"], "2", "--pp must be a whole number >= 1"),
    ([], "0", "--micro_batches must be >= 1"),
    ([], "9", "micro-batch size"),
    ([], "3", "not divisible by --micro_batches"),
])
def test_bad_input_stops_before_any_process_starts(tmp_path, capsys, extra, micro_batches, message):
    with pytest.raises(SystemExit) as exc:
        parse_args(_argv(tmp_path, "1f1b", *extra, micro_batches=micro_batches))
    assert exc.value.code == 2
    assert message in capsys.readouterr().err


def test_library_checks_raise_clear_errors():
    from torch import nn

    from pipeline.gpt2 import gpt2_balance
    from pipeline.partition import balanced_sizes
    from pipeline.pipe import Pipe

    with pytest.raises(ValueError, match="micro-batch size"):
        Pipe(nn.Sequential(nn.Linear(2, 2)), split_size=0)
    with pytest.raises(ValueError, match="covers 3 layers"):
        Pipe(nn.Sequential(nn.Linear(2, 2), nn.ReLU()), split_size=1, balance=[2, 1])
    with pytest.raises(ValueError, match="at least 5 transformer blocks"):
        gpt2_balance(4, 5)
    with pytest.raises(ValueError, match="need at least 3 layers"):
        balanced_sizes(2, 3)
    assert balanced_sizes(5, 2) == [3, 2] and gpt2_balance(4, 2) == [3, 3]
