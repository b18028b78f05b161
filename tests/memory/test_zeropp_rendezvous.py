"""ZeRO++ under NCCL's rules (``LLMSYS_NCCL_RULES=1``, :mod:`course.nccl_rules`; issue 53, item 5):
``project/run_data_parallel.py`` at dp 4 with qwZ, hpZ in node-sized groups of 2 and qgZ finishes 2 steps on
Multi30k — every collective of every group (the int8 all-gathers and their scales' in the dp group, hpZ's
all-gathers in the two shard groups, qgZ's int8 all-to-alls of gradient chunks and scales) issued in the same order
with matching sizes on every member, and each rank's ZeRO++ traffic where it belongs."""
from __future__ import annotations

import pytest

from tests.support import rendezvous as support

pytestmark = pytest.mark.needs_solution


@pytest.mark.timeout(support.SCRIPT_TIMEOUT + 60)
def test_run_data_parallel_zeropp_qwz_hpz_qgz_rendezvous(tmp_path, monkeypatch):
    from project.run_data_parallel import main

    support.under_rules(monkeypatch)
    results = support.run_script(main, tmp_path, "", 4, "--dp", "4", "--zero", "3", "--zeropp", "qwz,hpz,qgz",
                                 "--zeropp_group", "2")
    for rank, r in enumerate(results):
        comm = r["comm_per_step"]
        assert comm["dp"]["all_to_all"]["count"] > 0 and "reduce_scatter" not in comm["dp"], \
            f"rank {rank}: qgZ's all-to-alls did not run in the dp group: {comm}"
        assert comm["dp_shard"]["all_gather"]["count"] > 0, f"rank {rank}: no hpZ all-gather in the shard group: {comm}"
