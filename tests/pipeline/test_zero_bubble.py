"""Assignment 5.2.6 — zero-bubble ZB-H1: the backward split into B (input) and W (weights) (graded).

* The action lists equal torch's ``ScheduleInterleavedZeroBubble`` with one chunk per rank
  (its ZB1P order, Qi et al. 2024) for every p <= 4 and every m torch accepts.
* They follow the paper's ZB-H1 (Sec. 3, Fig. 3): without the W's, each rank's list is
  1F1B's; every micro-batch gets one W, after its B, in micro-batch order, rank r
  deferring r of them; every W is in the step's list (none left past the optimizer step);
  the peak number of micro-batches in flight (forwarded, W not yet done) over the ranks
  is 1F1B's.
* The runner's B computes only the input's gradient (the weights have no gradient before
  the first W) and a real 2-process run of a tiny GPT-2 gives the same gradients and
  losses as one process.
"""
import pytest

from pipeline.schedules import one_f_one_b_actions, zb_h1_actions
from pipeline.stage_runner import StageRunner
from tests.support.pipeline import MICRO_SIZES, check_equal_to_single_process, gpt2_schedule_worker, torch_order

pytestmark = pytest.mark.a5_2_6


def _in_flight_peak(actions):
    live, peak = set(), 0
    for kind, i in actions:
        if kind == "F":
            live.add(i)
        elif kind == "W":
            live.discard(i)
        peak = max(peak, len(live))
    return peak


@pytest.mark.parametrize("p", [1, 2, 3, 4])
def test_action_lists_equal_torch_zero_bubble(p):
    checked = 0
    for m in range(1, 13):
        want = torch_order("zero_bubble", p, m)
        if want is None:
            continue
        for rank in range(p):
            got = zb_h1_actions(rank, p, m)
            assert got == [(k, i) for k, i, _ in want[rank]], f"p={p} m={m} rank {rank}:\n got  {got}\n want {want[rank]}"
            checked += 1
    assert checked > 0


def test_golden_lists_p2_m3():
    assert zb_h1_actions(0, 2, 3) == [("F", 0), ("F", 1), ("B", 0), ("W", 0), ("F", 2), ("B", 1), ("W", 1),
                                      ("B", 2), ("W", 2)]
    assert zb_h1_actions(1, 2, 3) == [("F", 0), ("B", 0), ("F", 1), ("B", 1), ("W", 0), ("F", 2), ("B", 2),
                                      ("W", 1), ("W", 2)]


@pytest.mark.parametrize("p,m", [(1, 1), (2, 1), (2, 4), (3, 2), (3, 6), (4, 4), (4, 8), (4, 7), (5, 9)])
def test_lists_follow_zb_h1(p, m):
    peaks = []
    for rank in range(p):
        actions = zb_h1_actions(rank, p, m)
        assert [a for a in actions if a[0] != "W"] == one_f_one_b_actions(rank, p, m), \
            f"rank {rank}: without the W's the list must be 1F1B's"
        assert [a for a in actions if a[0] == "W"] == [("W", i) for i in range(m)], \
            f"rank {rank}: one W per micro-batch, in order, all within the step"
        position = {a: n for n, a in enumerate(actions)}
        assert all(position[("B", i)] < position[("W", i)] for i in range(m)), f"rank {rank}: a W before its B"
        b_seen = 0
        for kind, i in actions:
            if kind == "B":
                b_seen += 1
            if kind == "W" and b_seen < m:
                assert b_seen - i - 1 == min(rank, m), f"rank {rank}: W{i} must come {rank} B's late: {actions}"
        peaks.append(_in_flight_peak(actions))
    assert max(peaks) == max(min(p - r, m) for r in range(p)), f"peak in-flight {peaks} differs from 1F1B's"


class RecordingRunner(StageRunner):
    """Records whether the weights had gradients when the first W started."""

    record = None

    def backward_weight_step(self, i):
        if self.record is None:
            self.record = {"grads_before_first_w": any(p.grad is not None for c in self.chunks
                                                       for p in c.parameters())}
        super().backward_weight_step(i)


@pytest.mark.timeout(240)
def test_two_processes_equal_one_process_and_b_leaves_the_weights():
    from course.launch import launch
    from tests.support.launching import GRADED_COLLECTIVE_TIMEOUT

    check_zero_bubble_runs(launch(gpt2_schedule_worker, 2, "zb-h1", 1, RecordingRunner, timeout=180,
                                  collective_timeout=GRADED_COLLECTIVE_TIMEOUT))


def check_zero_bubble_runs(results):
    check_equal_to_single_process(results, 2)
    m = len(MICRO_SIZES)
    for rank in range(2):
        kinds = [e[0] for e in results[rank]["events"]]
        assert sorted(kinds) == sorted("FBW" * m), f"rank {rank} ran {kinds}"
        assert results[rank]["runner"] == {"grads_before_first_w": False}, \
            f"rank {rank}: B must compute only the input's gradient, the weights wait for W"
    assert max(results[r]["peak_in_flight"] for r in range(2)) == 2
