"""The exercise checks of notebook 02 (pipeline/checks.py): their formulas agree with the schedules and the
clock cycles they describe, and each check accepts the right answer only."""
import pytest

from pipeline import checks
from pipeline.clock_cycles import _clock_cycles
from pipeline.metrics import measured_bubble_fraction, peak_in_flight, simulate
from pipeline.schedules import all_actions, get_schedule


@pytest.mark.parametrize("m,n", [(1, 1), (5, 3), (12, 5), (3, 8)])
@pytest.mark.needs_solution  # calls reference code the student release stubs
def test_clock_cycle_formula_matches_the_schedule(m, n):
    assert checks.forward_clock_cycles(m, n) == len(list(_clock_cycles(m, n)))


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
@pytest.mark.parametrize("p,m", [(2, 1), (4, 3), (4, 16)])
@pytest.mark.needs_solution  # calls reference code the student release stubs
def test_peak_in_flight_formula_matches_the_action_lists(schedule, p, m):
    assert [checks.peak_in_flight_formula(schedule, r, p, m) for r in range(p)] == \
        [peak_in_flight(a) for a in all_actions(schedule, p, m)]


@pytest.mark.parametrize("p,m", [(4, 8), (2, 4)])
@pytest.mark.needs_solution  # calls reference code the student release stubs
def test_registry_bubble_matches_simulated_action_lists(p, m):
    for name in ("gpipe", "1f1b"):
        assert get_schedule(name).bubble(p, m) == pytest.approx(measured_bubble_fraction(
            simulate(all_actions(name, p, m), t_forward=1, t_backward=1)))


def test_fewest_micro_batches_is_the_threshold():
    m = checks.fewest_micro_batches("1f1b", 8, 0.10)
    assert m == 63
    assert get_schedule("1f1b").bubble(8, m) <= 0.10 < get_schedule("1f1b").bubble(8, m - 1)


def test_checks_accept_the_right_answers_only(capsys):
    assert checks.check_bubbles(3 / 11, 3 / 19, 3 / 27)
    assert not checks.check_bubbles(3 / 11, 3 / 11, 3 / 27)  # interleaving changes nothing: wrong
    assert not checks.check_bubbles(3 / 8, 3 / 19, 3 / 27)  # (p - 1) / m, relative to the ideal time
    assert checks.check_clock_cycles(16)
    assert not checks.check_clock_cycles(17)  # m + n
    assert checks.check_micro_batches_for_bubble(63)
    assert not checks.check_micro_batches_for_bubble(70)  # m + p - 1 = 70, not m
    assert checks.check_activation_ratio(4)
    assert not checks.check_activation_ratio(1)  # "the same memory"
    assert not checks.check_activation_ratio(None)
    out = capsys.readouterr().out
    assert "right" in out and "not yet" in out
