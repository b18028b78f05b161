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


def bubble_fraction(n_stages: int, n_micro: int) -> float:
    """Ideal bubble fraction of GPipe and 1F1B: ``(p - 1) / (m + p - 1)`` (equal stage costs).

    Raises:
        ValueError: ``n_stages`` or ``n_micro`` < 1.
    """
    if n_stages < 1 or n_micro < 1:
        raise ValueError(f"need p >= 1 and m >= 1, got p={n_stages}, m={n_micro}")
    return (n_stages - 1) / (n_micro + n_stages - 1)


def peak_in_flight(actions: list[tuple[str, int]]) -> int:
    """Most micro-batches forwarded and not yet backwarded at once in one rank's action list."""
    live, peak = set(), 0
    for kind, i in actions:
        if kind == "F":
            live.add(i)
        else:
            live.discard(i)
        peak = max(peak, len(live))
    return peak


def simulate(actions: list[list[tuple[str, int]]], t_forward: float = 1.0, t_backward: float = 1.0
             ) -> list[list[tuple[str, int, float, float]]]:
    """Idealised timeline of per-rank action lists (no communication cost).

    Each rank runs its actions in order; ``F(i)`` on rank r starts once rank r - 1 has
    finished ``F(i)``; ``B(i)`` on rank r once rank r + 1 has finished ``B(i)`` (on the
    last rank, once its own ``F(i)`` is done).

    Args:
        actions: ``actions[r]`` is rank r's list (e.g. from
            :func:`pipeline.schedules.all_actions`).
        t_forward, t_backward: duration of one forward / backward.

    Returns:
        ``events[r] = [(kind, i, start, end)]`` in the order of ``actions[r]``.

    Raises:
        ValueError: the lists deadlock (an action waits for one that never runs).
    """
    p = len(actions)
    done: dict[tuple[str, int, int], float] = {}
    events: list[list] = [[] for _ in range(p)]
    pos, clock = [0] * p, [0.0] * p
    while any(pos[r] < len(actions[r]) for r in range(p)):
        progressed = False
        for r in range(p):
            while pos[r] < len(actions[r]):
                kind, i = actions[r][pos[r]]
                dep = ("F", i, r - 1) if kind == "F" and r > 0 else \
                      ("B", i, r + 1) if kind == "B" and r < p - 1 else \
                      ("F", i, r) if kind == "B" else None
                if dep is not None and dep not in done:
                    break
                start = max(clock[r], done[dep] if dep else 0.0)
                end = start + (t_forward if kind == "F" else t_backward)
                done[(kind, i, r)] = end
                events[r].append((kind, i, start, end))
                clock[r], pos[r], progressed = end, pos[r] + 1, True
        if not progressed:
            stuck = {r: actions[r][pos[r]] for r in range(p) if pos[r] < len(actions[r])}
            raise ValueError(f"the action lists deadlock; ranks wait at {stuck}")
    return events


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
