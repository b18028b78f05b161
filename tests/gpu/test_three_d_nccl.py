"""GPU tier: the 3D step (1F1B x TP x DP, tied sum, global-norm clip) on 8 (and 4) GPUs with NCCL equals
the same step on 8 (4) gloo ranks: loss, gradient norm, every rank's gradients — also with 4 pipeline stages
(dp 1 x pp 4 x tp 1: the middle stages are in no embedding group)."""
import pytest

from tests.gpu.support import assert_same, on_nccl_and_gloo
from tests.gpu.workers import three_d_worker

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("dp, pp, tp", [(2, 2, 2), (1, 2, 2), (1, 4, 1)], ids=["2x2x2", "1x2x2", "1x4x1"])
def test_three_d_step_on_nccl_equals_gloo(dp, pp, tp):
    world_size = dp * pp * tp
    nccl, gloo = on_nccl_and_gloo(three_d_worker, world_size, dp, pp, tp)
    for rank in range(world_size):
        assert nccl[rank]["coordinates"] == gloo[rank]["coordinates"]
        assert_same(nccl[rank], gloo[rank], f"rank {rank} {nccl[rank]['coordinates']}")


def test_untimed_3d_steps_do_not_synchronise():
    """Without a trace a 3D training step on CUDA synchronises nothing (no clock read around its forwards,
    backwards, tp all-reduces and pipeline exchanges), except the epoch's last step, which the results time;
    with a recorder active every step is timed (tests/three_d/test_untimed_steps.py on NCCL)."""
    from course.launch import launch
    from tests.gpu.support import TIMEOUT, need_gpus
    from tests.three_d.test_untimed_steps import STEPS, training_worker

    need_gpus(2)
    out = launch(training_worker, 2, [(1, 2, 1), (1, 1, 2)], device="cuda", backend="nccl", timeout=TIMEOUT)
    for rank, per_layout in out.items():
        for r in per_layout:
            assert [s["syncs"] == 0 for s in r["untraced"]] == [True] * (STEPS - 1) + [False], (rank, r["untraced"])
            assert r["traced_syncs"] > 0 and r["untraced"][-1]["timeline"], (rank, r)
