"""An elastic run's record: which ranks trained which steps, when the world changed size, and what it cost.

An elastic run (``python project/elastic.py --nnodes MIN:MAX ...``, or ``torchrun --nnodes=MIN:MAX
--rdzv_backend=c10d ... project/train.py --mode dp --elastic MIN:MAX``) goes through **attempts**: each time
torchrun's agents form a new rendezvous round — the first start, a restart after a worker failed (a node was
lost), a restart because a node joined — every rank starts again, continues from the run's latest checkpoint at
the world size the round gave, and rank 0 appends to the run's **log**, ``<workdir>/{prefix}elastic_log.jsonl``,
one JSON object per line:

* ``{"event": "start", "attempt": a, "time": t, "world_size": W, "resumed_step": s, "nodes": [...], ...}`` before
  the attempt's first step (``time``: when it was ready to train again, wall clock in seconds; ``nodes``: every
  node's host, agent process id, torchrun restart count and ranks);
* ``{"event": "step", "attempt": a, "step": s, "loss": L, "world_size": W, "time": t, "examples": [...]}`` after
  every optimizer step (``loss``: the global batch's loss, the mean over its micro-batches of each one's mean
  target-token loss; ``examples``: the positions in the training set of the step's examples, rank 0's first,
  as every rank reported them).

From the log alone (this module reads it; no torch): the **trajectory** (each step's last execution: the run's
loss curve), the **attempts**, and per restart what was **lost** (:func:`restarts`): the steps done after the
checkpoint the new attempt resumed from, which it does again (``steps_redone``), and the seconds from the last
step the previous attempt finished until the new attempt had finished that step again (``seconds_lost`` =
``downtime_seconds``: failure noticed, rendezvous, processes started, data, model and checkpoint loaded +
``redo_seconds``: the redone steps). Times are the nodes' wall clocks (``time.time()``; NTP-synchronised across
machines, to milliseconds).
"""
from __future__ import annotations

import json
import os
from pathlib import Path

LOG_NAME = "elastic_log.jsonl"


def parse_nnodes(text: str) -> tuple[int, int]:
    """``"MIN:MAX"`` (or ``"N"``, fixed) as ``(MIN, MAX)``, torchrun's ``--nnodes`` format.

    Raises:
        ValueError: not two whole numbers with 1 <= MIN <= MAX (the message says what to write).
    """
    parts = str(text).split(":")
    try:
        low, high = (int(parts[0]), int(parts[-1])) if len(parts) in (1, 2) else (0, -1)
    except ValueError:
        low, high = 0, -1
    if not 1 <= low <= high:
        raise ValueError(f"--nnodes {text!r}: give MIN:MAX nodes with 1 <= MIN <= MAX, e.g. 1:2 (or one number "
                         "for a fixed size)")
    return low, high


def log_path(workdir, results_prefix: str = "") -> Path:
    """``<workdir>/{results_prefix}elastic_log.jsonl``."""
    return Path(workdir) / f"{results_prefix}{LOG_NAME}"


def append_event(path, event: dict) -> None:
    """Append ``event`` as one JSON line and flush it to the file system (a node that dies the next moment
    leaves every line it wrote complete)."""
    with open(path, "a") as f:
        f.write(json.dumps(event, sort_keys=True) + "\n")
        f.flush()
        os.fsync(f.fileno())


def read_events(path, since: float | None = None) -> list[dict]:
    """The log's events in order (a line cut short by a crash is skipped); with ``since``, only the attempts
    that started at or after that time (and their steps)."""
    path = Path(path)
    if not path.is_file():
        return []
    events = []
    for line in path.read_text().splitlines():
        try:
            events.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    if since is not None:
        kept = {e["attempt"] for e in events if e.get("event") == "start" and e["time"] >= since}
        events = [e for e in events if e.get("attempt") in kept]
    return events


def attempts(events: list[dict]) -> list[dict]:
    """Every attempt's start event, each with ``steps``: the first and last step it finished (None: none)."""
    found = {}
    for e in events:
        if e.get("event") == "start":
            found[e["attempt"]] = dict(e, steps=None)
    for e in events:
        if e.get("event") == "step" and e["attempt"] in found:
            a = found[e["attempt"]]
            a["steps"] = [e["step"], e["step"]] if a["steps"] is None else [a["steps"][0], e["step"]]
    return [found[k] for k in sorted(found)]


def trajectory(events: list[dict]) -> list[dict]:
    """The run's loss curve: for each step, its last execution (a step redone after a restart replaces the
    execution the failure threw away), in step order."""
    last = {}
    for e in events:
        if e.get("event") == "step":
            last[e["step"]] = e
    return [last[s] for s in sorted(last)]


