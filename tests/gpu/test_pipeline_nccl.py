"""GPU tier: every pipeline schedule on NCCL (one GPU per stage, point-to-point in lock-step batches)
gives the gradients and losses of the same run on gloo, with its timeline read on the synchronised clock."""
import pytest

from tests.gpu.support import assert_same, on_nccl_and_gloo
from tests.gpu.workers import pipeline_worker

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("world_size", [2, 4])
@pytest.mark.parametrize("schedule, n_chunks", [("gpipe", 1), ("1f1b", 1), ("interleaved", 2), ("zb-h1", 1)])
def test_schedule_on_nccl_equals_gloo(schedule, n_chunks, world_size):
    nccl, gloo = on_nccl_and_gloo(pipeline_worker, world_size, schedule, n_chunks)
    for rank in range(world_size):
        assert nccl[rank]["timer"] == "host-clock+cuda-sync" and gloo[rank]["timer"] == "host-clock"
        assert nccl[rank]["events"] == gloo[rank]["events"] > 0
        assert_same(nccl[rank]["grads"], gloo[rank]["grads"], f"{schedule} rank {rank} gradients")
        assert_same(nccl[rank]["losses"], gloo[rank]["losses"], f"{schedule} rank {rank} losses")
