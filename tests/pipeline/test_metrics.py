"""Ungraded: bubble fraction, in-flight counts and timelines of the pipeline schedules.

The idealised timelines (:func:`pipeline.metrics.simulate`) of GPipe and 1F1B have exactly
the bubble (p - 1) / (m + p - 1). A real 3-process 1F1B run with stages of equal cost (each
forward and backward sleeps 50 ms) is checked on what it recorded, never on how long it took:
every rank ran the 1F1B action list in order, no action started before the action on another
rank it needs had ended, the in-flight peaks are 1F1B's, and the replay of its recorded actions
(:func:`pipeline.metrics.replay`) has the formula's bubble — exactly with the stages' nominal
costs, and with the measured per-action durations inside bounds derived from their spread. Its
wall-clock bubble (which also holds the send/recv latency and, on a loaded machine, the time a
woken rank waits for a core) is reported as a test property, not asserted.
"""
import pytest

from pipeline.metrics import (bubble_fraction, handover_latencies, measured_bubble_fraction, peak_in_flight, replay,
                              simulate)
from pipeline.schedules import SCHEDULES, all_actions


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


def _span(events):
    return max(e[3] for rank in events for e in rank) - min(e[2] for rank in events for e in rank)


@pytest.mark.needs_solution
@pytest.mark.timeout(200)
def test_real_1f1b_run_with_equal_stages_has_the_formula_bubble(record_property):
    from pipeline.labs.bubble_experiment import measure_bubble

    p, ms, t = 3, [1, 6], 0.05
    report = measure_bubble(p, ms, "1f1b", t_forward=t, t_backward=t, repeats=1)
    for m in ms:
        events, actions = report["events"][m], all_actions("1f1b", p, m)
        # the ranks ran 1F1B: each its own action list, in order
        assert [[(e[0], e[1]) for e in rank] for rank in events] == actions, f"m={m}: recorded {events}"
        assert report["peak_in_flight"][m] == [min(p - r, m) for r in range(p)]
        # ... and waited for their inputs: F(i) on rank r starts after F(i) ended on r - 1, B(i) after B(i) on r + 1.
        # The runner's spans hold the computation only (the receive comes before the span opens), and all ranks
        # read the same clock (one machine), so this is an order of recorded events, true at any load.
        end = {(r, e[0], e[1]): e[3] for r, rank in enumerate(events) for e in rank}
        for r, rank in enumerate(events):
            for kind, i, start, _ in rank:
                dep = (r - 1, "F", i) if kind == "F" else (r + 1, "B", i)
                if dep in end:
                    assert start >= end[dep], f"m={m}: {kind}{i} on rank {r} started before {dep} ended"
        # The replay of the recorded actions with the stages' nominal costs has the formula's bubble; the 1e-12 is
        # float64 rounding of sums of 2(m + p - 1) <= 16 terms of 0.05 (16 x 2^-53 x 0.8 s ~ 1.4e-15, with room).
        nominal = replay(actions, [[t] * len(rank) for rank in actions])
        assert measured_bubble_fraction(nominal) == pytest.approx(bubble_fraction(p, m), abs=1e-12)
        # With the measured durations d (each the 50 ms sleep plus what the machine added), the replay's span T is
        # monotone in every duration (a max-plus recursion), so 2(m + p - 1) d_min <= T <= 2(m + p - 1) d_max, and
        # its bubble 1 - sum(d) / (p T) lies between the two values below; both equal the formula when all the
        # durations are equal (the formula lies between them: 2pm d_min <= sum(d) <= 2pm d_max). Bounds derived from
        # this run's spread, not tuned to a machine, so the check holds at any load; the 1e-12 is float64 rounding.
        durations = [[e[3] - e[2] for e in rank] for rank in events]
        flat = [d for rank in durations for d in rank]
        replayed = measured_bubble_fraction(replay(actions, durations))
        low = 1 - sum(flat) / (p * 2 * (m + p - 1) * min(flat))
        high = 1 - sum(flat) / (p * 2 * (m + p - 1) * max(flat))
        assert low - 1e-12 <= replayed <= high + 1e-12, f"m={m}: replayed bubble {replayed:.3f}, not in [{low:.3f}, {high:.3f}]"
        # reported, not asserted: the wall clock adds the hand-over latency and the machine's load
        record_property(f"bubble_m{m}", dict(formula=bubble_fraction(p, m), replayed=replayed,
                                             wall_clock=report["bubble"][m], span_s=_span(events)))
        print(f"m={m}: formula {bubble_fraction(p, m):.3f}, replay of measured durations {replayed:.3f}, "
              f"wall clock {report['bubble'][m]:.3f}")


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
