"""Mixture of experts under NCCL's rules (``LLMSYS_NCCL_RULES=1``, :mod:`course.nccl_rules`; issue 38, item 9).

* the expert-parallel layer's all-to-alls with uneven and zero splits — an expert no token chooses, every token
  to one expert (one rank receives everything, the others nothing), a rank without tokens — at ep = 4 and 2
  (tests/moe/support.py's worker) finish and equal the single-process layer (float32, 1e-6 as the graded test);
* ``project/run_moe.py`` at dp 4 x ep 2 (two ep groups, each expert replicated twice) finishes 2 steps.
"""
from __future__ import annotations

import pytest

from course.launch import launch
from tests.support import rendezvous as support

pytestmark = pytest.mark.needs_solution


@pytest.mark.timeout(240)
def test_all_to_all_with_uneven_and_zero_splits_rendezvous(monkeypatch):
    from tests.moe.support import EP_CASES, EP_SIZES, check_expert_parallel_rank, expert_groups, expert_parallel_worker
    from tests.moe.test_expert_parallel import WORLD, reference

    support.under_rules(monkeypatch)
    out = launch(expert_parallel_worker, WORLD, timeout=180, collective_timeout=60)
    for ep in EP_SIZES:
        groups = expert_groups(WORLD, ep)
        for name, *_ in EP_CASES:
            ref = reference(name)
            for rank in range(WORLD):
                check_expert_parallel_rank(out[rank][(ep, name)], ref, rank, groups[rank], ep,
                                           f"{name}, ep {ep}, rank {rank}")


@pytest.mark.timeout(support.SCRIPT_TIMEOUT + 60)
def test_run_moe_dp4_ep2_rendezvous(tmp_path, monkeypatch):
    from project.run_moe import main

    support.under_rules(monkeypatch)
    results = support.run_script(main, tmp_path, "moe_", 4, "--dp", "4", "--ep", "2", "--num_experts", "4",
                                 "--top_k", "2")
    assert all(r["comm_per_step"]["ep"]["all_to_all"]["count"] > 0 for r in results)
