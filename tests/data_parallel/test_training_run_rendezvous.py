"""``project/run_data_parallel.py`` under NCCL's rules (``LLMSYS_NCCL_RULES=1``, :mod:`course.nccl_rules`;
issue 38, item 9): gradient buckets all-reduced during the backward pass (dp 2, ``--overlap``), and HSDP
(dp 4 as 2 replicas x 2 shards, ZeRO-3 inside each: the shard and replica groups every rank must make, in the
same order). Each finishes 2 steps on Multi30k."""
from __future__ import annotations

import pytest

from tests.support import rendezvous as support

pytestmark = pytest.mark.needs_solution


@pytest.mark.timeout(2 * support.SCRIPT_TIMEOUT + 60)
def test_run_data_parallel_overlap_and_hsdp_rendezvous(tmp_path, monkeypatch):
    from project.run_data_parallel import main

    support.under_rules(monkeypatch)
    support.run_script(main, tmp_path / "overlap", "", 2, "--dp", "2", "--overlap", "--bucket_mb", "1")
    hsdp = support.run_script(main, tmp_path / "hsdp", "", 4, "--dp", "4", "--zero", "3", "--hsdp", "2")
    assert [r["config"]["hsdp"] for r in hsdp] == [{"replicas": 2, "shard": 2}] * 4
