"""GPU tier: ZeRO-1/2/3 keep their flat buffers, shards and optimizer state on the GPU and train as on
gloo; an FSDP (ZeRO-3) checkpoint written and resumed on GPUs continues the run exactly; bf16 with
activation checkpointing recomputes on the GPU in the forward pass's precision and dropout masks, and trains
data-parallel on NCCL as on gloo (dropout 0: the devices' masks differ)."""
import pytest
import torch

from tests.gpu.support import TIMEOUT, assert_same, need_gpus, on_nccl_and_gloo
from tests.gpu.memory_workers import fsdp_checkpoint_worker, recomputation_on_one_device, zero_worker

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("zero", [1, 2, 3])
def test_zero_state_lives_on_the_gpu_and_trains_as_on_gloo(zero):
    nccl, gloo = on_nccl_and_gloo(zero_worker, 2, zero)
    for rank in range(2):
        assert nccl[rank]["state_devices"] == [f"cuda:{rank}"], (
            f"ZeRO-{zero} holds model state on {nccl[rank]['state_devices']}: flat buffers, shards, gradients and "
            "optimizer state belong on the parameters' device")
        assert_same(nccl[rank]["losses"], gloo[rank]["losses"], f"ZeRO-{zero} losses, rank {rank}", rtol=1e-3)
    assert_same(nccl[1]["params"], nccl[0]["params"], "replicas after the steps", rtol=0, atol=0)


@pytest.mark.timeout(3 * TIMEOUT + 60)  # three launches
def test_fsdp_checkpoint_resumes_on_gpus(tmp_path):
    from course.launch import launch

    need_gpus(2)
    whole = launch(fsdp_checkpoint_worker, 2, str(tmp_path / "whole"), -1, 4, device="cuda", timeout=TIMEOUT)
    resumed = launch(fsdp_checkpoint_worker, 2, str(tmp_path / "resumed"), 2, 4, device="cuda", timeout=TIMEOUT)
    on_gloo = launch(fsdp_checkpoint_worker, 2, str(tmp_path / "gloo"), 2, 4, device="cpu", timeout=TIMEOUT)
    for rank in range(2):
        assert resumed[rank]["shard_device"] == f"cuda:{rank}"
        assert_same(resumed[rank]["losses"], whole[rank]["losses"], f"resumed vs uninterrupted, rank {rank}",
                    rtol=1e-6, atol=1e-7)
        assert_same(resumed[rank]["losses"], on_gloo[rank]["losses"], f"GPUs vs gloo, rank {rank}", rtol=1e-3)


def test_bf16_recomputation_on_a_gpu_replays_its_autocast_and_dropout():
    """On a CUDA input the forward pass ran under CUDA autocast: replaying only the CPU's autocast state
    would recompute in fp32, and only the CPU's random state would draw other dropout masks."""
    need_gpus(1)
    run = recomputation_on_one_device("cuda")
    for i, (forward, recomputed) in run["checkpointed"]["calls"].items():
        assert forward.dtype == torch.bfloat16
        assert recomputed.dtype == forward.dtype, f"block {i} recomputed in {recomputed.dtype}"
        assert torch.equal(recomputed, forward), f"block {i}: the recomputation differs from the forward pass"
    assert run["checkpointed"]["loss"] == run["plain"]["loss"]
    assert_same(run["checkpointed"]["grads"], run["plain"]["grads"], "checkpointed vs plain", rtol=1e-2, atol=1e-4)


def test_bf16_with_checkpointing_data_parallel_on_nccl():
    """Dropout 0: the GPU and the CPU draw different dropout masks from the same seed, which a tolerance would
    have to absorb (the masks' replay on one device is the test above); what is left to differ is bf16 rounding."""
    nccl, gloo = on_nccl_and_gloo(zero_worker, 2, 0, "bf16", True, 0.0)
    for rank in range(2):
        # bf16 kernels round differently on each device: each autocast matmul rounds its output to bf16 (unit
        # roundoff u = 2^-9); about 25 of them (6 per block x 4 blocks, the head) on the way to the logits, with
        # independent signs: sqrt(25) x u ≈ 1e-2 per device, 2e-2 between the two (Adam's lr = 1e-3 steps move
        # the 3 losses by far less)
        assert_same(nccl[rank]["losses"], gloo[rank]["losses"], f"bf16 + checkpointing losses, rank {rank}",
                    rtol=2e-2)
    assert_same(nccl[1]["params"], nccl[0]["params"], "replicas after the steps", rtol=0, atol=0)
