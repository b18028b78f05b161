"""GPU tier: hybrid sharding (ZeRO-3 inside each shard group, gradient slices averaged across the replicas) on
NCCL: its shards live on the GPU, the first step's loss and full mean gradients equal the same run on gloo, later
losses agree as Adam allows, and the replicas stay identical."""
import pytest

from tests.gpu.part_workers import hsdp_worker
from tests.gpu.support import assert_same, on_nccl_and_gloo

pytestmark = pytest.mark.gpu
STEPS = 3


@pytest.mark.parametrize("world_size, replicas", [(4, 2), (8, 2)], ids=["2x2", "2x4"])
def test_hsdp_on_nccl_equals_gloo(world_size, replicas):
    nccl, gloo = on_nccl_and_gloo(hsdp_worker, world_size, replicas, STEPS)
    for rank in range(world_size):
        assert nccl[rank]["shard_devices"] == [f"cuda:{rank}"], nccl[rank]["shard_devices"]
        first_gpu, first_cpu = nccl[rank]["steps"][0], gloo[rank]["steps"][0]
        assert_same(first_gpu["loss"], first_cpu["loss"], f"rank {rank}: first loss")
        assert_same(first_gpu["grads"], first_cpu["grads"], f"rank {rank}: first step's mean gradients")
        # Adam turns rounding differences of tiny gradients into lr-sized steps: later losses agree to 1e-3
        # (as tests/gpu/test_memory_nccl.py's ZeRO losses)
        assert_same([s["loss"] for s in nccl[rank]["steps"]], [s["loss"] for s in gloo[rank]["steps"]],
                    f"rank {rank}: losses", rtol=1e-3)
        # every replica holds the same averaged slices: the gathered parameters are bitwise equal on every rank
        assert_same(nccl[rank]["steps"][-1]["params"], nccl[0]["steps"][-1]["params"], f"rank {rank} vs rank 0",
                    rtol=0, atol=0)
