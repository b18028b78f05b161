"""The replica-group launcher's own failures, with workers that need no model: a rank that ends unplanned is named
with its cause, and a group SIGKILLed in the middle of a message to the launcher stops no other group's messages
(each rank writes to a pipe of its own; through one queue shared by every rank, the dead writer kept the queue's
write lock and the survivors' events never arrived: the run hung until its timeout)."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from course.launch import RankFailure
from course.replica_groups import Fault, launch_replica_groups
from tests.support import replica_workers

TIMEOUT = 60.0  # seconds: the launcher's own limit; each run below takes a few seconds when it works


def assert_all_ended(pids) -> None:
    alive = [p for p in pids if os.path.exists(f"/proc/{p}") and Path(f"/proc/{p}/stat").read_text().split()[2] != "Z"]
    assert not alive, f"processes still alive: {alive}"


@pytest.mark.timeout(TIMEOUT + 30)
@pytest.mark.parametrize("how, said", [("exit", r"replica group 1 rank 0 died \(exit code 3\) without a planned"),
                                       ("raise", r"(?s)replica group 1 \(incarnation 0\) rank 0 raised:.*on purpose")])
def test_a_rank_that_ends_unplanned_is_named_with_its_cause(how, said):
    with pytest.raises(RankFailure, match=said) as failure:
        launch_replica_groups(replica_workers.exits_or_raises, 2, 1, how, device="cpu", backend="gloo",
                              timeout=TIMEOUT)
    assert failure.value.rank == 0


@pytest.mark.timeout(TIMEOUT + 30)
def test_a_group_killed_in_mid_message_stops_no_other_groups_messages():
    run = launch_replica_groups(replica_workers.chatters_until_killed, 2, 1, 1 << 16, faults=(Fault(1, 1),),
                                device="cpu", backend="gloo", timeout=TIMEOUT)
    assert len(run.of("chatter", 1)) > 0, "the killed group's thread sent nothing before the kill"
    assert [e["step"] for e in run.of("after_the_kill", 0)] == [1] and run.of("fault_point", 0)[-1]["step"] == 2
    assert run.results == {(0, 0, 0): 0}
    assert_all_ended(run.pids)
