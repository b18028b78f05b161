"""Workers for :func:`course.replica_groups.launch_replica_groups` that need no model (tests/fault_tolerance)."""
from __future__ import annotations

import os
import threading
import time

from course.replica_groups import fault_point, replica, report, wait_for_start


def exits_or_raises(rank: int, size: int, how: str) -> int:
    """Group 1 ends unplanned (``how``: "exit" — ``os._exit(3)``, or "raise"); group 0 waits to be stopped."""
    wait_for_start()
    if replica().group == 1:
        if how == "exit":
            os._exit(3)
        raise ValueError("group 1 raised on purpose")
    time.sleep(120)
    return rank


def chatters_until_killed(rank: int, size: int, payload_bytes: int) -> int:
    """Group 1 reports events of ``payload_bytes`` from a second thread without pause and is killed at step 1's
    fault point (so the SIGKILL most likely lands in the middle of one of its messages); group 0 goes on to step 2
    and returns."""
    wait_for_start()
    if replica().group == 1:
        def chatter():
            while True:
                report("chatter", data="x" * payload_bytes)
        threading.Thread(target=chatter, daemon=True).start()
        time.sleep(0.5)
    fault_point(1)
    time.sleep(0.5)
    report("after_the_kill", 1)
    fault_point(2)
    return rank
