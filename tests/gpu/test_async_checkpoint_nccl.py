"""GPU tier: an asynchronous checkpoint of weights on the GPUs (written by its own gloo group while the weights
change) holds the weights of the moment it was asked for, and resumes into tensors on the GPUs — as on gloo."""
import pytest
import torch

from tests.gpu.part_workers import async_checkpoint_worker
from tests.gpu.support import need_gpus


@pytest.mark.gpu
def test_async_checkpoint_saves_and_resumes_on_gpus(tmp_path):
    from course.launch import launch
    from tests.gpu.support import TIMEOUT

    need_gpus(2)
    nccl = launch(async_checkpoint_worker, 2, str(tmp_path / "nccl"), device="cuda", backend="nccl", timeout=TIMEOUT)
    gloo = launch(async_checkpoint_worker, 2, str(tmp_path / "gloo"), device="cpu", backend="gloo", timeout=TIMEOUT)
    for rank in range(2):
        for run, device in ((nccl, f"cuda:{rank}"), (gloo, "cpu")):
            r = run[rank]
            assert r["device"] == device and r["latest"] == r["folder"], r
            assert r["steps"] == 2
            assert torch.equal(r["own"], r["expected_own"]), f"{device}: the checkpoint holds other weights"
            assert torch.equal(r["shared"], torch.full((1024, 4), 2.0)), f"{device}: changed while being written"
        assert torch.equal(nccl[rank]["own"], gloo[rank]["own"])
