"""Bubble, in-flight micro-batches and timelines of pipeline schedules.

Definitions (p stages, m micro-batches per batch):

* **Bubble fraction**: the share of the stage-time of one step that stages sit idle,
  ``1 - (sum over stages of busy time) / (p x step time)``, where the step time runs from
  the first forward's start to the last backward's end on any stage. With every
  forward taking ``t_f`` and every backward ``t_b`` on every stage, GPipe and 1F1B
  both take ``(m + p - 1)(t_f + t_b)`` per step while each stage is busy ``m (t_f + t_b)``,
  so the bubble fraction is ``(p - 1) / (m + p - 1)`` (Narayanan et al. 2021, Sec. 2.2.1,
  who quote the bubble relative to the ideal time, (p - 1) / m).
* **In flight**: micro-batches a stage has forwarded but not yet backwarded; their
  activations must be kept. GPipe peaks at ``m`` on every stage, 1F1B at ``min(p - rank, m)``.

A timeline is a list of events ``(kind, micro-batch, start, end)`` per stage (seconds, or
unit time slots for the idealised ones of :func:`simulate`).
"""
from __future__ import annotations

from pipeline.placement import flatten_pairs, rank_of, stage_of


def bubble_fraction(n_stages: int, micro_batches: int) -> float:
    """Ideal bubble fraction of GPipe and 1F1B: ``(p - 1) / (m + p - 1)`` (equal stage costs).

    Raises:
        ValueError: ``n_stages`` or ``micro_batches`` < 1.
    """
    if n_stages < 1 or micro_batches < 1:
        raise ValueError(f"need p >= 1 and m >= 1, got p={n_stages}, m={micro_batches}")
    return (n_stages - 1) / (micro_batches + n_stages - 1)


def peak_in_flight(actions: list[tuple]) -> int:
    """Most micro-batches forwarded and not yet backwarded at once in one rank's action list: actions
    ``(kind, micro-batch)`` or, with virtual stages, ``(kind, micro-batch, chunk)`` (each (chunk,
    micro-batch) pair counts once; ``F`` makes it live, ``B`` — or a later ``W`` — ends it; a pair
    ``("F&B", forward, backward)`` counts as its two actions, forward first)."""
    live, peak = set(), 0
    for action in flatten_pairs(actions):
        key = (action[2] if len(action) > 2 else 0, action[1])
        if action[0] == "F":
            live.add(key)
        else:
            live.discard(key)
        peak = max(peak, len(live))
    return peak


def simulate(actions: list[list[tuple[str, int]]], t_forward: float = 1.0, t_backward: float = 1.0,
             placement: str = "loop") -> list[list[tuple[str, int, float, float]]]:
    """Idealised timeline of per-rank action lists (no communication cost).

    Each rank runs its actions in order; ``F(i)`` on rank r starts once rank r - 1 has
    finished ``F(i)``; ``B(i)`` on rank r once rank r + 1 has finished ``B(i)`` (on the
    last rank, once its own ``F(i)`` is done).

    Args:
        actions: ``actions[r]`` is rank r's list (e.g. from
            :func:`pipeline.schedules.all_actions`).
        t_forward, t_backward: duration of one forward / backward (a pair ``("F&B", ...)``: their sum).
        placement: where the chunks sit (:func:`pipeline.placement.stage_of`).

    Returns:
        ``events[r] = [(kind, i, start, end)]`` in the order of ``actions[r]``.

    Raises:
        ValueError: the lists deadlock (an action waits for one that never runs).
    """
    def duration(a):
        return t_forward + t_backward if a[0] == "F&B" else t_forward if a[0] == "F" else t_backward

    return replay(actions, [[duration(a) for a in acts] for acts in actions], placement=placement)


