"""GPU tier: the 3D step (1F1B x TP x DP, tied sum, global-norm clip) on 8 (and 4) GPUs with NCCL equals
the same step on 8 (4) gloo ranks: loss, gradient norm, every rank's gradients."""
import pytest

from tests.gpu.support import assert_same, on_nccl_and_gloo
from tests.gpu.workers import three_d_worker

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("dp, pp, tp", [(2, 2, 2), (1, 2, 2)], ids=["2x2x2", "1x2x2"])
def test_three_d_step_on_nccl_equals_gloo(dp, pp, tp):
    world_size = dp * pp * tp
    nccl, gloo = on_nccl_and_gloo(three_d_worker, world_size, dp, pp, tp)
    for rank in range(world_size):
        assert nccl[rank]["coordinates"] == gloo[rank]["coordinates"]
        assert_same(nccl[rank], gloo[rank], f"rank {rank} {nccl[rank]['coordinates']}")
