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


def test_topk_with_error_feedback_on_nccl():
    """Top-k picks by magnitude, so rounding differences between devices may pick other entries: the NCCL
    result is checked against top-k recomputed on the host from the GPUs' own local gradients, and the
    losses against gloo's."""
    from communication.compression import topk_compress, topk_decompress

    nccl, gloo = on_nccl_and_gloo(reducer_worker, 2, "topk")
    for name, synced in nccl[0]["synced"].items():
        parts = [topk_compress(nccl[r]["local"][name], torch.zeros_like(synced), 0.1)[:2] for r in range(2)]
        want = topk_decompress(torch.cat([i for i, _ in parts]), torch.cat([v for _, v in parts]), synced) / 2
        assert_same(synced, want, f"top-k {name}")
        assert_same(nccl[1]["synced"][name], synced, f"top-k {name}: rank 1 vs rank 0", rtol=0, atol=0)
    for rank in range(2):
        assert_same(nccl[rank]["losses"], gloo[rank]["losses"], f"top-k losses, rank {rank}", rtol=1e-3)
