"""Point-to-point under NCCL's rules, on CPU (docs/architecture.md, "Point-to-point under NCCL's rules").

Every test here runs its ranks with ``LLMSYS_NCCL_RULES=1``: gloo held to what NCCL does
(:mod:`course.nccl_rules`) — the operations of a group run in issue order, a send completes
only once the peer's matching receive runs, messages are matched by order (no tags), the
operations of one ``batch_isend_irecv`` start together. Under it:

* a planted unsafe order (two ranks that each send before they receive) is caught within a
  bounded time, and two messages posted in different orders on the two sides are refused —
  while plain gloo runs both without complaint;
* the ring and the recursive-doubling all-reduce finish at p = 2, 3 and 4 (a5_4_1);
* every pipeline schedule finishes and equals one process: GPipe and 1F1B at p = 4 (a5_2_4),
  interleaved 1F1B at p = 2 with v = 2 (a5_2_5), ZB-H1 at p = 4 (a5_2_6), DualPipeV and ZB-V on the V
  placement at p = 2 (a5_2_7: activations and gradients go both ways between the ranks, and the last rank hands
  stage p - 1's output to stage p inside itself);
* the 3D step finishes and equals one process at (dp, pp, tp) = (1, 2, 2) with 1F1B and
  (2, 2, 1) with GPipe (a5_6_3);
* making a group is collective and its name must meet on every member: a group made by only some
  ranks (which plain gloo allows) and groups made in different orders are refused; two meshes in one
  process — a pipeline of 4 stages, whose middle stages are in no embedding group, then a (1, 2, 2)
  mesh — and the async-checkpoint group after a group that left a rank out are made with names that
  meet on every rank, and the planted wrong ways of making them are caught (issue 38, items 1, 2, 9);
* every rank of a group issues the same collectives in the same order with sizes that agree: two ranks issuing
  two collectives in opposite orders, an all-to-all whose splits disagree between a pair, different dtypes,
  roots and reduce-scatter sizes are refused naming both ranks, the group, the place and both calls, while
  uneven splits that agree run; a collective only one rank of a group issues is named after the rules' timeout
  (issue 53, item 5).
"""
from __future__ import annotations

import pytest
import torch

from course.launch import RankFailure, launch
from tests.support.launching import GRADED_COLLECTIVE_TIMEOUT
from course.nccl_rules import ENV, TIMEOUT_ENV
from tests.support import rendezvous as support


@pytest.fixture
def nccl_rules(monkeypatch):
    """Spawned ranks inherit the environment: they run under the emulated NCCL rules."""
    monkeypatch.setenv(ENV, "1")
    monkeypatch.setenv(TIMEOUT_ENV, "20")


def test_planted_unsafe_order_is_caught_rendezvous(monkeypatch):
    """Gloo runs 'both send, then both receive' (it buffers the sends); under the rules the same order
    ends in a bounded time with a deadlock message naming the wait."""
    monkeypatch.setenv(TIMEOUT_ENV, "4")
    with pytest.raises(RankFailure) as info:
        launch(support.unsafe_order_worker, 2, device="cpu", timeout=60)
    text = str(info.value)
    assert "plain gloo: exchanged" in text or "deadlock under NCCL" in text, text
    assert "deadlock under NCCL's point-to-point rules" in text, text
    # bounded by the rules' 4 s wait, not by the launch's 60 s: said by the report, not timed (the time a
    # loaded machine takes to start the ranks is no part of the verdict)
    assert "waited 4 s for" in text and "did not finish within" not in text, text


def test_messages_matched_by_order_rendezvous(nccl_rules):
    """Tags are ignored: two messages of different sizes sent in one order and received in the other
    meet the wrong partner, and the send says so."""
    with pytest.raises(RankFailure, match="matches messages by order"):
        launch(support.crossed_tags_worker, 2, device="cpu", timeout=60)


def test_batched_exchange_finishes_rendezvous(nccl_rules):
    """The same exchange as the planted one, posted as one batch on each side, finishes."""
    out = launch(support.batched_exchange_worker, 2, device="cpu", timeout=60)
    assert out == {0: 1.0, 1: 0.0}


@pytest.mark.a5_4_1
def test_ring_and_tree_all_reduce_rendezvous(nccl_rules):
    """Ring and recursive doubling at p = 2 (twice, in two sub-groups), 3 and 4 under NCCL's rules equal
    dist.all_reduce (integers exactly)."""
    out = launch(support.all_reduce_worker, 4, device="cpu", timeout=120, collective_timeout=GRADED_COLLECTIVE_TIMEOUT)
    for rank, cases in out.items():
        for name, got, want in cases:
            assert torch.equal(got, want), f"rank {rank}: {name} differs from dist.all_reduce"
    assert {name for name, _, _ in out[0]} >= {"ring p=2", "tree p=2", "ring p=3", "tree p=3", "ring p=4",
                                                 "tree p=4"}


