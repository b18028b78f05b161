"""Ungraded: bubble fraction, in-flight counts and timelines of the pipeline schedules.

The idealised timelines (:func:`pipeline.metrics.simulate`) of GPipe and 1F1B have exactly
the bubble (p - 1) / (m + p - 1); a real 3-process 1F1B run with stages of equal cost
(each forward and backward sleeps 50 ms, so the cost does not depend on how many cores the
machine has) measures it within ``TOLERANCE`` — what is left is the send/recv latency between
processes, which the formula leaves out.
"""
import pytest

from pipeline.metrics import (bubble_fraction, handover_latencies, measured_bubble_fraction, peak_in_flight, replay,
                              simulate)
from pipeline.schedules import SCHEDULES, all_actions

TOLERANCE = 0.05  # absolute, on a fraction in [0, 1]


@pytest.mark.needs_solution
@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
@pytest.mark.parametrize("p,m", [(1, 3), (2, 1), (2, 4), (3, 3), (4, 8), (4, 2)])
@pytest.mark.parametrize("t_backward", [1.0, 2.0])
def test_idealised_bubble_matches_formula(schedule, p, m, t_backward):
    events = simulate(all_actions(schedule, p, m), 1.0, t_backward)
    assert measured_bubble_fraction(events) == pytest.approx(bubble_fraction(p, m), abs=1e-12)
    assert sum(len(e) for e in events) == 2 * p * m


@pytest.mark.needs_solution
@pytest.mark.parametrize("p,m", [(2, 4), (4, 8), (4, 2), (3, 1)])
def test_peak_in_flight_gpipe_m_and_1f1b_p_minus_rank(p, m):
    assert [peak_in_flight(a) for a in all_actions("gpipe", p, m)] == [m] * p
    assert [peak_in_flight(a) for a in all_actions("1f1b", p, m)] == [min(p - r, m) for r in range(p)]


def _theory(schedule, p, m, v):
    """Written out here, independently of the registry (pipeline.schedules.SCHEDULES), which the test
    checks: interleaved (p - 1) / (v m + p - 1), ZB-H1 (p - 1) / (3 m + p - 1), else (p - 1) / (m + p - 1)."""
    if schedule == "interleaved":
        return (p - 1) / (v * m + p - 1)
    if schedule == "zb-h1":
        return (p - 1) / (3 * m + p - 1)
    return (p - 1) / (m + p - 1)


@pytest.mark.needs_solution
@pytest.mark.parametrize("schedule,v", [("gpipe", 1), ("1f1b", 1), ("interleaved", 2), ("interleaved", 3),
                                        ("zb-h1", 1)])
@pytest.mark.parametrize("p,m", [(2, 4), (4, 8), (4, 16), (3, 6)])
def test_replay_of_equal_actions_has_each_schedules_theoretical_bubble(schedule, v, p, m):
    """The replay (one core per rank) of actions of equal cost gives each schedule's formula: F = B with
    one chunk; with v chunks each chunk's F and B take 1/v; ZB-H1's F, B and W one unit each."""
    actions = all_actions(schedule, p, m, v)
    unit = 1.0 / v
    durations = [[unit for _ in acts] for acts in actions]
    events = replay(actions, durations)
    assert measured_bubble_fraction(events) == pytest.approx(_theory(schedule, p, m, v), abs=1e-12)
    assert SCHEDULES[schedule].bubble(p, m, v) == pytest.approx(_theory(schedule, p, m, v), abs=1e-15)


@pytest.mark.needs_solution
def test_replay_shows_the_slowest_stage_setting_the_pace():
    """One stage twice as slow: the replayed bubble grows to what the slow stage dictates, and
    the action's measured duration, not the rank's position, decides."""
    p, m = 4, 8
    actions = all_actions("1f1b", p, m)
    slow = [[2.0 if r == p - 1 else 1.0 for _ in acts] for r, acts in enumerate(actions)]
    events = replay(actions, slow)
    span = max(e[3] for rank in events for e in rank)
    assert span == pytest.approx(2 * 2 * m + 2 * (p - 1))  # the slow stage's 2m actions, plus the fill and drain
    assert measured_bubble_fraction(events) > bubble_fraction(p, m)


