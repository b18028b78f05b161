"""Assignment 5.2.5 — interleaved 1F1B with virtual stages (graded).

* The action lists equal torch's ``ScheduleInterleaved1F1B`` order (``pipeline_order``,
  Megatron-LM's schedule, Narayanan et al. 2021, Sec. 2.2.2) for every p <= 4, v <= 3 and
  every m torch accepts, on every rank; the warm-up is (p - rank - 1) * 2 + (v - 1) * p
  forwards when p divides m; m that torch rejects raises.
* A real 2-process run of a tiny GPT-2 cut into v * p = 4 virtual stages (each rank holds
  2 chunks) gives the same gradients and losses as one process.
"""
import pytest

from tests.support.pipeline import MICRO_SIZES, check_equal_to_single_process, gpt2_schedule_worker, torch_order
from pipeline.schedules import interleaved_1f1b_actions

pytestmark = pytest.mark.a5_2_5

CASES = [(p, v, m) for p in range(1, 5) for v in range(1, 4) for m in range(1, 13)]


@pytest.mark.parametrize("p", [1, 2, 3, 4])
def test_action_lists_equal_torch_interleaved_1f1b(p):
    checked = 0
    for q, v, m in CASES:
        if q != p:
            continue
        want = torch_order("interleaved", p, m, v)
        if want is None:
            with pytest.raises(ValueError):
                interleaved_1f1b_actions(0, p, m, v)
            continue
        for rank in range(p):
            got = interleaved_1f1b_actions(rank, p, m, v)
            assert got == want[rank], f"p={p} v={v} m={m} rank {rank}:\n got  {got}\n want {want[rank]}"
            checked += 1
    assert checked > 0


def test_golden_list_p2_v2_m4():
    F = lambda i, c: ("F", i, c)  # noqa: E731
    B = lambda i, c: ("B", i, c)  # noqa: E731
    assert interleaved_1f1b_actions(0, 2, 4, 2) == [
        F(0, 0), F(1, 0), F(0, 1), F(1, 1), F(2, 0), B(0, 1), F(3, 0), B(1, 1),
        F(2, 1), B(0, 0), F(3, 1), B(1, 0), B(2, 1), B(3, 1), B(2, 0), B(3, 0)]
    assert interleaved_1f1b_actions(1, 2, 4, 2) == [
        F(0, 0), F(1, 0), F(0, 1), B(0, 1), F(1, 1), B(1, 1), F(2, 0), B(0, 0),
        F(3, 0), B(1, 0), F(2, 1), B(2, 1), F(3, 1), B(3, 1), B(2, 0), B(3, 0)]


@pytest.mark.parametrize("p,v,m", [(2, 2, 4), (4, 2, 8), (4, 3, 8), (3, 3, 6), (2, 3, 10)])
def test_warmup_is_megatrons(p, v, m):
    for rank in range(p):
        actions = interleaved_1f1b_actions(rank, p, m, v)
        warmup = min((p - rank - 1) * 2 + (v - 1) * p, v * m)
        assert all(a[0] == "F" for a in actions[:warmup]), f"rank {rank}: {warmup} warm-up forwards"
        if warmup < v * m:
            assert actions[warmup][0] == "F" and actions[warmup + 1][0] == "B", \
                f"rank {rank}: the first backward comes right after the forward that follows the warm-up"


def test_bad_input_raises():
    with pytest.raises(ValueError):
        interleaved_1f1b_actions(0, 4, 9, 2)  # 9 micro-batches: not a multiple of max(1, 9 // 4) = 2 rounds
    with pytest.raises(ValueError):
        interleaved_1f1b_actions(0, 2, 4, 0)


@pytest.mark.timeout(240)
def test_two_processes_with_two_chunks_each_equal_one_process():
    from course.launch import launch
    from tests.support.launching import GRADED_COLLECTIVE_TIMEOUT

    results = launch(gpt2_schedule_worker, 2, "interleaved", 2, timeout=180, collective_timeout=GRADED_COLLECTIVE_TIMEOUT)
    check_equal_to_single_process(results, 2)
    for rank in range(2):
        chunks = results[rank]["event_chunks"]
        assert sorted(set(chunks)) == [0, 1], f"rank {rank} ran its two chunks"
        assert len(results[rank]["events"]) == 2 * 2 * len(MICRO_SIZES)
