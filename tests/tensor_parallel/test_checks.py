"""The exercise checks of notebooks/03_tensor_parallel.ipynb: right answers pass, plausible wrong ones fail."""
import pytest

from tensor_parallel.labs import checks


@pytest.mark.parametrize("answer, ok", [(48, True), (24, False), (96, False), (4, False), (None, False)])
def test_allreduces(answer, ok, capsys):
    assert checks.check_allreduces_per_step(answer) is ok
    assert ("right" if ok else "not yet") in capsys.readouterr().out


def test_block_traffic():
    v = 8 * 1024 * 1600 * 2
    right = 4 * 7 / 8 * v
    assert checks.check_block_traffic(right, right)
    assert not checks.check_block_traffic(2 * v, right)  # the tensor's bytes, not the ring's traffic
    assert not checks.check_block_traffic(right, right / 2)  # SP counted as half the traffic
    assert not checks.check_block_traffic(right / 2, right)  # one all-reduce only


def test_shard_shapes():
    assert checks.check_mlp_shard_shapes((800, 1600), (1600, 800))
    assert not checks.check_mlp_shard_shapes((1600, 800), (800, 1600))  # row and column swapped
    assert not checks.check_mlp_shard_shapes((6400, 200), (1600, 800))
    assert not checks.check_mlp_shard_shapes(None, None)


def test_vocab_loss_bytes():
    assert checks.check_vocab_loss_bytes(98304)
    assert not checks.check_vocab_loss_bytes(32768) and not checks.check_vocab_loss_bytes(8192)


def test_the_new_checks_agree_with_the_model_and_the_datasheets():
    from course.hardware import HARDWARE
    from course.model import build_gpt2

    hf = build_gpt2("tiny", 64, n_positions=16, dropout=0.0, seed=0)
    block = hf.transformer.h[0]
    replicated = sum(p.numel() for p in (*block.ln_1.parameters(), *block.ln_2.parameters(), block.attn.c_proj.bias,
                                         block.mlp.c_proj.bias))
    assert replicated == 6 * hf.config.n_embd and checks.check_grad_sync_elements(replicated)
    assert checks.check_mixed_block_collectives(1.5) and not checks.check_mixed_block_collectives(2)
    t = checks.tp_layer_seconds(**checks.GPT3_LAYER)
    h100 = HARDWARE["h100"]
    assert t["gemm"] == pytest.approx(24 * 2048 * 12288 ** 2 / 8 / (h100.peak_flops["bf16"] * h100.matmul_efficiency))
    assert t["all_reduce"]["nvlink"] < t["gemm"] < t["all_reduce"]["infiniband"], "TP stays inside the node"
    assert checks.check_tp_layer_times(1e3 * t["gemm"], 1e3 * t["all_reduce"]["nvlink"],
                                       1e3 * t["all_reduce"]["infiniband"])
    assert not checks.check_tp_layer_times(1e3 * t["gemm"], 1e3 * t["all_reduce"]["infiniband"],
                                           1e3 * t["all_reduce"]["nvlink"])
