"""The loss-parity harness (project/tools/parity.py): a short table of real configurations within their
tolerances, and planted wrong configurations caught by them. Notebook 06 shows the full table
(``python project/tools/parity.py``)."""
import math

import pytest

from project.tools.parity import check_parity, global_norm, run_parity
from project.tools.parity_cases import CASES, DP, EXACT, PIPE, TP, ParityCase

SHORT = ["DP 2", "ZeRO-2", "1F1B, pp 2", "TP 2 + SP", "EP 2 (MoE, dp 2)"]
PLANTED = {
    "planted: DP 2, gradients summed": (ParityCase("planted: DP 2, gradients summed", 2,
                                                   "tests.parity.planted:summed_dp", DP, {"dp": 2}, "shards"), "grad"),
    "planted: 1F1B, tied gradient not summed": (ParityCase("planted: 1F1B, tied gradient not summed", 2,
                                                           "tests.parity.planted:untied_pipeline", PIPE,
                                                           {"schedule": "1f1b", "pp": 2,
                                                            "micro_batches": 4}), "both"),
    "planted: TP 2 + SP, layer norms not synced": (ParityCase("planted: TP 2 + SP, layer norms not synced", 2,
                                                              "tests.parity.planted:unsynced_sequence_parallel", TP,
                                                              {"tp": 2, "sequence_parallel": True}), "both"),
}


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    cases = SHORT + [case for case, _ in PLANTED.values()]
    return run_parity(cases, steps=3, max_train_examples=48, batch_size=8,
                      workdir=str(tmp_path_factory.mktemp("parity")), timeout=240)


@pytest.mark.needs_solution  # calls reference code the student release stubs
def test_real_configurations_train_the_one_process_model(report):
    rows = {r["name"]: r for r in report["cases"]}
    check_parity({"cases": [rows[name] for name in SHORT]})
    for name in SHORT:
        assert all(math.isfinite(x) for x in rows[name]["losses"] + rows[name]["grad_norms"]), name
        assert rows[name]["losses"][-1] < rows[name]["losses"][0], f"{name}: the loss did not fall in 3 steps"
    # the two one-process objectives differ on these batches: data parallelism needs its own reference
    assert rows["1 process, mean of 2 shard means"]["loss_diff"] > 10 * EXACT


@pytest.mark.needs_solution  # calls reference code the student release stubs
def test_planted_wrong_configurations_break_their_tolerance(report):
    rows = {r["name"]: r for r in report["cases"]}
    for name, (case, column) in PLANTED.items():
        row = rows[name]
        assert not row["ok"], f"{name} passed: loss {row['loss_diff']:.2e}, grad {row['grad_diff']:.2e}"
        if column in ("grad", "both"):
            assert row["grad_diff"] > case.grad_tol, name
        if column == "both":
            assert row["loss_diff"] > case.loss_tol, name
    with pytest.raises(AssertionError, match="planted: DP 2, gradients summed"):
        check_parity(report)


def test_a_tensor_held_by_several_ranks_counts_once():
    # rank 0 and 1 hold the same replicated tensor "a" and a shard each
    assert global_norm([[("a", 9.0), ("s0", 16.0)], [("a", 9.0), ("s1", 0.0)]]) == 5.0


def test_every_configuration_has_a_reason_and_a_tolerance():
    names = [c.name for c in CASES]
    assert len(names) == len(set(names))
    for case in CASES:
        assert case.reason and case.loss_tol > 0 and case.grad_tol > 0, case.name
    with pytest.raises(ValueError, match="unknown parity case"):
        run_parity(["no such case"], steps=1)
