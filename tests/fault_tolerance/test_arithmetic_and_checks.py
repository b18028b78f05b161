"""What needs no process: the failure and checkpoint arithmetic against hand-worked numbers, the exercise checks,
the cost of a failure read from a hand-written event log, DiLoCo's bytes and slow-link seconds, and the run's
configuration refusing what cannot run (before anything starts)."""
from __future__ import annotations

import math

import pytest

from course.config import ConfigError
from course.replica_groups import Fault, ReplicaRun, launch_replica_groups
from fault_tolerance import failures
from fault_tolerance.labs import checks
from fault_tolerance.labs import diloco_lab
from fault_tolerance.recovery import recovery_summary
from project.options.run_fault_tolerant import FaultTolerantConfig


def test_llama3_rate_mttf_and_youngs_interval_by_hand():
    rate = failures.per_gpu_rate()
    assert rate == pytest.approx(419 / (16_384 * 54))
    assert failures.mttf_seconds(16_384, rate) / 3600 == pytest.approx(54 * 24 / 419)  # ~3.09 h: 419 in 54 days
    mttf = 3 * 3600.0
    best = failures.young_interval(60.0, mttf)
    assert best == pytest.approx(math.sqrt(2 * 60 * mttf))  # 1138 s
    waste = [failures.wasted_fraction(best * f, 60.0, mttf, 300.0) for f in (0.8, 1.0, 1.25)]
    assert waste[1] < waste[0] and waste[1] < waste[2], "Young's interval is the first-order minimum"
    with pytest.raises(ValueError):
        failures.young_interval(0.0, mttf)


def test_exercise_checks_accept_the_answer_and_refuse_another(capsys):
    rate = failures.per_gpu_rate()
    assert checks.check_mttf_hours(failures.mttf_seconds(100_000, rate) / 3600)
    assert not checks.check_mttf_hours(failures.mttf_seconds(16_384, rate) / 3600)
    assert checks.check_young_minutes(failures.young_interval(60, failures.mttf_seconds(100_000, rate)) / 60)
    assert not checks.check_young_minutes(None)
    assert checks.check_diloco_bytes_per_token(2 * 3 / 4 * 4 * 124e6 / (4 * 512 * 1024) / 100)
    assert "not yet" in capsys.readouterr().out


def test_diloco_bytes_and_slow_link_seconds_shrink_by_h():
    n = 4 * 124e6
    assert diloco_lab.ring_bytes_per_token(n, 2, 1000.0, None) == pytest.approx(n / 1000)  # 2 (p-1)/p = 1 at p = 2
    assert diloco_lab.ring_bytes_per_token(n, 4, 1000.0, 50) == pytest.approx(1.5 * n / 1000 / 50)
    ddp = diloco_lab.slow_link_seconds_per_step(n, 2, None)
    assert ddp == pytest.approx(2 * 1e-3 + n * 8 / 1e9)  # 2 (p-1) alpha + 2 (p-1)/p N beta, 1 Gb/s
    assert diloco_lab.slow_link_seconds_per_step(n, 2, 100) == pytest.approx(ddp / 100)


def _event(t, kind, group, step=None, incarnation=0, **data):
    return dict(time=t, kind=kind, group=group, step=step, incarnation=incarnation, rank=0, **data)


def test_the_cost_of_a_failure_from_an_event_log():
    heal = ReplicaRun(started=0.0, events=[
        _event(1.0, "commit", 0, 2, live_groups=3, fingerprint="a"), _event(1.0, "commit", 1, 2, live_groups=3,
                                                                            fingerprint="a"),
        _event(2.0, "kill", 2), _event(2.5, "abort", 0, 3), _event(2.5, "abort", 1, 3),
        _event(4.0, "commit", 0, 3, live_groups=2, fingerprint="b"), _event(4.1, "commit", 1, 3, live_groups=2,
                                                                            fingerprint="b"),
        _event(5.0, "start", 2, incarnation=1), _event(6.0, "commit", 0, 4, live_groups=2, fingerprint="c"),
        _event(6.0, "commit", 1, 4, live_groups=2, fingerprint="c"),
        _event(8.0, "commit", 2, 5, incarnation=1, live_groups=3, fingerprint="d"),
        _event(8.0, "commit", 0, 5, live_groups=3, fingerprint="d")])
    s = recovery_summary(heal, Fault(2, 3, 4), "heal")
    assert (s["steps_lost"], s["aborted_attempts"], s["live_groups_after"]) == (0, 2, 2)
    assert s["seconds_lost"] == pytest.approx(2.0) and s["heal_seconds"] == pytest.approx(3.0)
    assert s["healed_at_step"] == 5 and s["heal_bit_identical"] is True
    restart = ReplicaRun(started=0.0, events=[
        _event(2.0, "kill", 2), _event(2.1, "stop_all", None), _event(5.0, "resumed", 0, 2, incarnation=1),
        _event(7.0, "commit", 0, 2, incarnation=1, live_groups=3, fingerprint="x"),
        _event(9.0, "commit", 0, 3, incarnation=1, live_groups=3, fingerprint="y")])
    s = recovery_summary(restart, Fault(2, 3), "restart_all")
    assert (s["steps_lost"], s["resumed_from_step"], s["seconds_lost"]) == (1, 2, pytest.approx(7.0))
    with pytest.raises(ValueError, match="no kill"):
        recovery_summary(ReplicaRun(), Fault(1, 3), "heal")


@pytest.mark.parametrize("values, message", [
    (dict(replicas=3, batch_size=10), "not divisible by --replicas x --dp = 3"),
    (dict(replicas=3, min_replicas=4), "--min_replicas 4"),
    (dict(replicas=2, kill_group=2), "--kill_group 2: the groups are 0 .. 1"),
    (dict(replicas=1, batch_size=8, kill_group=0), "needs --replicas >= 2"),
    (dict(replicas=2, kill_group=1, kill_step=4, restart_step=3), "--restart_step 3 must come after"),
    (dict(replicas=2, kill_group=1, recovery="restart_all"), "also give --checkpoint_every"),
    (dict(replicas=2, max_restarts=1, checkpoint_every=2), "replica groups recover by themselves"),
])
def test_the_configuration_refuses_what_cannot_run(values, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(".", r"\.")):
        FaultTolerantConfig.for_test(device="cpu", **values)


def test_the_launcher_refuses_bad_groups_and_faults_before_starting_anything():
    for kwargs, message in [(dict(replicas=0, group_size=1), "must be >= 1"),
                            (dict(replicas=2, group_size=1, policy="stop"), "policy"),
                            (dict(replicas=2, group_size=1, faults=(Fault(2, 1),)), "groups are 0 .. 1"),
                            (dict(replicas=2, group_size=1, faults=(Fault(1, 3, 2),)), "must come after"),
                            (dict(replicas=2, group_size=1, min_replicas=3), "min_replicas")]:
        with pytest.raises(ValueError, match=message):
            launch_replica_groups(print, **kwargs)
