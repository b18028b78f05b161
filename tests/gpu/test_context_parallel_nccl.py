"""GPU tier: ring attention and DeepSpeed-Ulysses on NCCL (one GPU per rank) equal the same run on gloo — the
same inputs, forward and backward — and the single-process attention: at cp = 2, at cp = 4, and at cp = 2 and 4
inside a larger mesh (dp x cp)."""
import pytest

from tests.gpu.part_workers import attention_worker
from tests.gpu.support import assert_same, on_nccl_and_gloo

pytestmark = pytest.mark.gpu

# float32 attention over 48 (ring) or 24 (Ulysses) positions: each output sums that many terms, ~48 x 2^-24
# ≈ 3e-6 relative, in another order on the GPU and in the ring's blockwise merges; the CPU tests hold their
# shards to the whole-sequence reference at 1e-5, the same bound here.
TOL = dict(rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("kind", ["ring", "ulysses"])
@pytest.mark.parametrize("world_size, cp", [(2, 2), (4, 4), (4, 2), (8, 4)], ids=["cp2", "cp4", "dp2xcp2", "dp2xcp4"])
def test_attention_forward_and_backward_on_nccl_equal_gloo(kind, world_size, cp):
    nccl, gloo = on_nccl_and_gloo(attention_worker, world_size, kind, cp)
    for rank in range(world_size):
        assert set(nccl[rank]) == set(gloo[rank]), rank
        for case, on_cpu in gloo[rank].items():
            on_gpu, where = nccl[rank][case], f"{kind} cp={cp} {case} rank {rank}"
            assert on_gpu["device"] == f"cuda:{rank}" and on_cpu["device"] == "cpu", where
            assert_same(on_gpu["out"], on_cpu["out"], f"{where}: output", **TOL)
            assert_same(on_gpu["grads"], on_cpu["grads"], f"{where}: q, k, v gradients", **TOL)
            assert_same(on_gpu["out"], on_gpu["ref"], f"{where}: output vs one process", **TOL)
            assert_same(on_gpu["grads"], on_gpu["ref_grads"], f"{where}: gradients vs one process", **TOL)
