"""The planted hangs of communication/labs/hang_workers.py run for real on 2-3 gloo ranks with the flight recorder on:
the course's analysis names the rank, the operation and the sequence number, the launcher's own report (which
ranks waited where, which had returned) says the same, and torch's analyser ``fr_trace`` agrees on the collectives.

Every run is bounded: a rank stuck in a collective raises after ``COLLECTIVE_TIMEOUT`` s and dumps (the launcher
stops the rest; pytest's timeout bounds the test). These runs take seconds each, so they carry no key; the graded
tests read recorded dumps (test_hang_analysis.py).
"""
from __future__ import annotations

import re
import subprocess
import sys

import pytest

from communication.hang_lab import diagnose, main
from communication.labs.hang_workers import run_planted
from course.flight_recorder import load_records

# Seconds a rank waits in a collective before it raises and dumps. The collectives before each planted bug are a
# handful of tiny ones that every rank posts within milliseconds of the others; 6 s leaves a loaded 2-core machine
# room for them, and the launcher's run timeout (120 s) bounds the whole run.
COLLECTIVE_TIMEOUT = 6.0


def launcher_account(message: str) -> tuple[dict[int, str], set[int]]:
    """From a :class:`course.launch.RankFailure` message: ``{rank: "file:line"}`` of the ranks it shows waiting or
    raising in the workers' code, and the ranks it says had returned."""
    where: dict[int, str] = {}
    raised = re.match(r".*?rank (\d+) raised", message.splitlines()[0])
    frames = re.findall(r'File "[^"]*?(communication/labs/hang_workers\.py)", line (\d+)', message)
    if raised and frames:
        where[int(raised.group(1))] = f"{frames[-1][0]}:{frames[-1][1]}"
    for rank, path, line in re.findall(r"rank (\d+): (?:timed out waiting at|waiting in \w+, called at) "
                                       r"\S*?(communication/labs/hang_workers\.py):(\d+)", message):
        where[int(rank)] = f"{path}:{line}"
    returned = re.search(r"rank\(s\) \[([\d, ]+)\] had already returned", message)
    return where, {int(r) for r in returned.group(1).split(",")} if returned else set()


def last_posted(run_dir) -> dict[int, str]:
    """``{rank: "file:line"}`` of each rank's last record (where it waited when its dump was written)."""
    return {rank: recs[-1].where.split(" in ")[0] for rank, recs in load_records(run_dir).items() if recs}


@pytest.mark.needs_solution  # the analysis is assignment 5.4.4's
@pytest.mark.timeout(240)
@pytest.mark.parametrize("name", ["early_stop", "receive_first", "wrong_group"])
def test_planted_hang_is_named_by_the_flight_recorder_and_the_launcher_alike(name, tmp_path):
    failure = run_planted(name, tmp_path / name, collective_timeout=COLLECTIVE_TIMEOUT)
    assert failure is not None, f"{name} ran through; it should hang"
    diagnosis = diagnose(tmp_path / name)
    records = load_records(tmp_path / name)
    found = {(d.group, d.seq, d.pair): d for d in diagnosis.divergences}
    if name == "early_stop":  # rank 1 left after 2 all-reduces: it never posted rank 0's third
        third = [r for r in records[0] if r.op == "all_reduce"][2]
        assert list(found) == [("0", third.seq, None)] and found["0", third.seq, None].ranks == (1,)
        # torch's analyser, on torch's form of the same dumps, names the same collective and the same rank
        out = subprocess.run([sys.executable, "-m", "torch.distributed.flight_recorder.fr_trace",
                              str(tmp_path / name / "torch")], capture_output=True, text=True, timeout=120)
        text = out.stdout + out.stderr
        assert out.returncode == 0, text
        assert f"Not all ranks joining collective, sequence number: {third.seq}" in text, text
        assert "missing ranks: {1}" in text, text
    elif name == "receive_first":  # each receives first: message 1 of both directions is unanswered
        assert sorted(found) == [("0", 1, (0, 1)), ("0", 1, (1, 0))]
        assert {d.op for d in found.values()} == {"recv"} and {d.ranks for d in found.values()} == {(0,), (1,)}
        assert "crossed order" in diagnosis.text()
    else:  # rank 1 summed over the world instead of tp
        tp = next(r.group for r in records[0] if r.group_desc == "tp")
        world_seq = [r for r in records[2] if r.op == "all_reduce"][1].seq
        assert sorted(found) == sorted([("0", world_seq, None), (tp, 1, None)])
        assert found["0", world_seq, None].ranks == (0,) and found[tp, 1, None].ranks == (1,)
        assert "wrong group" in diagnosis.text()
    # the launcher's account: the ranks it shows waiting wait where their last record was posted; the ranks it
    # says had returned are the ones the flight recorder finds missing
    waiting, returned = launcher_account(str(failure))
    assert waiting, f"the launcher named no rank's place:\n{failure}"
    posted = last_posted(tmp_path / name)
    for rank, line in waiting.items():
        assert posted[rank] == line, f"rank {rank}: the launcher says {line}, its last record {posted[rank]}"
    missing = {r for d in diagnosis.divergences for r in d.ranks if d.posted[r] is None}
    if name == "early_stop":  # the launcher: rank 1 had returned when rank 0 timed out; the recorder: it is missing
        assert returned == missing == {1}, f"returned {returned}, missing from a collective {missing}:\n{failure}"


