"""The exercise checks of notebook 02 (pipeline/labs/checks.py): their formulas agree with the schedules and the
clock cycles they describe, and each check accepts the right answer only."""
import pytest

from pipeline.labs import checks
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


@pytest.mark.parametrize("p", [2, 3, 4])
@pytest.mark.needs_solution  # calls reference code the student release stubs
def test_dualpipev_formulas_match_the_replayed_lists(p):
    from pipeline.metrics import replay_by_kind

    for m in (2 * p, 3 * p):
        lists = all_actions("dualpipev", p, m)
        events = replay_by_kind(lists, {"F": 1.0, "B": 1.0, "W": 1.0, "BW": 2.0, "F&B": 3.0}, placement="v")
        span = max(e[3] for ev in events for e in ev)
        assert max(span - sum(e[3] - e[2] for e in ev) for ev in events) == checks.dualpipev_bubble_units(p)
        assert max(peak_in_flight(a) for a in lists) == 2 * p + 1
        one_f_one_b = simulate(all_actions("1f1b", 2 * p, m), t_forward=1, t_backward=2)
        assert max(e[3] for ev in one_f_one_b for e in ev) - 3 * m == checks.one_f_one_b_bubble_units(2 * p)


def test_dualpipev_check_accepts_the_right_answers_only(capsys):
    assert checks.check_dualpipev(6, 21, 9)
    assert not checks.check_dualpipev(3, 21, 9)
    assert not checks.check_dualpipev(6, 21, 5)


@pytest.mark.needs_solution  # the action lists are reference code the student release stubs
def test_the_gpu_scale_choice_and_the_new_checks_read_the_schedules():
    one, two = (checks.micro_batch_choice(**checks.GPT3_PIPELINE, virtual_stages=v) for v in (1, 2))
    for c, name, v in ((one, "1f1b", 1), (two, "interleaved", 2)):
        assert c["m"] % 8 == 0 and c["bubble"] <= 0.05 < get_schedule(name).bubble(8, c["m"] - 8, v)
        assert c["in_flight_chunks"] == peak_in_flight(all_actions(name, 8, c["m"], v)[0]), "the formula = the lists"
    for p, m, v in ((4, 8, 2), (4, 4, 3), (2, 4, 2), (8, 16, 2)):
        assert checks.interleaved_rank0_in_flight(p, m, v) == peak_in_flight(all_actions("interleaved", p, m, v)[0])
    assert (one["m"], one["in_flight_stages"]) == (136, 8), "1F1B's rank 0 holds p micro-batches"
    assert two["m"] < one["m"] and two["in_flight_stages"] > one["in_flight_stages"], "interleaving's price: memory"
    assert checks.check_gpt3_micro_batches(136, two["m"], 8, two["in_flight_stages"])
    assert not checks.check_gpt3_micro_batches(133, two["m"], 8, two["in_flight_stages"])
    slower = measured_bubble_fraction(simulate(all_actions("1f1b", 4, 8), t_forward=1, t_backward=2))
    assert checks.check_backward_twice_forward(slower), "the fraction does not depend on t_B / t_F"
    assert checks.check_dualpipev_unequal(12) and not checks.check_dualpipev_unequal(6)
    peaks = [max(peak_in_flight(a) for a in all_actions(s, 4, 8)) for s in ("zbv", "dualpipev")]
    assert peaks == [8, 9] and checks.check_zbv_against_dualpipev(*peaks)