def measured_bubble_fraction(events: list[list[tuple[str, int, float, float]]]) -> float:
    """Bubble fraction of a timeline: ``1 - busy / (p x (last end - first start))``.

    Args:
        events: ``events[r] = [(kind, i, start, end), ...]`` for every rank r.
    """
    starts = [e[2] for rank_events in events for e in rank_events]
    ends = [e[3] for rank_events in events for e in rank_events]
    span = max(ends) - min(starts)
    busy = sum(e[3] - e[2] for rank_events in events for e in rank_events)
    return 1.0 - busy / (len(events) * span)


def _chain(actions: list[list[tuple]], placement: str = "loop"):
    """``(p, dependency)`` of action lists: ``dependency(action, r)`` is ``(virtual stage s of the
    action, the (kind, micro-batch, virtual stage) it waits for, or None)`` — ``F`` on ``s`` after
    ``F`` on ``s - 1``; ``B`` (or a whole backward ``BW``, named ``B`` in the dependencies) on ``s`` after
    ``B`` on ``s + 1`` (on the last virtual stage, after its own ``F``); ``W`` after its own ``B``. Chunk
    ``c`` of rank ``r`` is virtual stage :func:`pipeline.placement.stage_of` ``(r, c, p, placement)``
    (``c * p + r`` for ``"loop"``)."""
    p = len(actions)
    total_stages = p * (1 + max((a[2] for acts in actions for a in flatten_pairs(acts) if len(a) > 2), default=0))

    def dependency(action: tuple, r: int):
        kind, i = ("B" if action[0] == "BW" else action[0]), action[1]
        s = stage_of(r, action[2] if len(action) > 2 else 0, p, placement)
        if kind == "F":
            return s, (("F", i, s - 1) if s > 0 else None)
        if kind == "B":
            return s, (("B", i, s + 1) if s < total_stages - 1 else ("F", i, s))
        return s, ("B", i, s)
    return p, dependency


def replay(actions: list[list[tuple]], durations: list[list[float]], latency: float = 0.0,
           placement: str = "loop") -> list[list[tuple[str, int, float, float]]]:
    """The timeline the action lists would have if every rank had a core (or device) of its own.

    Each rank runs its actions in order, each taking its measured duration; an action
    starts when its rank is free and its input exists: ``F`` of micro-batch ``i`` on virtual
    stage ``s`` after ``F(i)`` on ``s - 1``; ``B`` on ``s`` after ``B(i)`` on ``s + 1`` (on the
    last virtual stage, after its own ``F(i)``); ``W`` after its own ``B(i)``. With ``v``
    chunks per rank, chunk ``c`` of rank ``r`` is virtual stage ``c * p + r`` (``placement="loop"``;
    ``"v"``: see :func:`pipeline.placement.stage_of`). A pair ``("F&B", forward, backward)`` (DualPipeV)
    is one action: it starts once both its inputs exist and both its parts end together, its duration
    after it (DualPipe's ``F&B``, the two overlapped). A hand-over between ranks costs ``latency`` seconds
    (0: free, as in the theory; see :func:`handover_latencies` to measure it).

    This separates what the schedule costs from what the machine adds: on a machine with
    fewer cores than ranks the measured wall-clock timeline also holds the time each rank
    waited for a core; replaying the ranks' CPU seconds per action
    (:attr:`pipeline.stage_runner.StepResult.event_cpu_s`) leaves only the schedule's own
    bubble with the stages' real, unequal costs.

    Args:
        actions: ``actions[r]``: rank r's ``(kind, micro-batch)`` or ``(kind, micro-batch, chunk)``.
        durations: ``durations[r][k]``: seconds of ``actions[r][k]``.
        placement: where the chunks sit (:func:`pipeline.placement.stage_of`).

    Returns:
        ``events[r] = [(kind, i, start, end)]`` in the order of ``actions[r]`` (a pair's event:
        ``("F&B", (forward's i, backward's i), start, end)``).

    Raises:
        ValueError: a rank's durations do not match its actions; the lists deadlock.
    """
    p, dependency = _chain(actions, placement)
    if len(durations) != p or any(len(d) != len(a) for d, a in zip(durations, actions)):
        raise ValueError("durations[r] must give one duration per action of rank r")
    done: dict[tuple[str, int, int], float] = {}
    events: list[list] = [[] for _ in range(p)]
    pos, clock = [0] * p, [0.0] * p
    while any(pos[r] < len(actions[r]) for r in range(p)):
        progressed = False
        for r in range(p):
            while pos[r] < len(actions[r]):
                action = actions[r][pos[r]]
                parts = action[1:] if action[0] == "F&B" else (action,)
                deps = [dependency(part, r) for part in parts]
                if any(dep is not None and dep not in done for _, dep in deps):
                    break
                ready = max(0.0 if dep is None else done[dep] + (latency if rank_of(dep[2], p, placement) != r else 0.0)
                            for _, dep in deps)
                start = max(clock[r], ready)
                end = start + durations[r][pos[r]]
                for part, (s, _) in zip(parts, deps):
                    done[("B" if part[0] == "BW" else part[0], part[1], s)] = end
                label = tuple(part[1] for part in parts) if action[0] == "F&B" else action[1]
                events[r].append((action[0], label, start, end))
                clock[r], pos[r], progressed = end, pos[r] + 1, True
        if not progressed:
            stuck = {r: actions[r][pos[r]] for r in range(p) if pos[r] < len(actions[r])}
            raise ValueError(f"the action lists deadlock; ranks wait at {stuck}")
    return events


