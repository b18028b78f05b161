"""The answer checks of notebook 06's exercises (three_d/labs/checks.py) and the ranking and MFU helpers
(three_d/choosing.py): right answers pass, plausible wrong ones fail."""
from __future__ import annotations

import math

import pytest

from three_d.labs import checks
from three_d.choosing import compare_rankings, megatron_flops_per_step, mfu, ranks, spearman


def test_factorisation_count_by_enumeration():
    # ordered triples of 16: (pp, tp) with pp*tp | 16; keep pp <= 8 and tp | 4
    found = [(16 // (p * t), p, t) for p in (1, 2, 4, 8, 16) for t in (1, 2, 4, 8, 16)
             if 16 % (p * t) == 0 and p <= 8 and t <= 4]
    assert checks.check_factorisation_count(len(found))
    for wrong in (15, 10, len(found) + 1, None, "eleven"):
        assert not checks.check_factorisation_count(wrong)


def test_bubble_choice():
    assert checks.check_bubble_choice(3 / 19)
    for wrong in (3 / 11, 3 / 7, 1 / 19, 0.0):  # m = 8 (dp 2), m = 4, p - 1 forgotten, no bubble
        assert not checks.check_bubble_choice(wrong)


def test_mfu_check_and_helper():
    right = 6 * 1.3e9 * 1024 * 2048 / (2.0 * 64 * 989e12)
    assert math.isclose(mfu(6 * 1.3e9 * 1024 * 2048, 2.0, 64, 989e12), right)
    assert checks.check_mfu(right)
    for wrong in (right * 64, right * 2 / 6, right / 2, 2 * 1.3e9 * 1024 * 2048 / (2.0 * 64 * 989e12)):
        assert not checks.check_mfu(wrong)
    with pytest.raises(ValueError, match="step_s > 0"):
        mfu(1.0, 0.0, 1, 1.0)


def test_mfu_from_hfu():
    assert checks.check_mfu_from_hfu(0.39)
    for wrong in (0.52, 0.52 * 96 / 72, 0.52 * 2 / 3):
        assert not checks.check_mfu_from_hfu(wrong)


def test_megatron_formula_counts_recomputation_as_a_fourth_pass():
    b, s, l, h, v = 1, 2048, 128, 25600, 51200
    with_recompute = megatron_flops_per_step(b, s, l, h, v)
    assert math.isclose(with_recompute, 96 * b * s * l * h * h * (1 + s / (6 * h) + v / (16 * l * h)))
    without = megatron_flops_per_step(b, s, l, h, v, recomputation=False)
    assert without < with_recompute and math.isclose(without - 6 * b * s * h * v,
                                                     0.75 * (with_recompute - 6 * b * s * h * v))


def test_rankings():
    predicted = {(8, 1, 1): 1.0, (4, 2, 1): 3.0, (2, 2, 2): 2.0}
    measured = {(8, 1, 1): 0.5, (4, 2, 1): 0.7, (2, 2, 2): 0.9}
    assert ranks(predicted) == {(8, 1, 1): 1, (4, 2, 1): 3, (2, 2, 2): 2}
    assert ranks(predicted, largest_first=True)[(4, 2, 1)] == 1
    rows = compare_rankings(predicted, measured, "step s")
    assert [r["dp·pp·tp"] for r in rows] == ["8·1·1", "4·2·1", "2·2·2"]
    assert rows[1]["predicted place"] == 3 and rows[1]["measured place"] == 2
    assert math.isclose(rows[0]["predicted / measured"], 2.0)
    assert math.isclose(spearman(ranks(predicted), ranks(measured)), 0.5)
    assert math.isclose(spearman(ranks(measured), ranks(measured)), 1.0)
    with pytest.raises(ValueError, match="different factorisations"):
        compare_rankings(predicted, {(8, 1, 1): 1.0}, "step s")


def test_the_gpu_scale_layouts_follow_zero1_and_the_bubble():
    from pipeline import bubble_fraction

    t = checks.three_d_layout(8, 16, 8, **checks.GPT3_3D)
    assert t["state_gb"] == pytest.approx(175e9 / 128 * (4 + 12 / 8) / 1e9)
    assert t["micro_batches"] == 192 and t["bubble"] == pytest.approx(bubble_fraction(16, 192))
    assert t["tp_link"] == "nvlink" and checks.three_d_layout(16, 8, 8, **checks.GPT3_3D)["tp_link"] == "infiniband"
    assert checks.check_gpt3_layout(t["state_gb"], t["bubble"]) and not checks.check_gpt3_layout(t["state_gb"], 7 / 199)
