"""The first divergence of a hung run, from its ranks' flight-recorder dumps (communication/hang_lab.py).

The dumps were recorded once from real runs of the planted bugs of ``communication/labs/hang_workers.py`` on 2-3 gloo
ranks (``python -m tests.support.hang_fixtures``; the bugs of messages under the NCCL rules), so these tests are fast
and the same on every machine; the live runs are in ``test_hang_runs.py``. Each test names the wrong solution it
rejects (tests/instructor/planted.py); correct analyses written otherwise pass them (its ``ALTERNATIVES``).
"""
from __future__ import annotations

from pathlib import Path

import pytest

from communication import hang_lab
from course.flight_recorder import Record, load_records

pytestmark = pytest.mark.a5_4_4

DUMPS = Path(__file__).resolve().parent / "hang_dumps"


def dumps(case: str) -> dict[int, list[Record]]:
    return load_records(DUMPS / case)


def summary(divergences) -> set[tuple]:
    """What each divergence names: group, number, pair, and per rank the operation and sizes it posted (or None)."""
    return {(d.group, d.seq, d.pair, tuple((r, None if rec is None else (rec.op, rec.sizes))
                                           for r, rec in sorted(d.posted.items())))
            for d in divergences}


def nth(records: dict[int, list[Record]], rank: int, group: str, op: str, n: int) -> Record:
    return [r for r in records[rank] if r.group == group and r.op == op][n]


def test_a_rank_that_left_early_is_named_at_the_collective_it_never_posted():
    records = dumps("early_stop")  # rank 1 left the loop after 2 all-reduces, rank 0 posted a third
    found = hang_lab.first_divergences(records)
    assert summary(found) == {("0", 3, None, ((0, ("all_reduce", ((8,),))), (1, None)))}, \
        f"expected: group 0, collective #3, posted by rank 0 only; got {summary(found)}"
    assert found[0].ranks == (1,) and found[0].kind == "missing"


def test_receives_posted_before_sends_are_two_unanswered_messages():
    records = dumps("receive_first")  # each rank receives from the other before it sends
    found = hang_lab.first_divergences(records)
    assert summary(found) == {("0", 1, (1, 0), ((0, ("recv", ((4,),))), (1, None))),
                              ("0", 1, (0, 1), ((0, None), (1, ("recv", ((4,),)))))}, \
        f"expected message 1 of both directions, each a receive without its send; got {summary(found)}"


def test_a_collective_on_the_wrong_group_diverges_in_both_groups():
    records = dumps("wrong_group")  # rank 1 sums over the world where ranks 0 and 1 should sum in tp
    found = hang_lab.first_divergences(records)
    tp = nth(records, 0, "1", "all_reduce", 0).group
    assert summary(found) == {
        ("0", 2, None, ((0, None), (1, ("all_reduce", ((8,),))), (2, ("all_reduce", ((8,),))))),
        (tp, 1, None, ((0, ("all_reduce", ((8,),))), (1, None))),
    }, f"expected world #2 without rank 0 and tp #1 without rank 1 (rank 2 is no member of tp); got {summary(found)}"


def test_messages_posted_in_crossed_orders_meet_a_receive_of_another_size():
    records = dumps("crossed_sizes")  # rank 0 sends 4 then 8 numbers, rank 1 receives 8 first
    found = hang_lab.first_divergences(records)
    assert summary(found) == {("0", 1, (0, 1), ((0, ("send", ((4,),))), (1, ("recv", ((8,),)))))}, \
        f"expected message 1 from rank 0 to rank 1, sent as [4] and received into [8]; got {summary(found)}"
    assert found[0].kind == "mismatch"


def test_a_send_that_no_receive_meets_is_a_divergence():
    records = dumps("unmatched_send")  # stage 0 sends 3 micro-batches, stage 1 receives 2 and waits in an all-reduce
    found = hang_lab.first_divergences(records)
    assert summary(found) == {("0", 3, (0, 1), ((0, ("send", ((2,),))), (1, None))),
                              ("0", 2, None, ((0, None), (1, ("all_reduce", ((1,),)))))}, \
        "expected message 3 from rank 0 to rank 1, a send no receive meets (NCCL blocks the sender in it: walk the " \
        f"sends too, not only the receives), and the all-reduce #2 rank 0 never reached; got {summary(found)}"
    assert {d.ranks for d in found} == {(1,), (0,)}


def test_a_message_received_into_another_dtype_of_the_same_count_is_a_divergence():
    records = dumps("mistyped_message")  # 4 float32 numbers sent, received into 4 float64 ones
    found = hang_lab.first_divergences(records)
    assert [(d.group, d.seq, d.pair, d.kind) for d in found] == [("0", 1, (0, 1), "mismatch")], \
        "the same element count in another dtype is another number of bytes (NCCL would read the wrong ones): " \
        f"compare a send and its receive by sizes and dtypes; got {summary(found)}"
    assert (found[0].posted[0].dtypes, found[0].posted[1].dtypes) == (("Float",), ("Double",))


def test_messages_to_and_from_a_rank_without_a_dump_are_not_judged():
    records = dumps("undumped_rank")  # pipeline 0 -> 1 -> 2 and back; rank 2 was killed (SIGKILL) and left no dump
    assert sorted(records) == [0, 1]
    found = hang_lab.first_divergences(records)
    assert summary(found) == {("0", 1, (1, 0), ((0, ("recv", ((3,),))), (1, None)))}, \
        "rank 2 left no dump: what it received or sent is unknown, so rank 1's send to it and receive from it are " \
        "judged against nothing; the pair of ranks 0 and 1, both dumped, is (rank 0 waits for a gradient rank 1 " \
        f"never sent); got {summary(found)}"
    assert hang_lab.diagnose(DUMPS / "undumped_rank").undumped == [2]