def costs_by_kind(actions: list[list[tuple]], durations: list[list[float]], per_rank: bool = False):
    """The mean duration of each kind of action (``"F"``, ``"B"``, ``"W"``) of a measured step.

    Args:
        actions, durations: as for :func:`replay` (e.g. a step's
            :attr:`pipeline.stage_runner.StepResult.event_cpu_s` per rank).
        per_rank: one ``{kind: seconds}`` per rank instead of one over every rank.

    Returns:
        ``{kind: mean seconds}`` over every rank's actions of that kind (the stages made equal), or
        ``[{kind: mean seconds} per rank]`` with ``per_rank``.

    Raises:
        ValueError: a rank's durations do not match its actions.
    """
    if len(durations) != len(actions) or any(len(d) != len(a) for d, a in zip(durations, actions)):
        raise ValueError("durations[r] must give one duration per action of rank r")

    def means(pairs):
        found: dict[str, list[float]] = {}
        for action, seconds in pairs:
            found.setdefault(action[0], []).append(seconds)
        return {kind: sum(v) / len(v) for kind, v in found.items()}

    if per_rank:
        return [means(zip(acts, durs)) for acts, durs in zip(actions, durations)]
    return means((a, d) for acts, durs in zip(actions, durations) for a, d in zip(acts, durs))


def replay_by_kind(actions: list[list[tuple]], costs, latency: float = 0.0,
                   placement: str = "loop") -> list[list[tuple[str, int, float, float]]]:
    """:func:`replay` with every action of a kind taking the same time: ``costs`` is ``{kind: seconds}`` for
    every rank (equal stages, as the bubble formulas assume) or a list of them, one per rank (each stage its
    own cost). :func:`simulate` is the case ``{"F": t_forward, "B": t_backward}``. DualPipeV's lists also need
    ``"BW"`` (a whole backward) and ``"F&B"`` (a pair); ``placement`` as for :func:`replay`.

    Raises:
        KeyError: an action's kind has no cost (e.g. ``"W"`` for ZB-H1); ValueError: see :func:`replay`.
    """
    per_rank = costs if isinstance(costs, (list, tuple)) else [costs] * len(actions)
    if len(per_rank) != len(actions):
        raise ValueError(f"costs for {len(per_rank)} ranks, actions for {len(actions)}")
    return replay(actions, [[c[a[0]] for a in acts] for acts, c in zip(actions, per_rank)], latency, placement)


