"""Assignment 5.2.7 — V-shaped schedules: DualPipeV and ZB-V (graded).

* The action lists of :func:`pipeline.schedules.dualpipev_actions` and :func:`pipeline.schedules.zbv_actions`
  equal what torch's ``ScheduleDualPipeV`` and ``ScheduleZBVZeroBubble`` generate for the same stages and
  micro-batches, for every p <= 4 and every m <= 12 that torch accepts (tests/support/pipeline.py,
  ``torch_v_order``: torch's whole backward "B" is our "BW", its "I" our "B", its ``OVERLAP_F_B`` our pair).
* The lists are complete and ordered: on each of the rank's two chunks every micro-batch has one forward and
  one backward after it, a ``W`` exactly when the backward was split and after it; a pair is a forward of
  one chunk with the whole backward of the other; the lists run without deadlock on the V placement.
* The replayed bubble against the published table (DeepSeek-V3 technical report, Sec. 3.2.1 and Table 2;
  DualPipe repository README, "Pipeline Bubbles and Memory Usage Comparison (based on the same number of PP
  stages)"): there *PP* is the number of **stages**, which DualPipeV runs on PP/2 devices — here ``p``
  ranks hold ``PP = 2p`` stages. With F = B = W = 1 (B: input gradient), the whole backward 2 and a pair F&B
  anywhere between the whole backward and F + whole backward, the most any rank idles is
  (PP/2 - 1)(F&B + B_whole - 3W) = (p - 1)(F&B - 1); 1F1B over the same PP = 2p stages on 2p devices idles
  (PP - 1)(F + B_whole); each DualPipeV rank holds at most PP + 1 = 2p + 1 stage-micro-batches of
  activations, ZB-V 2p. The registry's theoretical bubble fraction equals the replay's.
* A real 2-process run of a tiny GPT-2 on the V placement (rank 0 holds the embeddings and the head) gives
  one process's gradients and losses, for both schedules.

Wrong solutions planted against these checks: tests/instructor/planted.py (key a5_2_7).
"""
import pytest

from pipeline import schedules
from pipeline.metrics import measured_bubble_fraction, peak_in_flight, replay_by_kind
from tests.support.pipeline import torch_v_order

pytestmark = pytest.mark.a5_2_7

GENERATORS = {"dualpipev": lambda r, p, m: schedules.dualpipev_actions(r, p, m),
              "zbv": lambda r, p, m: schedules.zbv_actions(r, p, m)}


@pytest.mark.parametrize("schedule", ["dualpipev", "zbv"])
@pytest.mark.parametrize("p", [1, 2, 3, 4])
def test_action_lists_equal_torch(schedule, p):
    checked = 0
    for m in range(1, 13):
        want = torch_v_order(schedule, p, m)
        if want is None:
            with pytest.raises(ValueError):
                GENERATORS[schedule](0, p, m)
            continue
        for rank in range(p):
            got = GENERATORS[schedule](rank, p, m)
            assert got == want[rank], f"{schedule} p={p} m={m} rank {rank}:\n got  {got}\n want {want[rank]}"
            checked += 1
    assert checked > 0


def test_golden_lists_one_rank():
    """p = 1, m = 2 written out (``(kind, micro-batch, chunk)``; chunk 1 is stage 1, the loss)."""
    assert schedules.dualpipev_actions(0, 1, 2) == [
        ("F", 0, 0), ("F", 0, 1), ("F", 1, 0), ("BW", 0, 1), ("F&B", ("F", 1, 1), ("BW", 0, 0)), ("BW", 1, 1),
        ("B", 1, 0), ("W", 1, 0)]
    assert schedules.zbv_actions(0, 1, 2) == [
        ("F", 0, 0), ("F", 0, 1), ("B", 0, 1), ("W", 0, 1), ("F", 1, 0), ("B", 0, 0), ("W", 0, 0), ("F", 1, 1),
        ("B", 1, 1), ("W", 1, 1), ("B", 1, 0), ("W", 1, 0)]


@pytest.mark.parametrize("schedule,p,m", [("dualpipev", 1, 2), ("dualpipev", 2, 4), ("dualpipev", 3, 7),
                                          ("dualpipev", 4, 8), ("dualpipev", 4, 11), ("zbv", 1, 1), ("zbv", 2, 3),
                                          ("zbv", 3, 8), ("zbv", 4, 5), ("zbv", 4, 9)])
