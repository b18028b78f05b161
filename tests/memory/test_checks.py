"""The exercise checks of notebooks/05_memory.ipynb: right answers pass, the plausible wrong ones fail."""
import pytest

from memory.labs import checks


@pytest.mark.parametrize("answer, ok", [(16.6, True), (16.64, True), (31.4, False), (1.88, False),
                                        (33.3, False), (None, False), ("x", False)])
def test_zero2(answer, ok, capsys):
    assert checks.check_zero2_gb(answer) is ok
    assert ("right" if ok else "not yet") in capsys.readouterr().out


@pytest.mark.parametrize("z1, z3, ok", [(8, 4, True), (4, 4, False), (8, 2, False), (16, 4, False), (None, 4, False)])
def test_smallest_dp(z1, z3, ok):
    assert checks.check_smallest_dp(z1, z3) is ok


def test_activation_and_gelu():
    s, b, h, a = 1024, 8, 1600, 25
    plain = s * b * h * (34 + 5 * a * s / h) / 1e9
    assert checks.check_activation_gb(plain, 34 * s * b * h / 4 / 1e9)
    assert not checks.check_activation_gb(plain, plain / 4)  # SP without selective recomputation
    assert not checks.check_activation_gb(s * b * h * 34 / 1e9, 34 * s * b * h / 4 / 1e9)  # the s^2 term left out
    assert checks.check_fused_gelu_bytes(72)
    assert not checks.check_fused_gelu_bytes(34) and not checks.check_fused_gelu_bytes(66)


def test_the_new_checks_agree_with_the_formulas_and_the_model():
    from course.model import build_gpt2
    from memory.labs import checks
    from memory.formulas import activation_bytes_per_layer, model_state_bytes

    model = build_gpt2("tiny", 1000, n_positions=64, dropout=0.0, seed=0, n_layer=2)
    assert checks.check_zero0_calls(len(list(model.parameters()))), "one all-reduce per parameter tensor"
    assert checks.check_bf16_state_bytes(16) and not checks.check_bf16_state_bytes(8)
    assert checks.check_selective_gb(activation_bytes_per_layer(1024, 8, 1600, 25, recompute="selective") / 1e9)
    f = checks.fit_at_scale(**checks.LLAMA_70B)
    assert f["state_gb"] == pytest.approx(sum(model_state_bytes(3, int(70e9), 64, "mixed").values()) / 1e9)
    assert f["state_gb"] == pytest.approx(16 * 70e9 / 64 / 1e9)
    assert f["activations_gb"]["full"] == pytest.approx(80 * 2 * 4096 * 8192 / 1e9), "each layer's input, 16-bit"
    assert f["fits"] == {"none": False, "selective": False, "full": True}
    assert checks.check_70b_fit(f["state_gb"], f["activations_gb"]["none"], f["activations_gb"]["full"])
    assert not checks.check_70b_fit(f["state_gb"], f["activations_gb"]["selective"], f["activations_gb"]["full"])