def handover_latencies(actions: list[list[tuple]], events: list[list[tuple]], placement: str = "loop") -> list[float]:
    """Measured hand-over latencies of a run: for every action that waited for another rank
    (it started after its rank's previous action ended), the seconds from the end of the action
    it waited for (same dependencies as :func:`replay`) to its own start — the send, the
    receive and the wake-up of the waiting process together.

    Args:
        actions, events: the ranks' action lists and the measured ``(kind, i, start, end)``
            events of one step, in the same order.
    """
    p, dependency = _chain(actions, placement)
    end_of = {}
    for r in range(p):
        for action, event in zip(actions[r], events[r]):
            end_of[("B" if action[0] == "BW" else action[0], action[1], dependency(action, r)[0])] = event[3]
    gaps = []
    for r in range(p):
        previous_end = None
        for action, event in zip(actions[r], events[r]):
            dep = dependency(action, r)[1]
            waited = previous_end is None or event[2] > previous_end
            if dep is not None and rank_of(dep[2], p, placement) != r and waited:
                gaps.append(event[2] - end_of[dep])
            previous_end = event[3]
    return gaps


def communication_plan(actions: list[list[tuple]], placement: str = "loop") -> list[dict]:
    """When each rank sends and receives, so that every exchange is safe under NCCL's rules.

    The action lists are laid out on a common clock of unit steps (:func:`simulate`: every
    action takes one step and starts once its input exists). An action at step ``t`` hands its
    output over at the end of step ``t``: the producer's send and the consumer's receive then sit
    in the **same** batch ``t`` of both ranks (one ``batch_isend_irecv``), and every rank runs its
    batches in step order. Every message is thus matched within one batch that both ranks post, so
    no send can wait for a receive stuck behind another send — the lock-step torch's
    ``PipelineScheduleMulti`` uses for the same reason. A message is named by what consumes it:
    ``("F", i, s)`` is the input of the forward of micro-batch ``i`` on virtual stage ``s``,
    ``("B", i, s)`` the gradient of that stage's output.

    Args:
        actions: ``actions[r]``, rank r's list (same form as :func:`replay`; a pair ``("F&B", ...)`` is laid
            out as its two actions, forward first, the order a runner executes them in).
        placement: where the chunks sit (:func:`pipeline.placement.stage_of`); a hand-over between two
            chunks of one rank (the bottom of a V) is no message.

    Returns:
        ``plan[r] = {"steps": [step of each action of rank r (pairs flattened)], "batches": {step: [(kind, peer rank,
        message)]}}`` with kind ``"send"`` or ``"recv"``; the operations of a batch are sorted by
        message, so two ranks list the messages between them in the same order.

    Raises:
        ValueError: the lists deadlock.
    """
    actions = [flatten_pairs(acts) for acts in actions]
    p, dependency = _chain(actions, placement)
    total_stages = p * (1 + max((a[2] for acts in actions for a in acts if len(a) > 2), default=0))
    events = simulate(actions, placement=placement)
    plan = [{"steps": [int(round(e[2])) for e in events[r]], "batches": {}} for r in range(p)]
    for r in range(p):
        for action, step in zip(actions[r], plan[r]["steps"]):
            kind, i = action[0], action[1]
            s = dependency(action, r)[0]
            kind = "B" if kind == "BW" else kind  # a whole backward hands over the same gradient
            target = s + 1 if kind == "F" else s - 1 if kind == "B" else None
            if target is None or not 0 <= target < total_stages or rank_of(target, p, placement) == r:
                continue  # W, the ends of the chain, or a hand-over inside this rank
            message = (kind, i, target)
            peer = rank_of(target, p, placement)
            plan[r]["batches"].setdefault(step, []).append(("send", peer, message))
            plan[peer]["batches"].setdefault(step, []).append(("recv", r, message))
    for rank_plan in plan:
        for ops in rank_plan["batches"].values():
            ops.sort(key=lambda op: op[2])
    return plan
