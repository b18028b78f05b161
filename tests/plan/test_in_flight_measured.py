"""The micro-batches each stage holds, as the planner counts them, against the course's runner: every schedule of
the registry at pp 2 and 3, run by ``pipeline.stage_runner.StageRunner`` on tiny linear stages (one launch of three
gloo ranks, about ten seconds on two idle cores; bounded at 180 s), its ``StepResult.peak_in_flight`` on every rank
beside ``project.planner.memory.peak_held`` of the same action list — the walk the planner's memory uses, in which
a micro-batch is held from its F to its W where the list has one (the runner keeps ZB-H1's graph until the weight
gradient). Counts are exact, so the comparison is equality; a planner that let micro-batches go at B (the
``pipeline.peak_in_flight`` count) is shown to fail it."""
import pytest

from tests.support.planner import CASES

pytestmark = pytest.mark.needs_solution  # the runner executes the reference schedules and StageRunner steps


@pytest.fixture(scope="module")
def measured():
    from course.launch import launch
    from tests.support.planner import in_flight_worker

    out = launch(in_flight_worker, max(CASES), device="cpu", timeout=180)
    return {(key, rank): peak for rank, found in out.items() for key, peak in found.items()}


def test_every_schedule_holds_what_the_planner_walks(measured):
    from pipeline import peak_in_flight
    from pipeline.schedules import SCHEDULES, schedule_actions
    from project.planner.memory import peak_held

    let_go_at_b = []
    for name, entry in SCHEDULES.items():
        for p, m in CASES.items():
            for rank in range(p):
                actions = schedule_actions(name, rank, p, m, 2 if entry.interleaved else 1)
                got = measured[f"{name} {p}", rank]
                assert peak_held(actions) == got, (name, p, rank, got)
                let_go_at_b.append(peak_in_flight(actions) == got)
    assert not all(let_go_at_b), "the count that lets micro-batches go at B must differ somewhere (ZB-H1)"
