"""GPU tier: the hand-written ring and recursive-doubling all-reduce of CUDA tensors over NCCL (one
batch per exchange), and the bucketed, top-k and PowerSGD gradient synchronisations, against gloo."""
import pytest
import torch

from tests.gpu.support import assert_same, on_nccl_and_gloo
from tests.gpu.workers import all_reduce_worker, reducer_worker

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("world_size", [2, 4, 8])
@pytest.mark.parametrize("algorithm", ["ring", "tree"])
def test_all_reduce_from_send_recv_on_nccl(algorithm, world_size):
    nccl, gloo = on_nccl_and_gloo(all_reduce_worker, world_size, algorithm)
    for rank in range(world_size):
        assert nccl[rank]["device"] == f"cuda:{rank}"
        assert_same(nccl[rank]["result"], nccl[rank]["dist_all_reduce"], f"{algorithm} vs NCCL's all-reduce, rank {rank}")
        assert_same(nccl[rank]["result"], gloo[rank]["result"], f"{algorithm} on NCCL vs on gloo, rank {rank}")


@pytest.mark.parametrize("kind", ["bucketed", "powersgd"])
def test_gradient_synchronisation_on_nccl_equals_gloo(kind):
    nccl, gloo = on_nccl_and_gloo(reducer_worker, 2, kind)
    for rank in range(2):
        assert_same(nccl[rank]["synced"], gloo[rank]["synced"], f"{kind}: synchronised gradients, rank {rank}")
        assert_same(nccl[rank]["losses"], gloo[rank]["losses"], f"{kind}: losses, rank {rank}", rtol=1e-3)


@pytest.mark.parametrize("world_size", [2, 3])
def test_topk_with_error_feedback_on_nccl(world_size):
    """Top-k picks by magnitude, so rounding differences between devices may pick other entries: the NCCL
    result is checked against top-k recomputed on the host from the GPUs' own local gradients, and the
    losses against gloo's. The ranks' pairs are summed in rank order (``topk_sum``), so every replica has
    the same bits — with 3 ranks too, where a coordinate chosen by all three would be added in a varying
    order by CUDA's ``index_add_``."""
    from communication.compression import topk_compress, topk_sum

    nccl, gloo = on_nccl_and_gloo(reducer_worker, world_size, "topk")
    for name, synced in nccl[0]["synced"].items():
        parts = [topk_compress(nccl[r]["local"][name], torch.zeros_like(synced), 0.1)[:2] for r in range(world_size)]
        want = topk_sum(parts, synced) / world_size
        assert_same(synced, want, f"top-k {name}")
        for rank in range(1, world_size):
            assert torch.equal(nccl[rank]["synced"][name], synced), f"top-k {name}: rank {rank}'s bits != rank 0's"
    for rank in range(world_size):
        assert_same(nccl[rank]["losses"], gloo[rank]["losses"], f"top-k losses, rank {rank}", rtol=1e-3)