@pytest.mark.a5_2_4
def test_gpipe_and_1f1b_rendezvous(nccl_rules):
    """GPipe and 1F1B at p = 4 under NCCL's rules: they finish, and equal one process."""
    out = launch(support.schedules_worker, 4, ["gpipe", "1f1b"], 1, device="cpu", timeout=200, collective_timeout=GRADED_COLLECTIVE_TIMEOUT)
    for i, schedule in enumerate(["gpipe", "1f1b"]):
        support.check_equal_to_single_process({r: res[i] for r, res in out.items()}, 4, schedule)


@pytest.mark.a5_2_5
def test_interleaved_rendezvous(nccl_rules):
    """Interleaved 1F1B (v = 2) at p = 2 under NCCL's rules: activations travel both ways between the
    two ranks (rank 1's chunk 0 feeds rank 0's chunk 1); it finishes and equals one process."""
    out = launch(support.schedules_worker, 2, ["interleaved"], 2, device="cpu", timeout=200, collective_timeout=GRADED_COLLECTIVE_TIMEOUT)
    support.check_equal_to_single_process({r: res[0] for r, res in out.items()}, 2, "interleaved")


@pytest.mark.a5_2_6
def test_zero_bubble_rendezvous(nccl_rules):
    """ZB-H1 at p = 4 under NCCL's rules: it finishes and equals one process."""
    out = launch(support.schedules_worker, 4, ["zb-h1"], 1, device="cpu", timeout=200, collective_timeout=GRADED_COLLECTIVE_TIMEOUT)
    support.check_equal_to_single_process({r: res[0] for r, res in out.items()}, 4, "zb-h1")


@pytest.mark.a5_2_7
def test_v_schedules_rendezvous(nccl_rules):
    """DualPipeV (paired forward and backward) and ZB-V at p = 2 under NCCL's rules: they finish and equal one
    process (p = 3 and 4: tests/pipeline/test_run_script_rendezvous.py)."""
    out = launch(support.schedules_worker, 2, ["dualpipev", "zbv"], 1, device="cpu", timeout=200,
                 collective_timeout=GRADED_COLLECTIVE_TIMEOUT)
    for i, schedule in enumerate(["dualpipev", "zbv"]):
        support.check_equal_to_single_process({r: res[i] for r, res in out.items()}, 2, schedule)


@pytest.mark.a5_6_3
def test_three_d_step_rendezvous(nccl_rules):
    """The 3D step under NCCL's rules at (1, 2, 2) 1F1B and (2, 2, 1) GPipe: it finishes, and its loss and
    gradients equal one process's (float64)."""
    from tests.three_d.test_step import check
    from tests.support.three_d import layouts_worker

    cases = [dict(dp=1, pp=2, tp=2, micro_batches=4, schedule="1f1b", max_norm=0.5),
             dict(dp=2, pp=2, tp=1, micro_batches=2, schedule="gpipe", max_norm=0.5)]
    out = launch(layouts_worker, 4, cases, device="cpu", timeout=200, collective_timeout=GRADED_COLLECTIVE_TIMEOUT)
    for i, case in enumerate(cases):
        check({rank: r[i] for rank, r in out.items()}, case)


# ---- making groups: collective, with names that meet ---------------------------------------------------------

# (dp, pp, tp) on 4 ranks: pp = 4 (ranks 1, 2 are in no embedding group), then a second mesh
MESHES = [(1, 4, 1), (1, 2, 2)]


def test_a_group_made_by_only_some_ranks_is_caught_rendezvous(monkeypatch):
    """Plain gloo lets rank 0 make a group rank 1 never makes; under the rules rank 0 waits a bounded time
    for rank 1 and says so."""
    monkeypatch.setenv(TIMEOUT_ENV, "4")
    with pytest.raises(RankFailure) as info:
        launch(support.group_by_some_ranks_worker, 2, device="cpu", timeout=60)
    text = str(info.value)
    assert "waited 4 s for rank(s) [1] to make it too" in text and "made by only some ranks" in text, text


def test_groups_made_in_different_orders_are_caught_rendezvous(nccl_rules):
    with pytest.raises(RankFailure, match=r"make different groups at the world's group creation #1 .*"
                                          r"rank 0: group \[0\]; rank 1: group \[1\]"):
        launch(support.groups_in_different_orders_worker, 2, device="cpu", timeout=60)


def test_two_meshes_and_the_checkpoint_group_meet_rendezvous(nccl_rules):
    """A pipeline of 4 stages, then a (1, 2, 2) mesh, then a group without rank 3, then the async-checkpoint
    group: every creation passes the rules, and after each mesh every rank holds as many groups as the
    others (what the names of init_device_mesh's groups on GPUs, and use_local_synchronization's, depend on)."""
    out = launch(support.meshes_and_checkpoint_group_worker, 4, MESHES, device="cpu", timeout=120)
    assert len({tuple(held) for held in out.values()}) == 1, f"groups held per rank after each mesh: {out}"


