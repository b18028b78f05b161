"""Block types ``tp`` / ``spd`` / ``parallel``, and the run script (ungraded).

* ``block_types`` validation (pure, no processes).
* Communication: ``spd`` does 1 all-reduce per block each way, a run of ``parallel``
  blocks 1 per run; with sequence parallelism those become 1 all-gather + 1 reduce-scatter.
* ``spd`` and ``parallel`` are *not* the single-device model (their distance from ``tp``
  is measured and must be clearly non-zero, i.e. the approximation is real), a run of one
  ``parallel`` block computes exactly ``spd``, their sequence-parallel versions equal the
  plain ones, and after ``sync_grads`` every replicated parameter has the same gradient on
  every rank (else the replicas would drift apart).
* ``project/run_tensor_parallel.py``: bad input ends with a clear error before any process
  starts; a short real run on Multi30k writes finite results with the collective counts.
"""
import json
import math

import pytest
import torch

from tests.tensor_parallel.test_gpt2 import N_LAYER, gpt2_case

WORLD = 2


def test_parse_block_types():
    from tensor_parallel.block_types import parse_block_types

    assert parse_block_types(None, 3) == ["tp"] * 3
    assert parse_block_types("spd", 2) == ["spd", "spd"]
    assert parse_block_types("tp, spd,parallel", 3) == ["tp", "spd", "parallel"]
    assert parse_block_types(["parallel", "tp"], 2) == ["parallel", "tp"]
    with pytest.raises(ValueError, match="block_types has 2 entries.*n_layer=3"):
        parse_block_types("tp,spd", 3)
    with pytest.raises(ValueError, match="unknown block type"):
        parse_block_types("tp,megatron", 2)


def test_block_runs():
    from tensor_parallel.block_types import block_runs

    assert block_runs(["tp", "parallel", "parallel", "spd", "parallel"]) == [(0, 1), (1, 3), (3, 4), (4, 5)]


def _block_counts(name, rank, phase):
    got = gpt2_case(WORLD, name, rank)["comm"].get(f"blocks/{phase}", {})
    return {kind: int(v["count"]) for kind, v in got.items()}


@pytest.mark.needs_solution
@pytest.mark.parametrize("name, expected", [
    ("spd", {"all_reduce": N_LAYER}),                 # 1 per block
    ("parallel", {"all_reduce": 1}),                  # one run of N_LAYER blocks
    ("mixed", {"all_reduce": 2 + 1 + 1}),             # tp, run of 2 parallel, spd
    ("spd_sp", {"all_gather": N_LAYER, "reduce_scatter": N_LAYER}),
    ("parallel_sp", {"all_gather": 1, "reduce_scatter": 1}),
])
def test_block_type_collectives(name, expected):
    for rank in range(WORLD):
        for phase in ("forward", "backward"):
            assert _block_counts(name, rank, phase) == expected, f"{name}, rank {rank}, {phase}"


@pytest.mark.needs_solution
def test_spd_and_parallel_are_approximations_of_tp():
    tp = gpt2_case(WORLD, "tp")
    for name in ("spd", "parallel", "mixed"):
        r = gpt2_case(WORLD, name)
        diff = float((r["logits"] - tp["logits"]).abs().max())
        assert math.isfinite(r["loss"]) and diff > 1e-4, f"{name}: max |logits - tp logits| = {diff:.2e}"


@pytest.mark.needs_solution
def test_one_parallel_block_equals_spd_and_sequence_parallel_versions_agree():
    for rank in range(WORLD):
        for a, b in (("parallel_first", "spd_first"), ("spd_sp", "spd"), ("parallel_sp", "parallel")):
            diff = float((gpt2_case(WORLD, a, rank)["logits"] - gpt2_case(WORLD, b, rank)["logits"]).abs().max())
            # the same block computed with its sums split or ordered otherwise: see tests/tensor_parallel/test_gpt2.py
            assert diff <= 1e-5, f"rank {rank}: {a} vs {b} logits differ by {diff:.2e}"
            ga, gb = gpt2_case(WORLD, a, rank)["replicated_grads"], gpt2_case(WORLD, b, rank)["replicated_grads"]
            assert torch.allclose(ga, gb, atol=1e-5), f"rank {rank}: {a} vs {b} replicated gradients differ"


@pytest.mark.needs_solution
@pytest.mark.parametrize("name", ["tp", "sp", "spd", "parallel", "mixed", "spd_sp", "parallel_sp"])
def test_replicated_gradients_agree_across_ranks(name):
    grads = [gpt2_case(WORLD, name, rank)["replicated_grads"] for rank in range(WORLD)]
    # every rank computes the replicated gradients from the same all-reduced values: equal but for the order
    # of a two-rank sum (exact), so 1e-6 is a margin, not an allowance for rounding
    assert torch.allclose(grads[0], grads[1], atol=1e-6), f"{name}: replicated parameters' gradients differ by rank"


@pytest.mark.parametrize("argv, message", [
    (["--tp", "3"], "--tp 3 does not divide the 4 attention heads"),
    (["--block_types", "tp,spd"], "block_types has 2 entries"),
    (["--block_types", "sync"], "unknown block type"),
    (["--tp", "0"], "--tp must be a whole number >= 1"),
])
def test_run_script_rejects_bad_input_before_spawning(argv, message, capsys, monkeypatch):
    from course import launch as launch_module
    from project.run_tensor_parallel import main

    monkeypatch.setattr(launch_module.mp, "get_context", lambda *a: pytest.fail("a process was started"))
    with pytest.raises(SystemExit) as exc:
        main(argv + ["--device", "cpu"])
    assert exc.value.code == 2
    assert message in capsys.readouterr().err


@pytest.mark.needs_solution
def test_run_script_short_run_on_multi30k(tmp_path):
    from project.run_tensor_parallel import main

    steps = 2
    argv = ["--tp", "2", "--block_types", "tp,spd,parallel,parallel", "--sequence_parallel",
            "--batch_size", "8", "--max_batches", str(steps), "--n_bleu", "2", "--max_val_batches", "1",
            "--workdir", str(tmp_path), "--quiet", "--device", "cpu", "--timeout", "240"]
    assert main(argv) == 0
    runs = [json.loads((tmp_path / f"tensor_parallel_rank{r}_results_epoch0.json").read_text()) for r in (0, 1)]
    for r in runs:
        for key in ("validation_loss", "bleu", "training_time", "tokens_per_sec"):
            assert math.isfinite(r[key]), f"{key} = {r[key]}"
        assert r["steps"] == steps and r["config"]["tp"] == 2 and r["config"]["sequence_parallel"]
        assert r["config"]["block_types"] == ["tp", "spd", "parallel", "parallel"]
        forward = r["comm_per_step"]["per_layer_forward"]
        # tp: 2+2, spd: 1+1, the parallel run: 1+1 -> 8 collectives over 4 layers.
        assert forward["all_gather"]["count"] == forward["reduce_scatter"]["count"] == 4 / 4
    assert runs[0]["train_losses"] == runs[1]["train_losses"], "all ranks compute the same loss"
