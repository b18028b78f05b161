"""The exercise checks of notebook 08 (moe/checks.py): the worked problem at GPU scale and the new checks accept the
right answer only (no process started)."""
import pytest

from moe.labs import checks


def test_the_straggler_problem_prices_the_busiest_gpu():
    from course.hardware import HARDWARE

    h100 = HARDWARE["h100"]
    t = checks.expert_layer_seconds(**checks.DEEPSEEK_V3_LAYER, max_violation=1.0)
    rows = 16384 * 8  # tokens x top-k (token, expert) rows per GPU on average
    assert t["balanced"] == pytest.approx(rows * 6 * 7168 * 2048 / (h100.peak_flops["bf16"] * h100.matmul_efficiency))
    assert t["busiest"] == pytest.approx(2 * t["balanced"]) and t["wait"] == pytest.approx(t["balanced"])
    assert checks.expert_layer_seconds(**checks.DEEPSEEK_V3_LAYER)["wait"] == 0, "balanced: nobody waits"
    assert checks.check_straggler(1e3 * t["balanced"], 1e3 * t["busiest"])
    assert not checks.check_straggler(1e3 * t["balanced"], 1e3 * t["balanced"])
    assert checks.check_topk_bytes_factor(2) and not checks.check_topk_bytes_factor(4)
