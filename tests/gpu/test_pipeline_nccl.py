"""GPU tier: every pipeline schedule on NCCL (one GPU per stage, point-to-point in lock-step batches)
gives the gradients and losses of the same run on gloo, with its timeline read on the synchronised clock."""
import pytest

from tests.gpu.support import assert_same, on_nccl_and_gloo
from tests.gpu.workers import pipeline_worker

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("world_size", [2, 4])
@pytest.mark.parametrize("schedule, virtual_stages", [("gpipe", 1), ("1f1b", 1), ("interleaved", 2), ("zb-h1", 1)])
def test_schedule_on_nccl_equals_gloo(schedule, virtual_stages, world_size):
    nccl, gloo = on_nccl_and_gloo(pipeline_worker, world_size, schedule, virtual_stages)
    for rank in range(world_size):
        assert nccl[rank]["timer"] == "host-clock+cuda-sync" and gloo[rank]["timer"] == "host-clock"
        assert nccl[rank]["events"] == gloo[rank]["events"] > 0
        assert_same(nccl[rank]["grads"], gloo[rank]["grads"], f"{schedule} rank {rank} gradients")
        assert_same(nccl[rank]["losses"], gloo[rank]["losses"], f"{schedule} rank {rank} losses")


@pytest.mark.parametrize("world_size", [1, 2, 4])
@pytest.mark.parametrize("schedule", ["dualpipev", "zbv"])
def test_v_schedule_on_nccl_equals_gloo(schedule, world_size):
    """The V placement (a5_2_7) on NCCL: rank 0 feeds the data and computes the loss, the last rank hands stage
    p - 1's output to stage p on its own GPU (world size 1: every hand-over is local)."""
    nccl, gloo = on_nccl_and_gloo(pipeline_worker, world_size, schedule, 2)
    for rank in range(world_size):
        assert nccl[rank]["events"] == gloo[rank]["events"] > 0
        assert_same(nccl[rank]["grads"], gloo[rank]["grads"], f"{schedule} rank {rank} gradients")
        assert_same(nccl[rank]["losses"], gloo[rank]["losses"], f"{schedule} rank {rank} losses")
    assert nccl[0]["losses"], "rank 0 holds the last stage"


def test_schedule_benchmark_costs_layers_on_the_gpu():
    """``--balance auto --device cuda`` costs the layers on the GPU (the model's parameters there while they are
    timed, with the synchronised clock) and gives a partition of the chain; the replay source is the device."""
    import torch

    import pipeline.gpt2
    from pipeline.labs import schedule_benchmark as sb
    from tests.gpu.support import need_gpus

    need_gpus(1)
    device = torch.device("cuda", 0)
    real, seen = pipeline.gpt2.gpt2_measured_balance, []

    def costing(model, n_stages, sample, **kwargs):
        seen.append(next(model.parameters()).device)
        return real(model, n_stages, sample, **kwargs)

    cfg = dict(balance="auto", v=2, micro_batch_size=2, seq=16, vocab=256, n_layer=4)
    pipeline.gpt2.gpt2_measured_balance = costing
    try:
        balances = sb.layer_balances(cfg, 2, device)
    finally:
        pipeline.gpt2.gpt2_measured_balance = real
    assert seen == [device, device]
    assert all(sum(b) == cfg["n_layer"] + 2 and len(b) == 2 * v for v, b in balances.items()), balances
    assert sb.replay_source(device) == "device"