@pytest.mark.parametrize("planted", ["embedding groups alone", "local checkpoint group"])
def test_planted_names_that_do_not_meet_are_caught_rendezvous(nccl_rules, planted):
    """The embedding groups made alone (the middle stages gain no group: the second mesh's groups would get
    different names on GPUs), or the checkpoint group named from the groups each rank holds (rank 3 holds one
    fewer after the group that left it out: the hang of issue 38, item 1)."""
    with pytest.raises(RankFailure, match="would get a different name on each rank"):
        launch(support.meshes_and_checkpoint_group_worker, 4, MESHES, planted, device="cpu", timeout=120)


# ---- collectives: the same sequence, with sizes that agree, on every rank of a group (rule 6) -------------------


def test_collectives_in_different_orders_and_splits_that_disagree_are_caught_rendezvous(nccl_rules):
    """Two ranks posting two collectives in different orders, an all-to-all whose splits disagree between a pair,
    dtypes, roots and reduce-scatter sizes that differ: each refused on both ranks, naming both ranks, the group, the
    place in its sequence and both calls — while uneven splits that agree run, and the ranks stay in step."""
    out = launch(support.planted_collectives_worker, 2, device="cpu", timeout=60)
    for rank in (0, 1):
        got = out[rank]
        for name in ("orders", "splits", "dtypes", "roots", "reduce_scatter"):
            assert isinstance(got[name], str) and got[name].startswith("refused: "), f"rank {rank}: {name}: {got[name]}"
            assert "between rank 0 and rank 1" in got[name] and "of group planted (ranks [0, 1])" in got[name], got[name]
        assert "collective #2 of group planted" in got["orders"] and "they issue different collectives" in got["orders"]
        assert "rank 0: all_reduce(SUM), float32 [6]" in got["orders"], got["orders"]
        assert "rank 1: all_gather_into_tensor, float32 [2]" in got["orders"], got["orders"]
        assert "collective #3 of group planted" in got["splits"], got["splits"]
        assert "rank 0's input_split_sizes[1] is 3 rows (6 elements), rank 1's output_split_sizes[0] 2 rows" \
            in got["splits"], got["splits"]
        assert "input_split_sizes [2, 2], output_split_sizes [2, 3]" in got["splits"], got["splits"]
        assert "the dtypes differ" in got["dtypes"] and "float64 [4]" in got["dtypes"], got["dtypes"]
        assert "the roots differ" in got["roots"] and "root rank 1" in got["roots"], got["roots"]
        assert "puts in 2 elements for rank 1, whose call expects 3" in got["reduce_scatter"], got["reduce_scatter"]
        assert torch.equal(got["after"], torch.full((2,), 3.0)), f"rank {rank}: the ranks fell out of step: {got}"
    # uneven splits that agree: rank 0 keeps its row 0 and gets rank 1's rows 0-1; rank 1 gets rank 0's rows 1-3
    # and keeps its own rows 2-3
    rows = {r: torch.arange(8, dtype=torch.float32).view(4, 2) + 100 * r for r in (0, 1)}
    assert torch.equal(out[0]["uneven"], torch.cat([rows[0][:1], rows[1][:2]]))
    assert torch.equal(out[1]["uneven"], torch.cat([rows[0][1:], rows[1][2:]]))


def test_a_collective_only_some_ranks_issue_is_named_rendezvous(nccl_rules, monkeypatch):
    """Rank 0 issues an all-reduce its group's other rank never issues (NCCL would wait forever): after the rules'
    2 s, rank 0 says which collective of which group it waited in, and for whom."""
    monkeypatch.setenv(TIMEOUT_ENV, "2")
    out = launch(support.collective_of_one_rank_worker, 2, device="cpu", timeout=60)
    assert out[1] is None
    assert out[0].startswith("rank 0 issues collective #1 of group planted (ranks [0, 1]), all_reduce(SUM), "
                             "float32 [5], and waited 2 s for rank(s) [1] to issue theirs"), out[0]


def test_all_to_all_splits_are_compared_across_the_pair():
    """The rule for uneven splits at p = 3, on signatures alone (no processes): rank i's input split j against
    rank j's output split i. A legitimate non-symmetric exchange passes; the same splits with one pair's two
    sides swapped (sums kept, so a check of totals would pass) is refused naming that pair."""
    from course.collective_signatures import mismatch, signature

    def signatures(sends):  # sends[i][j]: rows rank i sends to rank j (3 elements each)
        rows = []
        for i in range(3):
            inputs, outputs = sends[i], [sends[k][i] for k in range(3)]
            a = dict(input=torch.empty(sum(inputs), 3), output=torch.empty(sum(outputs), 3),
                     input_split_sizes=inputs, output_split_sizes=outputs)
            rows.append(signature("all_to_all_single", a, 3, None))
        return rows

    sends = [[0, 5, 1], [2, 0, 0], [4, 3, 7]]
    assert mismatch(signatures(sends), [0, 1, 2]) is None
    wrong = signatures(sends)
    wrong[1][-3:] = [3 * 3, 0, 5 * 3]  # rank 1 expects 3 rows from rank 0 and 5 from rank 2: the two swapped
    assert mismatch(wrong, [0, 1, 2])[:2] == (0, 1)
