"""The GPU tier's workers of tests/gpu/part_workers.py, run on gloo in the default suite (no ``gpu`` marker): the
CPU half of each GPU test computes what it should, so a GPU test that fails points at NCCL or the GPU, not at its
worker. The same checks as the CPU tests whose inputs they reuse (float32: 1e-5 against the whole-sequence
attention as tests/context_parallel/test_ring_attention.py; 1e-6 against the single-process MoE layer as
tests/moe/test_expert_parallel.py)."""
import pytest
import torch

from course.launch import launch
from tests.gpu import part_workers
from tests.gpu.support import assert_same

pytestmark = [pytest.mark.needs_solution, pytest.mark.timeout(240)]


@pytest.mark.parametrize("kind", ["ring", "ulysses"])
def test_attention_worker_on_gloo(kind):
    for world_size, cp in ((4, 4), (4, 2)):
        out = launch(part_workers.attention_worker, world_size, kind, cp, device="cpu", timeout=180)
        for rank in range(world_size):
            for case, r in out[rank].items():
                where = f"{kind} cp={cp} {case} rank {rank}"
                assert r["device"] == "cpu"
                assert_same(r["out"], r["ref"], where, rtol=1e-5, atol=1e-5)
                assert_same(r["grads"], r["ref_grads"], where, rtol=1e-5, atol=1e-5)


def test_expert_parallel_worker_on_gloo():
    from tests.moe.test_expert_parallel import reference

    out = launch(part_workers.expert_parallel_worker, 4, [4, 2], device="cpu", timeout=180)
    for rank in range(4):
        for (ep, name), got in out[rank].items():
            ref = reference(name)[rank]
            torch.testing.assert_close(got["out"], ref["out"], rtol=1e-6, atol=1e-6, msg=f"ep {ep} {name} rank {rank}")
            torch.testing.assert_close(got["x_grad"], ref["x_grad"], rtol=1e-6, atol=1e-6,
                                       msg=f"ep {ep} {name} rank {rank}: input gradient")


def test_hsdp_and_async_checkpoint_workers_on_gloo(tmp_path):
    out = launch(part_workers.hsdp_worker, 4, 2, 3, device="cpu", timeout=180)
    for rank in range(4):
        assert out[rank]["shard_devices"] == ["cpu"] and len(out[rank]["steps"]) == 3
        assert_same(out[rank]["steps"][-1]["params"], out[0]["steps"][-1]["params"], f"rank {rank}", rtol=0, atol=0)
    saved = launch(part_workers.async_checkpoint_worker, 2, str(tmp_path), device="cpu", timeout=180)
    for rank, r in saved.items():
        assert r["latest"] == r["folder"] and r["steps"] == 2, r
        assert torch.equal(r["own"], r["expected_own"]) and torch.equal(r["shared"], torch.full((1024, 4), 2.0))
