"""``project/run_tensor_parallel.py`` under NCCL's rules (``LLMSYS_NCCL_RULES=1``, :mod:`course.nccl_rules`;
issue 38, item 9): tp 4 with sequence parallelism (all-gathers and reduce-scatters along the sequence) finishes
2 steps on Multi30k, every rank with the same losses."""
from __future__ import annotations

import pytest

from tests.support import rendezvous as support

pytestmark = pytest.mark.needs_solution


@pytest.mark.timeout(support.SCRIPT_TIMEOUT + 60)
def test_run_tensor_parallel_sequence_parallel_rendezvous(tmp_path, monkeypatch):
    from project.run_tensor_parallel import main

    support.under_rules(monkeypatch)
    results = support.run_script(main, tmp_path, "tensor_parallel_", 4, "--tp", "4", "--sequence_parallel")
    assert len({tuple(r["train_losses"]) for r in results}) == 1, "the tp ranks record different losses"