def _node_key(node: dict) -> str:
    return f"{node['host']}:{node['agent_pid']}"


def restarts(events: list[dict]) -> list[dict]:
    """What each restart of the run changed and cost, from its log (see the module docstring).

    Returns:
        One dict per attempt after the first: ``attempt``, ``from_world``, ``to_world``, ``nodes_lost`` and
        ``nodes_joined`` (``host:agent pid``), ``cause`` (``"a worker failed"`` when a node that stayed restarted
        after a failure — torchrun's restart count went up —, else ``"membership change"``: nodes joined or left
        while the workers were healthy), ``interrupted_after`` (the last step the previous attempt finished),
        ``resumed_step`` (the checkpoint's), ``steps_redone``, ``downtime_seconds``, ``redo_seconds`` and
        ``seconds_lost`` (None while the new attempt has not yet finished the redone steps).
    """
    found = []
    runs = attempts(events)
    step_times = {(e["attempt"], e["step"]): e["time"] for e in events if e.get("event") == "step"}
    for before, after in zip(runs, runs[1:]):
        last_step = before["steps"][1] if before["steps"] else before["resumed_step"]
        last_time = step_times.get((before["attempt"], last_step), before["time"])
        redone = max(0, last_step - after["resumed_step"])
        back = step_times.get((after["attempt"], last_step)) if redone else after["time"]
        old = {_node_key(n): n for n in before["nodes"]}
        new = {_node_key(n): n for n in after["nodes"]}
        failed = any(new[k]["restart_count"] > old[k]["restart_count"] for k in set(old) & set(new))
        found.append({
            "attempt": after["attempt"], "from_world": before["world_size"], "to_world": after["world_size"],
            "nodes_lost": sorted(set(old) - set(new)), "nodes_joined": sorted(set(new) - set(old)),
            "cause": "a worker failed" if failed else "membership change",
            "interrupted_after": last_step, "resumed_step": after["resumed_step"], "steps_redone": redone,
            "downtime_seconds": after["time"] - last_time,
            "redo_seconds": None if back is None else back - after["time"],
            "seconds_lost": None if back is None else back - last_time,
        })
    return found


def describe_restart(r: dict, nnodes: str | None = None) -> str:
    """One line saying what a restart (:func:`restarts`) changed: the world, the nodes, the checkpoint."""
    nodes = "; ".join(x for x in (f"lost {', '.join(r['nodes_lost'])}" if r["nodes_lost"] else "",
                                   f"joined {', '.join(r['nodes_joined'])}" if r["nodes_joined"] else "") if x)
    bounds = f", --nnodes {nnodes}" if nnodes else ""
    first, last = r["resumed_step"] + 1, r["interrupted_after"]
    redo = ("no step is redone" if not r["steps_redone"] else f"step {last} is redone" if first == last
            else f"steps {first}-{last} are redone")
    return (f"elastic: attempt {r['attempt']} ({r['cause']}{'; ' + nodes if nodes else ''}): world "
            f"{r['from_world']} -> {r['to_world']} ranks{bounds}; after step {r['interrupted_after']}, resumed from "
            f"the checkpoint of step {r['resumed_step']}: {redo}")


def describe_cost(r: dict) -> str:
    """One line saying what a restart cost (:func:`restarts`; its ``seconds_lost`` must be known)."""
    return (f"elastic: back at step {r['interrupted_after']} in attempt {r['attempt']}: lost {r['steps_redone']} "
            f"step(s) and {r['seconds_lost']:.1f} s ({r['downtime_seconds']:.1f} s down: failure noticed, rendezvous, "
            f"processes started, checkpoint loaded; {r['redo_seconds']:.1f} s redoing)")


def summary(events: list[dict]) -> dict:
    """What the results file keeps of an elastic run (``elastic`` entry): the attempts (world size, nodes, steps),
    the restarts with their cost (:func:`restarts`), every execution of a step (attempt, step, world size, time,
    loss; a redone step has several) and the trajectory's per-step loss and world size."""
    steps = trajectory(events)
    keep = ("attempt", "step", "world_size", "time", "loss")
    return {
        "executions": [{k: e[k] for k in keep} for e in events if e.get("event") == "step"],
        "attempts": [{k: a[k] for k in ("attempt", "time", "world_size", "resumed_step", "nodes", "steps")}
                     for a in attempts(events)],
        "restarts": restarts(events),
        "steps": [s["step"] for s in steps],
        "losses": [s["loss"] for s in steps],
        "world_sizes": [s["world_size"] for s in steps],
        "step_attempts": [s["attempt"] for s in steps],
        "steps_redone": sum(r["steps_redone"] for r in restarts(events)),
        "seconds_lost": sum(r["seconds_lost"] or 0.0 for r in restarts(events)),
    }
