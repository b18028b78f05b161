"""``project/run_3d.py`` under NCCL's point-to-point rules (``LLMSYS_NCCL_RULES=1``, :mod:`course.nccl_rules`;
issue 38, item 9): a pipeline of 4 stages (dp 1 x pp 4 x tp 1, 1F1B: the middle stages hold no embedding and
sit in no embedding group) and ZB-H1 between tensor-parallel stages that send 1/tp of each activation and
all-gather it (dp 1 x pp 2 x tp 2, ``--scatter_gather``). Each finishes 2 steps on Multi30k; dropout 0 and the
same batches, so both train the tiny GPT-2 alike: their losses agree up to float rounding (1e-4, as the
pipeline's run-script test; tp splits each matmul's sums, which changes only their order)."""
from __future__ import annotations

import pytest

from tests.support import rendezvous as support

pytestmark = pytest.mark.needs_solution


@pytest.mark.timeout(2 * support.SCRIPT_TIMEOUT + 60)
def test_run_3d_four_stages_and_scatter_gather_zero_bubble_rendezvous(tmp_path, monkeypatch):
    from project.run_3d import main

    support.under_rules(monkeypatch)
    runs = {}
    for name, argv in [("pp4", ("--dp", "1", "--pp", "4", "--tp", "1", "--schedule", "1f1b")),
                       ("sg-zb", ("--dp", "1", "--pp", "2", "--tp", "2", "--schedule", "zb-h1", "--scatter_gather"))]:
        runs[name] = support.run_script(main, tmp_path / name, "three_d_", 4, "--micro_batches", "4", *argv)
    assert [r["coordinates"]["pp"] for r in runs["pp4"]] == [0, 1, 2, 3]
    assert [r["coordinates"]["tp"] for r in runs["sg-zb"]] == [0, 1, 0, 1]
    assert runs["sg-zb"][-1]["train_losses"] == pytest.approx(runs["pp4"][-1]["train_losses"], abs=1e-4)


@pytest.mark.timeout(support.SCRIPT_TIMEOUT + 60)
def test_factorisation_benchmark_every_mesh_of_four_ranks_rendezvous(tmp_path, monkeypatch):
    """``python -m three_d.labs.factorisation_benchmark --world_size 4`` (notebook 06's quick size) builds every
    factorisation of 4 ranks as dp x pp x tp in one process — (1, 4, 1) and (4, 1, 1) among them — and runs 3D
    steps on each: under NCCL's rules every mesh's groups are made alike on every rank and every step finishes."""
    import json

    from three_d.labs.factorisation_benchmark import main

    support.under_rules(monkeypatch)
    out = tmp_path / "factorisations.json"
    assert main(["--world_size", "4", "--batch_size", "8", "--micro_batch_size", "1", "--seq_len", "16", "--vocab_size",
                 "64", "--steps", "1", "--warmup", "0", "--repeats", "3", "--device", "cpu", "--out", str(out),
                 "--timeout", str(support.SCRIPT_TIMEOUT)]) == 0
    shapes = {(row["dp"], row["pp"], row["tp"]) for row in json.loads(out.read_text())["rows"]}
    assert shapes == {(4, 1, 1), (2, 2, 1), (1, 4, 1), (2, 1, 2), (1, 2, 2), (1, 1, 4)}, shapes
