"""Pipelines of 3 and 4 stages under NCCL's point-to-point rules (``LLMSYS_NCCL_RULES=1``, :mod:`course.nccl_rules`;
docs/architecture.md, "Point-to-point under NCCL's rules"): the graded rendezvous tests cover p = 4 for the
one-chunk schedules and p = 2 for the interleaved one (issue 38, item 9).

* ``project/run_pipeline.py`` on Multi30k (2 steps, dropout 0): 1F1B at pp = 3, GPipe at pp = 4, ZB-H1 at pp = 3
  and interleaved 1F1B at pp = 3 with 2 chunks per rank (the 6-block preset ``small``: 6 virtual stages); DualPipeV
  and ZB-V at pp = 2 (V placement, 4 stages of the tiny preset; a5_2_7). The
  tiny-preset runs train the same model on the same batches, so their losses agree up to float rounding (the
  micro-batch losses are summed in another order: 1e-4 as in tests/pipeline/test_run_script.py).
* the schedules' worker (tests/support/pipeline.py, its tiny GPT-2 with 8 blocks) at p = 3 (GPipe, 1F1B, ZB-H1 and
  interleaved with v = 2) and interleaved at p = 4: they finish and equal one process; DualPipeV and ZB-V at p = 3
  and p = 4 (2p stages, 2p micro-batches: DualPipeV's least).
"""
from __future__ import annotations

import pytest

from course.launch import launch
from tests.support import rendezvous as support
from tests.support.launching import GRADED_COLLECTIVE_TIMEOUT

pytestmark = pytest.mark.needs_solution


@pytest.mark.timeout(2 * support.SCRIPT_TIMEOUT + 60)
def test_run_pipeline_at_three_and_four_stages_rendezvous(tmp_path, monkeypatch):
    from project.run_pipeline import main

    support.under_rules(monkeypatch)
    runs = {}
    for mode, pp, extra in [("1f1b", 3, ()), ("gpipe", 4, ()), ("zb-h1", 3, ()),
                            ("interleaved", 3, ("--virtual_stages", "2", "--preset", "small", "--batch_size", "12",
                                                "--micro_batches", "6")),
                            ("dualpipev", 2, ()), ("zbv", 2, ())]:
        runs[mode, pp] = support.run_script(main, tmp_path / f"{mode}{pp}", f"pipeline_{mode}_", pp,
                                            "--schedule", mode, "--pp", str(pp), "--micro_batches", "4",
                                            *extra)
        assert [r["config"]["pp"] for r in runs[mode, pp]] == [pp] * pp
    assert [r["config"]["virtual_stages"] for r in runs["interleaved", 3]] == [2, 2, 2]
    reference = runs["1f1b", 3][-1]
    for key in [("gpipe", 4), ("zb-h1", 3), ("dualpipev", 2), ("zbv", 2)]:
        got = runs[key][-1]  # the last stage computes the loss
        assert got["train_losses"] == pytest.approx(reference["train_losses"], abs=1e-4), key
        assert got["validation_loss"] == pytest.approx(reference["validation_loss"], abs=1e-3), key


@pytest.mark.timeout(300)
@pytest.mark.parametrize("world_size, cases, micro_sizes", [
    (3, [("gpipe", 1), ("1f1b", 1), ("zb-h1", 1), ("interleaved", 2)], None),
    (4, [("interleaved", 2)], None),
    (3, [("dualpipev", 2), ("zbv", 2)], [2, 1, 3, 1, 2, 1]),
    (4, [("dualpipev", 2), ("zbv", 2)], [2, 1, 3, 1, 2, 1, 1, 2]),
], ids=["p3", "p4-interleaved", "p3-v", "p4-v"])
def test_schedules_at_three_and_four_stages_rendezvous(monkeypatch, world_size, cases, micro_sizes):
    from tests.support import pipeline

    support.under_rules(monkeypatch)
    n_layer = 8  # 2 chunks on each of 4 ranks: 8 virtual stages of one block
    out = launch(support.schedule_cases_worker, world_size, cases, n_layer, micro_sizes, device="cpu", timeout=200,
                 collective_timeout=GRADED_COLLECTIVE_TIMEOUT)
    monkeypatch.setattr(pipeline, "N_LAYER", n_layer)
    if micro_sizes:
        monkeypatch.setattr(pipeline, "MICRO_SIZES", micro_sizes)
    for i, (schedule, chunks) in enumerate(cases):
        support.check_equal_to_single_process({r: res[i] for r, res in out.items()}, world_size,
                                              f"{schedule} p={world_size} v={chunks}")


@pytest.mark.timeout(support.SCRIPT_TIMEOUT + 60)
def test_a_run_script_is_held_to_the_rules_rendezvous(tmp_path, monkeypatch, capsys):
    """The mode reaches a run script's ranks: with no time allowed for a wait, the rules' first wait — for the
    other ranks to make a group, or for a peer's message — ends the run with their error (plain gloo runs on)."""
    from course.nccl_rules import TIMEOUT_ENV
    from project.run_pipeline import main

    support.under_rules(monkeypatch)
    monkeypatch.setenv(TIMEOUT_ENV, "0")
    assert main(support.tiny_run(tmp_path, "--schedule", "1f1b", "--pp", "2", "--micro_batches", "2")) == 1
    assert "NcclRuleError" in capsys.readouterr().err