def test_lists_are_complete_and_ordered(schedule, p, m):
    lists = [GENERATORS[schedule](r, p, m) for r in range(p)]
    # the V placement the lists run on (course code, pipeline.schedules.stage_of): rank r holds stages r, 2p - 1 - r
    for r in range(p):
        assert [schedules.stage_of(r, c, p, "v") for c in (0, 1)] == [r, 2 * p - 1 - r]
    assert [schedules.rank_of(s, p, "v") for s in range(2 * p)] == [*range(p), *reversed(range(p))]
    for rank, actions in enumerate(lists):
        for action in actions:
            if action[0] == "F&B":
                (fk, _, fc), (bk, _, bc) = action[1:]
                assert (fk, bk) == ("F", "BW") and fc != bc, \
                    f"rank {rank}: a pair is a forward of one chunk with the whole backward of the other: {action}"
        flat = schedules.flatten_pairs(actions)
        position = {}
        for n, (kind, i, c) in enumerate(flat):
            assert (kind, i, c) not in position, f"rank {rank}: {kind}{i} of chunk {c} twice"
            position[kind, i, c] = n
        for c in (0, 1):
            for kind in ("F",):
                assert [i for k, i, cc in flat if k == kind and cc == c] == list(range(m)), \
                    f"rank {rank} chunk {c}: the forwards of micro-batches 0 .. {m - 1} in order"
            backwards = [(k, i) for k, i, cc in flat if k in ("B", "BW") and cc == c]
            assert [i for _, i in backwards] == list(range(m)), \
                f"rank {rank} chunk {c}: one backward per micro-batch, in order: {backwards}"
            for kind, i in backwards:
                assert position[kind, i, c] > position["F", i, c], f"rank {rank}: backward of {i} before its forward"
                if kind == "B":
                    assert position.get(("W", i, c), -1) > position["B", i, c], \
                        f"rank {rank} chunk {c}: the weight gradient of {i} missing or before its B"
                else:
                    assert ("W", i, c) not in position, f"rank {rank}: a W after the whole backward of {i}"
    # the V placement: the lists run to the end (every action's input is made by an earlier action)
    costs = {"F": 1.0, "B": 1.0, "W": 1.0, "BW": 2.0, "F&B": 3.0}
    replay_by_kind(lists, costs, placement="v")


@pytest.mark.parametrize("p", [2, 3, 4])
def test_bubble_and_activations_against_the_published_table(p):
    pp = 2 * p  # the table's PP: the number of stages; DualPipeV runs them on PP / 2 = p devices
    f = b = w = 1.0  # b: input gradient only; the whole backward is b + w
    whole = b + w
    for m in (pp, pp + 3, 2 * pp):
        lists = [schedules.dualpipev_actions(r, p, m) for r in range(p)]
        for pair in (whole, whole + 0.5, f + whole):  # overlapped: at most F + whole, at least the whole backward
            events = replay_by_kind(lists, {"F": f, "B": b, "W": w, "BW": whole, "F&B": pair}, placement="v")
            span = max(e[3] for ev in events for e in ev) - min(e[2] for ev in events for e in ev)
            idle = [span - sum(e[3] - e[2] for e in ev) for ev in events]
            # unit costs: sums of a few halves and wholes, exact in binary floating point
            assert max(idle) == (pp / 2 - 1) * (pair + whole - 3 * w), f"m={m} F&B={pair}: idle per rank {idle}"
        one_f_one_b = [schedules.one_f_one_b_actions(r, pp, m) for r in range(pp)]
        events = replay_by_kind(one_f_one_b, {"F": f, "B": whole})
        span = max(e[3] for ev in events for e in ev)
        assert span - m * (f + whole) == (pp - 1) * (f + whole), "1F1B's bubble (PP - 1)(F + B)"
        assert max(peak_in_flight(a) for a in lists) == pp + 1, "DualPipeV: PP + 1 micro-batches' activations"
        zbv = [schedules.zbv_actions(r, p, m) for r in range(p)]
        assert max(peak_in_flight(a) for a in zbv) == pp, "ZB-V: PP micro-batches' activations (Qi et al. 2024, Sec. 6)"
        for name, actions in (("dualpipev", lists), ("zbv", zbv)):
            events = replay_by_kind(actions, {"F": 1.0, "B": 1.0, "W": 1.0, "BW": 2.0, "F&B": 3.0}, placement="v")
            # the registry's bubble fraction (p - 1) / (w m + p - 1): ratios of small integers, to rounding
            assert measured_bubble_fraction(events) == pytest.approx(schedules.get_schedule(name).bubble(p, m),
                                                                     abs=1e-12), name


@pytest.mark.timeout(240)
def test_two_processes_equal_one_process():
    from course.launch import launch
    from tests.support.launching import GRADED_COLLECTIVE_TIMEOUT
    from tests.support.pipeline import MICRO_SIZES, check_equal_to_single_process
    from tests.support.rendezvous import schedules_worker

    names = ["dualpipev", "zbv"]
    out = launch(schedules_worker, 2, names, 1, timeout=180, collective_timeout=GRADED_COLLECTIVE_TIMEOUT)
    m = len(MICRO_SIZES)
    for n, name in enumerate(names):
        results = {rank: res[n] for rank, res in out.items()}
        try:
            check_equal_to_single_process(results, 2)
        except AssertionError as exc:
            raise AssertionError(f"{name}: {exc}") from None
        assert results[0]["last_rank"] == 0 and sorted(results[0]["losses"]) == list(range(m)), \
            f"{name}: rank 0 holds the last stage and computes the losses"
        for rank in range(2):
            assert sorted(results[rank]["event_chunks"]).count(1) > 0, f"{name}: rank {rank} ran no chunk-1 action"
