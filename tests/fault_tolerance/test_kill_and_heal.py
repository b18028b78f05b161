"""Per-step fault tolerance across replica groups (torchft; issue 51, item 1): three replica groups train GPT-2; one
is SIGKILLed in mid-step; the other two take that step again without a restart, with the smaller quorum, and go
on; the killed group, started again, heals from a live peer — its weights bit-identical to the others' — and the
lighthouse and every process are gone when the launcher returns.

Compared with an uninterrupted run of the same configuration: before the kill, and at the step of the kill (the
same weights and the same batch: the aborted attempt applied nothing), the losses are the same floats; after it,
the survivors' gradient is the mean over 2 groups (an effective batch of 2 x 4 sequences instead of 3 x 4), so the
losses differ, and stay within a band of the uninterrupted ones (no rewind, no jump)."""
from __future__ import annotations

import shutil
import socket
from pathlib import Path

import pytest

from course.replica_groups import Fault
from project.modes import run_replica_groups
from project.options.run_fault_tolerant import FaultTolerantConfig

REPLICAS, STEPS, KILL, RESTART = 3, 6, 2, 3
KILLED, SURVIVORS = REPLICAS - 1, range(REPLICAS - 1)
PER_GROUP = 4  # sequences per group per step
# The survivors' losses after the kill stay within this fraction of the uninterrupted run's: one AdamW step moves
# every weight by at most about lr (1e-3) whatever the gradient, so a few steps on a 2-group mean gradient instead
# of a 3-group one shift the loss of a batch by far less than its own size (here ~6.5 nats); 2 % is a jump no
# such step can make, and a rewind to the initial weights (loss ~6.9) would cross it.
BAND = 0.02
# The lighthouse drops a group it has not heard from for this long: twice the run's default, so that a heartbeat
# thread starved by a loaded machine does not drop a live group from a step (the uninterrupted run would then show
# a quorum of 2). The survivors wait about this long after the kill.
HEARTBEAT_MS = 4000
RUN_TIMEOUT = 240.0  # seconds: the launcher's limit of each run (every process stopped, the lighthouse shut down)


@pytest.fixture(scope="module")
def tokenizer_file(tmp_path_factory):
    from tests.support.rendezvous import tiny_tokenizer

    return tiny_tokenizer(tmp_path_factory.mktemp("tokenizer"))


def config(workdir: Path, tokenizer: Path, **drill) -> FaultTolerantConfig:
    workdir.mkdir(parents=True)
    shutil.copy(tokenizer, workdir / tokenizer.name)
    return FaultTolerantConfig.for_test(
        replicas=REPLICAS, preset="tiny", batch_size=REPLICAS * PER_GROUP, model_max_length=32, vocab_size=1000,
        max_train_examples=2000, max_batches=STEPS, n_bleu=0, max_val_batches=1, dropout=0.0, workdir=str(workdir),
        quiet=True, device="cpu", timeout=RUN_TIMEOUT, quorum_timeout=60.0, heartbeat_timeout_ms=HEARTBEAT_MS, **drill)


def commits(run, group: int, incarnation: int = 0) -> dict[int, dict]:
    found = {}
    for e in run.of("commit", group):
        if e["incarnation"] != incarnation:
            continue
        assert e["step"] not in found, f"group {group} committed step {e['step']} twice (a rewind)"
        found[e["step"]] = e
    return found


def assert_no_process_left(run) -> None:
    import os

    alive = [pid for pid in run.pids if os.path.exists(f"/proc/{pid}") and
             Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"]
    assert not alive, f"processes of the run still alive: {alive}"
    host, port = run.lighthouse.removeprefix("http://").rsplit(":", 1)
    with socket.socket() as s:
        s.settimeout(2)
        assert s.connect_ex((host, int(port))) != 0, "the lighthouse still listens after the run returned"


@pytest.mark.timeout(2 * RUN_TIMEOUT + 60)  # two runs, each bounded by the launcher
def test_a_killed_replica_group_is_survived_and_heals_bit_for_bit(tmp_path, tokenizer_file):
    plain = run_replica_groups(config(tmp_path / "plain", tokenizer_file))
    assert_no_process_left(plain)
    reference = {g: commits(plain, g) for g in range(REPLICAS)}
    for g in range(REPLICAS):
        assert sorted(reference[g]) == list(range(STEPS)), f"uninterrupted group {g}: {sorted(reference[g])}"
        assert all(e["live_groups"] == REPLICAS for e in reference[g].values())

    drill = run_replica_groups(config(tmp_path / "drill", tokenizer_file, kill_group=KILLED, kill_step=KILL,
                                      restart_step=RESTART))
    assert_no_process_left(drill)
    (kill,) = drill.of("kill")
    assert kill["group"] == KILLED and [e["group"] for e in drill.of("start")] == [*range(REPLICAS), KILLED]
    for g in SURVIVORS:  # never restarted, every step committed once, in order
        mine = commits(drill, g)
        assert sorted(mine) == list(range(STEPS)), f"group {g} committed {sorted(mine)}"
        assert {e["incarnation"] for e in mine.values()} == {0}
        assert any(e["step"] == KILL for e in drill.of("abort", g)), f"group {g} did not abort step {KILL}"
        retried = mine[KILL]
        assert retried["time"] > kill["time"] and retried["live_groups"] == REPLICAS - 1, retried
        for step in range(KILL + 1):  # the same weights and batches as the uninterrupted run: the same floats
            assert mine[step]["loss"] == reference[g][step]["loss"], (g, step)
        healed = min(commits(drill, KILLED, incarnation=1))
        for step in range(KILL + 1, STEPS):
            live = mine[step]["live_groups"]
            assert live == (REPLICAS - 1 if step < healed else REPLICAS), (g, step, live)  # effective batch: live x 4
            ref = reference[g][step]["loss"]
            assert abs(mine[step]["loss"] - ref) <= BAND * ref, (g, step, mine[step]["loss"], ref)
        assert any(mine[s]["loss"] != reference[g][s]["loss"] for s in range(KILL + 1, STEPS)), \
            "the survivors' losses after the kill equal the uninterrupted run's: the smaller quorum changed nothing?"

    assert sorted(commits(drill, KILLED)) == list(range(KILL)), "the killed group committed after its kill"
    back = commits(drill, KILLED, incarnation=1)
    (heal,) = drill.of("healed", KILLED)
    healed = min(back)
    assert heal["incarnation"] == 1 and heal["step"] == healed == RESTART + 1, (heal, healed)  # the step after the hold
    assert sorted(back) == list(range(healed, STEPS))
    for step in range(healed, STEPS):  # bit for bit: the healed group's weights are the survivors'
        for g in SURVIVORS:
            assert back[step]["fingerprint"] == commits(drill, g)[step]["fingerprint"], (g, step)
    assert heal["fingerprint"] == commits(drill, 0)[healed - 1]["fingerprint"], "it did not load a live peer's state"
    total = sum(e["live_groups"] for e in commits(drill, 0).values())
    assert total == REPLICAS * STEPS - (healed - KILL), "group-batches committed: one per live group and step"

    from fault_tolerance.recovery import recovery_summary

    summary = recovery_summary(drill, Fault(KILLED, KILL, RESTART), "heal")
    assert summary["steps_lost"] == 0 and summary["heal_bit_identical"] and summary["healed_at_step"] == healed
    print(summary["sentence"])