@pytest.mark.needs_solution
@pytest.mark.timeout(240)
def test_messages_in_crossed_orders_rendezvous_on_a_receive_of_another_size(tmp_path):
    # under NCCL's rules (course.nccl_rules), the first send meets a receive of the other size and raises
    failure = run_planted("crossed_sizes", tmp_path / "run", collective_timeout=COLLECTIVE_TIMEOUT)
    assert failure is not None and "NcclRuleError" in str(failure)
    (d,) = diagnose(tmp_path / "run").divergences
    assert (d.pair, d.seq, d.kind) == ((0, 1), 1, "mismatch")
    assert (d.posted[0].sizes, d.posted[1].sizes) == (((4,),), ((8,),))
    waiting, _ = launcher_account(str(failure))
    assert waiting[0] == d.posted[0].where.split(" in ")[0], f"the launcher: {waiting}; the recorder: {d.describe()}"


@pytest.mark.timeout(240)
def test_a_step_that_does_not_hang_leaves_dumps_that_agree(tmp_path):
    assert run_planted("healthy_step", tmp_path / "run", collective_timeout=COLLECTIVE_TIMEOUT) is None
    records = load_records(tmp_path / "run")
    assert sorted(records) == [0, 1, 2]
    sends = [r for r in records[1] if r.is_p2p]
    assert [(r.op, r.peer) for r in sends] == [("recv", 0), ("send", 2), ("recv", 2), ("send", 0)], \
        "gloo's own recorder omits sends and receives; the course records each once, in posting order"
    assert [r.where.split(":")[0] for r in sends] == ["communication/labs/hang_workers.py"] * 4


@pytest.mark.timeout(240)
def test_an_uneven_all_to_all_is_recorded_under_a_name_whose_sizes_may_differ(tmp_path):
    # the graded dumps of the uneven all-to-all were recorded once; this run checks that torch still names the
    # operation as Record.signature expects (sizes differing between ranks by design), so they stay true
    from course.flight_recorder import COLLECTIVES_OF_UNEVEN_SIZES

    assert run_planted("uneven_all_to_all", tmp_path / "run", collective_timeout=COLLECTIVE_TIMEOUT) is None
    records = load_records(tmp_path / "run")
    dispatch = [[r for r in records[rank] if r.op in COLLECTIVES_OF_UNEVEN_SIZES][1] for rank in (0, 1)]
    assert dispatch[0].sizes != dispatch[1].sizes, [r.describe() for r in dispatch]
    assert [[r.op for r in records[rank]] for rank in (0, 1)] == [["all_to_all"] * 3 + ["all_reduce"]] * 2


@pytest.mark.needs_solution
def test_a_message_received_into_another_dtype_is_explained_as_a_dtype_not_an_order():
    from tests.support.hang_fixtures import FOLDER

    text = diagnose(FOLDER / "mistyped_message").text()
    assert "another dtype" in text and "different orders" not in text, text


@pytest.mark.timeout(240)
@pytest.mark.parametrize("rules", [False, True], ids=["gloo", "nccl-rules"])
def test_a_batch_of_sends_and_receives_is_recorded_once_each_and_still_runs(rules, tmp_path, monkeypatch):
    from course import nccl_rules
    from course.flight_recorder import launch_recorded
    from tests.support.hang_fixtures import swap_in_one_batch

    if rules:  # the emulator replaces torch's batch_isend_irecv; the recorder wraps it
        monkeypatch.setenv(nccl_rules.ENV, "1")
        monkeypatch.setenv(nccl_rules.TIMEOUT_ENV, str(COLLECTIVE_TIMEOUT))
    out = launch_recorded(swap_in_one_batch, 2, run_dir=tmp_path / "run", device="cpu", timeout=120,
                          collective_timeout=COLLECTIVE_TIMEOUT)
    assert out == {0: [1.0] * 3, 1: [0.0] * 3}
    records = load_records(tmp_path / "run")
    for rank in (0, 1):
        assert [(r.op, r.peer, r.sizes) for r in records[rank]] == [("send", 1 - rank, ((3,),)),
                                                                     ("recv", 1 - rank, ((3,),))], records[rank]


@pytest.mark.needs_solution
def test_the_command_line_prints_the_diagnosis(capsys):
    from tests.support.hang_fixtures import FOLDER

    assert main([str(FOLDER / "wrong_group")]) == 0
    out = capsys.readouterr().out
    assert "wrong group" in out and "collective #1" in out


def test_a_folder_without_dumps_is_refused_with_what_to_do(tmp_path, capsys):
    with pytest.raises(SystemExit) as exc:
        main([str(tmp_path)])
    assert exc.value.code == 2 and "launch_recorded" in capsys.readouterr().err
