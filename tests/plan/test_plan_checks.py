"""The exercise checks of notebooks/09_plan_a_large_run.ipynb: right answers pass, the plausible wrong ones fail."""
import pytest

from project.planner import checks as C

RIGHT = {C.check_zero3_state_bytes: 16 * 7e9 / 64, C.check_rank_coordinates: (2, 23, 4), C.check_bubble: 3 / 19,
         C.check_micro_batches_for_bubble: 63, C.check_recomputed_activation_bytes: 2 * 4096 * 4096 * 8 * 4}
WRONG = {C.check_zero3_state_bytes: [16 * 7e9, 4 * 7e9 + 12 * 7e9 / 64, 12 * 7e9 / 64, 16 * 7e9 / 8],  # ZeRO-0, 1
         C.check_rank_coordinates: [(2, 87, 4), (4, 23, 2), (2, 23, 5)],                              # no mod, reversed
         C.check_bubble: [3 / 16, 4 / 20, 1 / 16],                                                   # (p-1)/m, p/(m+p)
         C.check_micro_batches_for_bubble: [70, 62, 8],                                              # (p-1)/m <= 0.1
         C.check_recomputed_activation_bytes: [4 * 4096 * 4096 * 8 * 4, 2 * 4096 * 4096 * 8,          # fp32; one mb
                                               2 * 4096 * 4096 * 8 * 4 * 34]}                        # no recompute


@pytest.mark.parametrize("check", list(RIGHT), ids=lambda f: f.__name__)
def test_right_answers_pass(check, capsys):
    assert check(RIGHT[check])
    assert "right" in capsys.readouterr().out


@pytest.mark.parametrize("check", list(RIGHT), ids=lambda f: f.__name__)
def test_wrong_and_missing_answers_fail_with_a_hint(check, capsys):
    for wrong in [*WRONG[check], None]:
        assert not check(wrong), wrong
        assert "hint" in capsys.readouterr().out
