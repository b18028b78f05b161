"""GPipe and 1F1B pipeline schedules as explicit per-rank action lists.

An action is ``("F", i)`` (forward of micro-batch ``i`` on this rank's stage) or
``("B", i)`` (its backward). The communication is implied: a forward receives its input
from rank - 1 and sends its output to rank + 1; a backward receives the output's
gradient from rank + 1 and sends the input's gradient to rank - 1
(:class:`pipeline.stage_runner.StageRunner`).

* GPipe: all ``m`` forwards, then all ``m`` backwards (Huang et al. 2019, Sec. 2.2).
  Every rank holds the activations of all ``m`` micro-batches at the turn.
* 1F1B (PipeDream-Flush): rank ``r`` of ``p`` first runs ``min(p - r - 1, m)`` warm-up
  forwards, then alternates one forward and one backward (steady state), then runs the
  remaining backwards (cool-down). It holds at most ``p - r`` micro-batches' activations;
  the bubble is the same as GPipe's (Narayanan et al. 2021, "Efficient Large-Scale
  Language Model Training on GPU Clusters Using Megatron-LM", Sec. 2.2.1, Fig. 4 top).
"""
from __future__ import annotations

Action = tuple[str, int]

SCHEDULES = ("gpipe", "1f1b")


def _check(rank: int, n_stages: int, n_micro: int) -> None:
    if n_stages < 1 or n_micro < 1:
        raise ValueError(f"need at least one stage and one micro-batch, got p={n_stages}, m={n_micro}")
    if not 0 <= rank < n_stages:
        raise ValueError(f"rank {rank} is not a stage of a {n_stages}-stage pipeline")


def gpipe_actions(rank: int, n_stages: int, n_micro: int) -> list[Action]:
    """GPipe's actions on ``rank``: ``F0 .. F{m-1}`` then ``B0 .. B{m-1}``.

    Raises:
        ValueError: ``n_stages`` or ``n_micro`` < 1, or ``rank`` outside ``0 .. n_stages - 1``.
    """
    _check(rank, n_stages, n_micro)
    # BEGIN ASSIGN5_2_4
    return [("F", i) for i in range(n_micro)] + [("B", i) for i in range(n_micro)]
    # END ASSIGN5_2_4


def one_f_one_b_actions(rank: int, n_stages: int, n_micro: int) -> list[Action]:
    """1F1B's actions on ``rank``: warm-up forwards, steady one-forward-one-backward, cool-down backwards.

    Warm-up: ``min(p - rank - 1, m)`` forwards. Steady state: ``F(k), B(j)`` pairs until
    every forward is done. Cool-down: the remaining backwards. E.g. p = 4, m = 6,
    rank 1: ``F0 F1 | F2 B0 F3 B1 F4 B2 F5 B3 | B4 B5``.

    Raises:
        ValueError: ``n_stages`` or ``n_micro`` < 1, or ``rank`` outside ``0 .. n_stages - 1``.
    """
    _check(rank, n_stages, n_micro)
    # BEGIN ASSIGN5_2_4
    warmup = min(n_stages - rank - 1, n_micro)
    actions = [("F", i) for i in range(warmup)]
    next_backward = 0
    for i in range(warmup, n_micro):
        actions += [("F", i), ("B", next_backward)]
        next_backward += 1
    actions += [("B", i) for i in range(next_backward, n_micro)]
    return actions
    # END ASSIGN5_2_4


def schedule_actions(schedule: str, rank: int, n_stages: int, n_micro: int) -> list[Action]:
    """The action list of ``schedule`` (``"gpipe"`` or ``"1f1b"``) on ``rank``.

    Raises:
        ValueError: unknown schedule name (and see :func:`gpipe_actions`).
    """
    if schedule == "gpipe":
        return gpipe_actions(rank, n_stages, n_micro)
    if schedule == "1f1b":
        return one_f_one_b_actions(rank, n_stages, n_micro)
    raise ValueError(f"unknown schedule {schedule!r}; choose one of {SCHEDULES}")


def all_actions(schedule: str, n_stages: int, n_micro: int) -> list[list[Action]]:
    """The action lists of every rank ``0 .. n_stages - 1``."""
    return [schedule_actions(schedule, r, n_stages, n_micro) for r in range(n_stages)]
