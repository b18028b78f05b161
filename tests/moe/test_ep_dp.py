"""Assignment 5.8.3 — expert parallelism × data parallelism on the device mesh (graded).

1. **Gradients** (four gloo ranks, dp = 4, ep = 1, 2 and 4; a dense layer, an MoE layer, a dense
   head): after each rank's backward pass of its own loss and ``sync_moe_gradients`` over
   ``mesh.dp_cp_group`` (dense) and ``mesh.edp_group`` (experts), every dense gradient and every
   expert gradient equals the gradient of one process for the mean of the four ranks' losses
   (to 1e-6), and the experts' all-reduce runs in the edp group.
2. **Training** (two gloo ranks, dp = 2, ep = 2, Multi30k, the MoE GPT-2 of ``project/run_moe.py``,
   dropout 0): three steps equal one process taking the same steps on the same global batches
   (the mean of the two shards' losses): per-step losses within 1e-5, final weights within 1e-5,
   last gradients within 1e-6 + 1e-4 relative. (Adam divides out a constant factor in the
   gradients, so the gradients are compared too: expert gradients off by ep would train almost
   the same.)
"""
from __future__ import annotations

import functools

import pytest
import torch

from tests.moe.support import SYNC_EP_SIZES, gradient_sync_worker, sync_reference, training_worker

pytestmark = pytest.mark.a5_8_3

WORLD = 4
STEPS = 3


@functools.lru_cache(maxsize=None)
def sync_runs():
    from course.launch import launch

    return launch(gradient_sync_worker, WORLD, timeout=120, collective_timeout=60)


@pytest.mark.timeout(180)
@pytest.mark.parametrize("ep", SYNC_EP_SIZES)
def test_dense_and_expert_gradients_equal_one_process(ep):
    ref = sync_reference()
    for rank in range(WORLD):
        got = sync_runs()[rank][ep]
        for name, grad in got["grads"].items():
            wanted = ref[name]
            if name.startswith("moe.experts."):
                per = wanted.shape[0] // ep
                wanted = wanted[got["ep_rank"] * per:(got["ep_rank"] + 1) * per]
            torch.testing.assert_close(grad, wanted, rtol=1e-6, atol=1e-6,
                                       msg=f"ep {ep}, rank {rank}: gradient of {name} (mean of the 4 ranks' losses)")
        groups = got["groups"]
        assert set(groups) <= {"dp", "edp"}, f"ep {ep}, rank {rank}: gradients synchronised in {sorted(groups)}"
        if ep == 2:
            assert "edp" in groups, f"rank {rank}: the experts' gradients are all-reduced over their replicas (edp)"


def argv(workdir):
    return ["--dp", "2", "--ep", "2", "--num_experts", "4", "--top_k", "2", "--batch_size", "8",
            "--max_batches", str(STEPS), "--n_bleu", "0", "--max_val_batches", "1", "--vocab_size", "1000",
            "--dropout", "0", "--workdir", str(workdir), "--quiet", "--timeout", "300"]


@pytest.mark.timeout(300)
def test_moe_gpt2_training_on_multi30k_equals_one_process(tmp_path):
    from course.launch import launch
    from project.run_moe import parse_args

    args = parse_args(argv(tmp_path))
    out = launch(training_worker, 2, args, timeout=240)
    ref = out[0]["reference"]
    for rank in (0, 1):
        got = out[rank]
        assert len(got["losses"]) == STEPS
        for step, (loss, shard_losses) in enumerate(zip(got["losses"], ref["losses"])):
            assert loss == pytest.approx(shard_losses[rank], abs=1e-5), (
                f"rank {rank}, step {step}: loss {loss} != one process's {shard_losses[rank]} on the same shard")
        for name, value in got["state"].items():
            wanted, grad = ref["state"][name], ref["grads"][name]
            if ".experts." in name:
                per = wanted.shape[0] // 2
                mine = slice(got["ep_rank"] * per, (got["ep_rank"] + 1) * per)
                wanted, grad = wanted[mine], grad[mine]
            torch.testing.assert_close(value, wanted, rtol=0, atol=1e-5, msg=f"rank {rank}: final {name}")
            torch.testing.assert_close(got["grads"][name], grad, rtol=1e-4, atol=1e-6,
                                       msg=f"rank {rank}: last gradient of {name}")
    assert out[0]["losses"] != out[1]["losses"], "the two ranks trained on the same shard"
    assert torch.equal(out[0]["state"]["model.transformer.wte.weight"], out[1]["state"]["model.transformer.wte.weight"]), \
        "dense weights differ between the ranks"
