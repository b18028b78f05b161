"""GPU tier: the expert-parallel MoE layer on NCCL — all-to-alls with uneven splits, an expert without tokens,
every token to one expert (zero splits to the others), capacity drops, a rank without tokens — equals the same
run on gloo: outputs and the gradients of the input, the router and the experts (tests/moe/support.py's cases)."""
import pytest

from tests.gpu.part_workers import expert_parallel_worker
from tests.gpu.support import assert_same, on_nccl_and_gloo

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("world_size, ep_sizes", [(2, [2]), (4, [4, 2])], ids=["dp2", "dp4"])
def test_expert_parallel_all_to_all_on_nccl_equals_gloo(world_size, ep_sizes):
    nccl, gloo = on_nccl_and_gloo(expert_parallel_worker, world_size, ep_sizes)
    for rank in range(world_size):
        assert set(nccl[rank]) == set(gloo[rank])
        for key, on_cpu in gloo[rank].items():
            assert nccl[rank][key]["device"] == f"cuda:{rank}", key
            # float32, GPT-2 MLP experts of 16 x 64: sums of at most 64 terms (tests.gpu.support's default bounds)
            assert_same({k: v for k, v in nccl[rank][key].items() if k != "device"},
                        {k: v for k, v in on_cpu.items() if k != "device"}, f"ep {key[0]}, {key[1]}, rank {rank}")
