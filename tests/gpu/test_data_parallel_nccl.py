"""GPU tier: data parallelism on NCCL equals the same run on gloo — the averaged gradients, the steps
every rank can take (a host count over the group's gloo back-end), the validation loss shared out."""
import pytest

from tests.gpu.support import assert_same, on_nccl_and_gloo
from tests.gpu.workers import data_parallel_worker

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("world_size", [2, 4, 8])
def test_data_parallel_gradients_steps_and_validation_loss(world_size):
    nccl, gloo = on_nccl_and_gloo(data_parallel_worker, world_size)
    for rank in range(world_size):
        assert nccl[rank]["steps"] == gloo[rank]["steps"] == 10
        assert_same(nccl[rank], gloo[rank], f"rank {rank}")
        assert_same(nccl[rank]["grads"], nccl[0]["grads"], f"rank {rank} vs rank 0 (replicas)", rtol=0, atol=0)
