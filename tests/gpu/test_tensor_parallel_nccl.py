"""GPU tier: tensor-parallel GPT-2 (and with sequence parallelism) on NCCL equals the same on gloo:
loss, gathered logits, every rank's shard gradients."""
import pytest

from tests.gpu.support import assert_same, on_nccl_and_gloo
from tests.gpu.workers import tensor_parallel_worker

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("world_size", [2, 4])
@pytest.mark.parametrize("sequence_parallel", [False, True], ids=["tp", "tp+sp"])
def test_tensor_parallel_on_nccl_equals_gloo(sequence_parallel, world_size):
    nccl, gloo = on_nccl_and_gloo(tensor_parallel_worker, world_size, sequence_parallel)
    for rank in range(world_size):
        assert_same(nccl[rank], gloo[rank], f"rank {rank}")