def test_an_all_to_all_of_uneven_splits_is_no_divergence():
    records = dumps("uneven_all_to_all")  # MoE dispatch and combine: each rank sends its own number of tokens
    dispatch = [nth(records, rank, "0", "all_to_all", 1) for rank in (0, 1)]
    assert dispatch[0].seq == dispatch[1].seq and dispatch[0].sizes != dispatch[1].sizes  # uneven by design
    found = hang_lab.first_divergences(records)
    assert found == [], "an all-to-all's sizes differ between ranks by design (MoE dispatch): compare collectives " \
                        f"by Record.signature, not by a hand-written (op, sizes, dtypes); got {summary(found)}"
    records[1] = [r for r in records[1] if (r.op, r.seq) != ("all_to_all", 3)]  # rank 1 skips the combine
    assert {(d.group, d.seq, d.ranks) for d in hang_lab.first_divergences(records)} == {("0", 3, (1,))}, \
        "an all-to-all one rank never posted is still a divergence"


def test_a_run_that_did_not_hang_has_no_divergence():
    # rank 0 posted the world's all-reduce #2 before tp's #1, rank 1 after it; rank 2 is in no tp; a pipeline
    # 0 -> 1 -> 2 and back numbers each rank's sends and receives its own way (p2p_seq_id differs per rank)
    found = hang_lab.first_divergences(dumps("healthy_step"))
    assert found == [], "the healthy step diverges nowhere (line records up by group and seq, not by their place " \
                        f"in a rank's list; messages per pair, not by p2p_seq_id; only a group's members): {summary(found)}"


def test_records_lost_from_the_start_of_a_ring_buffer_are_no_divergence():
    records = dumps("healthy_step")
    # rank 1's buffer kept only its newest records: its first world all-reduce is gone
    records[1] = [r for r in records[1] if r.is_p2p or (r.group, r.seq) not in {("0", 1)}]
    assert hang_lab.first_divergences(records) == [], "a rank whose oldest records left its buffer agrees from the first " \
                                             "seq every member kept: line up by seq, not by place in the list"
    early = dumps("early_stop")
    early[0] = early[0][1:]  # rank 0 lost its all-reduce #1: the divergence is still #3
    assert {(d.group, d.seq) for d in hang_lab.first_divergences(early)} == {("0", 3)}


def record(rank, index, seq, op="all_reduce", sizes=((8,),), group="0", ranks=(0, 1, 2), peer=None):
    return Record(rank, index, group, "default_pg" if group == "0" else "tp", ranks, seq, op, peer is not None, peer,
                  sizes, ("Float",) * len(sizes))


def test_the_first_divergence_is_reported_not_the_last():
    # rank 1 skipped the gradient all-reduce of step 2: from #2 on it is one collective ahead of ranks 0 and 2
    sizes = {1: ((8,),), 2: ((1,),), 3: ((8,),), 4: ((1,),)}
    records = {r: [record(r, i, s, sizes=sizes[s]) for i, s in enumerate(range(1, 5))] for r in (0, 2)}
    records[1] = [record(1, 0, 1, sizes=sizes[1]), record(1, 1, 2, sizes=sizes[2]), record(1, 2, 3, sizes=sizes[4])]
    found = hang_lab.first_divergences(records)
    assert [(d.group, d.seq) for d in found] == [("0", 3)], \
        f"the ranks first disagree at #3 (rank 1's [1] against the others' [8]), not at #4; got {summary(found)}"
    assert found[0].ranks == (1,) and found[0].kind == "mismatch"


def test_a_collective_of_another_size_or_dtype_is_a_divergence():
    records = {r: [record(r, 0, 1), record(r, 1, 2, sizes=((8,),) if r != 2 else ((4,),))] for r in (0, 1, 2)}
    assert [(d.seq, d.ranks) for d in hang_lab.first_divergences(records)] == [(2, (2,))], \
        "the same operation with other sizes is a divergence (compare Record.signature, not the name alone)"
    records = {r: [record(r, 0, 1)] for r in (0, 1)}
    records[1] = [Record(1, 0, "0", "default_pg", (0, 1), 1, "all_reduce", sizes=((8,),), dtypes=("Double",))]
    records[0] = [Record(0, 0, "0", "default_pg", (0, 1), 1, "all_reduce", sizes=((8,),), dtypes=("Float",))]
    assert [d.seq for d in hang_lab.first_divergences(records)] == [1], "a dtype that differs is a divergence"


def test_messages_are_matched_in_order_per_pair_and_group():
    # rank 0 sends twice to rank 1 in the world and once in another group; rank 1 receives them in those orders
    g = ("0", "5")
    records = {
        0: [record(0, 0, 1, "send", ((2,),), g[0], (0, 1), 1), record(0, 1, 1, "send", ((3,),), g[1], (0, 1), 1),
            record(0, 2, 2, "send", ((4,),), g[0], (0, 1), 1)],
        1: [record(1, 0, 1, "recv", ((3,),), g[1], (0, 1), 0), record(1, 1, 2, "recv", ((2,),), g[0], (0, 1), 0),
            record(1, 2, 3, "recv", ((4,),), g[0], (0, 1), 0)],
    }
    assert hang_lab.first_divergences(records) == [], "the k-th send from a to b meets b's k-th receive from a in that group"
    records[1][2] = record(1, 2, 3, "recv", ((5,),), g[0], (0, 1), 0)
    assert [(d.group, d.seq, d.pair) for d in hang_lab.first_divergences(records)] == [("0", 2, (0, 1))]


def test_a_rank_without_a_dump_is_not_judged():
    records = dumps("early_stop")
    del records[1]
    assert hang_lab.first_divergences(records) == [], "rank 1 left no dump: nothing is known of it, so nothing is compared"
