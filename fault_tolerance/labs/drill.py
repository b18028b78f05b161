"""The failure drill of notebook 11, read from the runs' event logs (:class:`course.replica_groups.ReplicaRun`):
each group's committed steps (loss, live groups, time), a plot of the loss and the quorum against the step and
against the wall clock, and the comparison of the two recoveries in a sentence computed from their numbers."""
from __future__ import annotations


def committed(run, group: int) -> list[dict]:
    """``group``'s committed steps, in the order committed: ``{"step", "loss", "live_groups", "seconds",
    "incarnation"}`` (seconds since the run started)."""
    return [{"step": e["step"], "loss": e["loss"], "live_groups": e["live_groups"],
             "seconds": e["time"] - run.started, "incarnation": e["incarnation"]} for e in run.of("commit", group)]


def plot_drill(runs: dict, replicas: int, kill_step: int, axes) -> None:
    """Loss of each committed step of each group against the wall clock (top row; a restarted group dashed, the
    kills red) and the live groups of each step as group 0 saw them (bottom row), one column per run in ``runs``
    (``{label: ReplicaRun}``)."""
    for column, (label, run) in enumerate(runs.items()):
        top, bottom = axes[0][column], axes[1][column]
        for group in range(replicas):
            rows = committed(run, group)
            for inc in sorted({r["incarnation"] for r in rows}):
                mine = [r for r in rows if r["incarnation"] == inc]
                top.plot([r["seconds"] for r in mine], [r["loss"] for r in mine], "o" + ("-" if not inc else "--"),
                         ms=3, color=f"C{group}", label=f"group {group}" + (", restarted" if inc else ""))
        kill = run.of("kill")
        for e in kill:
            top.axvline(e["time"] - run.started, color="red", ls="--", lw=1)
            bottom.axvline(e["time"] - run.started, color="red", ls="--", lw=1)
        rows = committed(run, 0)
        bottom.step([r["seconds"] for r in rows], [r["live_groups"] for r in rows], where="post")
        top.set_title(f"{label}: kill (red) in step {kill_step}")
        top.set_ylabel("training loss of the group's batch")
        top.legend(fontsize=7)
        bottom.set_xlabel("seconds since start")
        bottom.set_ylabel("live groups")
        bottom.set_ylim(0, replicas + 0.5)


def recovery_sentence(heal: dict, restart: dict) -> str:
    """Heal against stop-the-world, in a sentence computed from the two :func:`fault_tolerance.recovery.
    recovery_summary` results of the same drill."""
    if heal["seconds_lost"] is None or restart["seconds_lost"] is None:
        return "one of the runs never came back to the step of the kill: no comparison"
    text = (f"Healing lost {heal['steps_lost']} committed steps and was back at step {heal['kill_step']} after "
            f"{heal['seconds_lost']:.2f} s; the stop-the-world restart lost {restart['steps_lost']} committed steps "
            f"(from its checkpoint of step {restart['resumed_from_step']}) and was back after "
            f"{restart['seconds_lost']:.2f} s (one drill of each: the seconds are single samples of a tiny model's "
            f"restart on one machine, no timing verdict; the steps lost are what the mechanism decides)")
    if heal["heal_seconds"] is not None:
        text += (f"; the killed group itself rejoined {heal['heal_seconds']:.2f} s after it was started again "
                 f"({'bit-identical' if heal['heal_bit_identical'] else 'NOT identical'} weights), while the "
                 f"others trained on")
    return text + "."
