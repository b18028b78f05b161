"""``project/run_context_parallel.py`` under NCCL's point-to-point rules (``LLMSYS_NCCL_RULES=1``,
:mod:`course.nccl_rules`; issue 38, item 9): ring attention at cp = 4 (dp 1 x cp 4, zig-zag layout) trains
GPT-2 forward and backward on packed Multi30k sequences — its K/V blocks and their gradients travel the ring of
four in every layer, both passes — and Ulysses inside a dp 2 x cp 2 mesh (all-to-alls in two cp groups at once,
gradients over dp x cp). Each finishes 2 steps; every rank records the global batch's loss."""
from __future__ import annotations

import pytest

from tests.support import rendezvous as support

pytestmark = pytest.mark.needs_solution


@pytest.mark.timeout(2 * support.SCRIPT_TIMEOUT + 60)
def test_run_context_parallel_ring_at_four_and_ulysses_in_dp_x_cp_rendezvous(tmp_path, monkeypatch):
    from project.run_context_parallel import main

    support.under_rules(monkeypatch)
    for name, argv in [("ring-cp4", ("--dp", "1", "--cp", "4", "--attention", "ring")),
                       ("ulysses-dp2-cp2", ("--dp", "2", "--cp", "2", "--attention", "ulysses"))]:
        # sequences of 256 tokens (the zig-zag layout cuts them into 2 x cp chunks), 2 of them per step
        results = support.run_script(main, tmp_path / name, "context_parallel_", 4, "--seq_len", "256",
                                     "--batch_size", "2", *argv)
        assert len({tuple(r["train_losses"]) for r in results}) == 1, f"{name}: the ranks record different losses"
        assert all(r["comm_per_step"]["cp"] for r in results), f"{name}: no communication in the cp group"
