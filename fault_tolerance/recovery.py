"""What a failure cost a run of replica groups, read from its event log (:class:`course.replica_groups.ReplicaRun`).

Two recoveries of the same run and the same kill (a replica group SIGKILLed after the forward pass of step
``s``) are compared:

* **heal** (torchft): the other groups abort step ``s``, wait for the lighthouse to drop the dead group, take step
  ``s`` again with the smaller quorum and go on; the killed group, started again later, heals from a live peer;
* **restart_all** (stop the world, :func:`course.launch.launch`'s ``max_restarts``): every group is stopped and
  started again, and resumes from its latest checkpoint, ``c <= s``: steps ``c .. s - 1`` are taken again.

Measured from the events: **steps lost** (committed steps that had to be taken again), **seconds lost** (from the
kill until the run commits step ``s``: the moment it is back where it was), and for heal the **seconds to heal**
(from the restarted group's start to its first committed step, with weights bit-identical to the others').
"""
from __future__ import annotations


def _first(events, kind, after=0.0, group=None, step=None, not_group=None):
    for e in events:
        if e["kind"] == kind and e["time"] >= after and (group is None or e["group"] == group) \
                and (step is None or e["step"] == step) and (not_group is None or e["group"] != not_group):
            return e
    return None


def recovery_summary(run, fault, policy: str) -> dict:
    """The cost of ``fault`` (:class:`course.replica_groups.Fault`) in ``run``, recovered by ``policy``.

    Returns:
        ``{"policy", "killed_group", "kill_step", "steps_lost", "seconds_lost", "aborted_attempts",
        "live_groups_after" (the quorum that took step ``kill_step`` again), "resumed_from_step" (restart_all),
        "heal_seconds", "healed_at_step", "heal_bit_identical" (heal; None if the group was not restarted),
        "held_seconds" (heal: how long the others waited at the drill's hold for the restarted group's process),
        "sentence"}``.

    Raises:
        ValueError: the run holds no kill of ``fault.group``.
    """
    events = run.events
    kill = _first(events, "kill", group=fault.group)
    if kill is None:
        raise ValueError(f"the run's events hold no kill of replica group {fault.group}")
    s = fault.at_step
    out = {"policy": policy, "killed_group": fault.group, "kill_step": s, "heal_seconds": None, "held_seconds": 0.0,
           "healed_at_step": None, "heal_bit_identical": None, "resumed_from_step": None}
    if policy == "heal":
        back = _first(events, "commit", after=kill["time"], step=s, not_group=fault.group)
        out["steps_lost"] = 0 if back is not None else None
        out["aborted_attempts"] = len([e for e in events if e["kind"] == "abort" and e["step"] == s])
        out["live_groups_after"] = back["live_groups"] if back else None
        survivor = next(g for g in sorted({e["group"] for e in events if e["group"] is not None}) if g != fault.group)
        out["held_seconds"] = sum(e["seconds"] for e in events if e["kind"] == "held" and e["group"] == survivor)
        restarted = [e for e in events if e["kind"] == "start" and e["group"] == fault.group and e["incarnation"]]
        if restarted:
            start = restarted[0]
            first = _first(events, "commit", after=start["time"], group=fault.group)
            if first is not None:
                out["heal_seconds"] = first["time"] - start["time"]
                out["healed_at_step"] = first["step"]
                peers = [e for e in events if e["kind"] == "commit" and e["step"] == first["step"]
                         and e["group"] != fault.group]
                out["heal_bit_identical"] = bool(peers) and all(e["fingerprint"] == first["fingerprint"] for e in peers)
    else:
        resumed = [e for e in events if e["kind"] == "resumed" and e["time"] >= kill["time"]]
        c = min(e["step"] for e in resumed) if resumed else 0
        out["resumed_from_step"] = c
        out["steps_lost"] = s - c
        out["aborted_attempts"] = 0
        back = _first(events, "commit", after=kill["time"], step=s)
        out["live_groups_after"] = back["live_groups"] if back else None
    out["seconds_lost"] = back["time"] - kill["time"] if back is not None else None
    out["sentence"] = sentence(out)
    return out


def sentence(summary: dict) -> str:
    """The summary as a sentence, from its numbers."""
    s = summary
    if s["seconds_lost"] is None:
        return f"{s['policy']}: the run never took step {s['kill_step']} again"
    head = (f"{s['policy']}: replica group {s['killed_group']} killed in step {s['kill_step']}; the run was back at "
            f"that step after {s['seconds_lost']:.2f} s with {s['steps_lost']} committed step(s) lost")
    if s["policy"] == "heal":
        head += (f" ({s['aborted_attempts']} aborted attempt(s); step {s['kill_step']} taken again by "
                 f"{s['live_groups_after']} live groups)")
        if s["heal_seconds"] is not None:
            same = "bit-identical to" if s["heal_bit_identical"] else "DIFFERENT from"
            head += (f"; the restarted group healed in {s['heal_seconds']:.2f} s and committed step "
                     f"{s['healed_at_step']} with weights {same} the others' (who waited {s['held_seconds']:.2f} s "
                     "for its process to come up: the drill's hold)")
    else:
        head += f" (every group resumed from its checkpoint of step {s['resumed_from_step']})"
    return head