@pytest.mark.needs_solution
@pytest.mark.parametrize("schedule,v", [("1f1b", 1), ("interleaved", 2), ("zb-h1", 1)])
def test_handover_latency_measured_from_a_replay_is_the_latency_put_in(schedule, v):
    """Every action that waited for another rank in a replay with latency 0.25 started 0.25 after
    the action it waited for; the latency lengthens the step."""
    actions = all_actions(schedule, 4, 8, v)
    durations = [[1.0 for _ in acts] for acts in actions]
    events = replay(actions, durations, latency=0.25)
    gaps = handover_latencies(actions, events)
    assert gaps and all(g == pytest.approx(0.25) for g in gaps)
    free = replay(actions, durations)
    assert max(e[3] for rank in events for e in rank) > max(e[3] for rank in free for e in rank)
    assert handover_latencies(actions, free) == [] or max(handover_latencies(actions, free)) == pytest.approx(0.0)


def test_replay_rejects_mismatched_durations():
    with pytest.raises(ValueError, match="one duration per action"):
        replay([[("F", 0), ("B", 0)]], [[1.0]])


def test_simulate_reports_a_deadlock():
    broken = [[("F", 0), ("B", 0)], [("B", 0), ("F", 0)]]  # rank 1 wants B0 before it has F0
    with pytest.raises(ValueError, match="deadlock"):
        simulate(broken)


def test_bubble_fraction_rejects_bad_input():
    with pytest.raises(ValueError):
        bubble_fraction(0, 4)
    with pytest.raises(ValueError):
        all_actions("zigzag", 2, 2)


@pytest.mark.needs_solution
@pytest.mark.timeout(200)
def test_real_1f1b_run_with_equal_stages_has_the_formula_bubble():
    from pipeline.bubble_experiment import measure_bubble

    p, ms = 3, [1, 6]
    report = measure_bubble(p, ms, "1f1b", t_forward=0.05, t_backward=0.05, repeats=2)
    for m in ms:
        measured, formula = report["bubble"][m], bubble_fraction(p, m)
        assert abs(measured - formula) <= TOLERANCE, f"m={m}: measured {measured:.3f}, formula {formula:.3f}"
        assert report["peak_in_flight"][m] == [min(p - r, m) for r in range(p)]


def test_costs_by_kind_are_the_mean_per_kind_over_ranks_or_per_rank():
    from pipeline.metrics import costs_by_kind

    actions = [[("F", 0), ("B", 0), ("W", 0)], [("F", 0), ("B", 0), ("W", 0), ("F", 1)]]
    durations = [[1.0, 2.0, 3.0], [3.0, 4.0, 5.0, 5.0]]
    assert costs_by_kind(actions, durations) == {"F": 3.0, "B": 3.0, "W": 4.0}  # F: (1 + 3 + 5) / 3
    assert costs_by_kind(actions, durations, per_rank=True) == [{"F": 1.0, "B": 2.0, "W": 3.0},
                                                                {"F": 4.0, "B": 4.0, "W": 5.0}]
    with pytest.raises(ValueError, match="one duration per action"):
        costs_by_kind(actions, [[1.0], [1.0]])


@pytest.mark.needs_solution
@pytest.mark.parametrize("p,m", [(2, 4), (4, 8), (3, 3)])
def test_replay_by_kind_of_equal_costs_is_the_registry_s_theory(p, m):
    from pipeline.metrics import replay_by_kind
    from pipeline.schedules import schedule_actions

    for name, costs in (("1f1b", {"F": 1.0, "B": 2.0}), ("gpipe", {"F": 1.0, "B": 1.0}),
                        ("zb-h1", {"F": 1.0, "B": 1.0, "W": 1.0})):
        actions = [schedule_actions(name, r, p, m) for r in range(p)]
        events = replay_by_kind(actions, costs)
        # exact arithmetic on small integers: the bubble is a ratio of sums of whole time slots
        assert measured_bubble_fraction(events) == pytest.approx(SCHEDULES[name].bubble(p, m), abs=1e-12), name
    actions = [schedule_actions("1f1b", r, p, m) for r in range(p)]
    assert replay_by_kind(actions, {"F": 1.0, "B": 2.0}) == simulate(actions, 1.0, 2.0)
    # per rank: a stage twice as slow leaves the others idle, so the bubble grows past the formula
    slow = [{"F": 1.0, "B": 2.0}] * (p - 1) + [{"F": 2.0, "B": 4.0}]
    assert measured_bubble_fraction(replay_by_kind(actions, slow)) > bubble_fraction(p, m)
    with pytest.raises(KeyError):
        replay_by_kind([schedule_actions("zb-h1", r, p, m) for r in range(p)], {"F": 1.0, "B": 1.0})
    with pytest.raises(ValueError, match="costs for"):
        replay_by_kind(actions, [{"F": 1.0, "B": 2.0}] * (p + 1))
