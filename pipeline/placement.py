"""Where a rank's model chunks sit in the chain of pipeline stages, and pairs of actions.

Torch-free, imported by the schedules (:mod:`pipeline.schedules`), their replay and communication plan
(:mod:`pipeline.metrics`) and the runner (:mod:`pipeline.stage_runner`) alike.

* ``"loop"``: chunk ``c`` of rank ``r`` of ``p`` is stage ``c * p + r`` (one chunk per rank; interleaved 1F1B,
  Narayanan et al. 2021, Sec. 2.2.2).
* ``"v"``: the chain runs down the ranks and back up; with two chunks rank ``r`` holds stages ``r`` and
  ``2p - 1 - r`` (ZB-V, Qi et al. 2024, Sec. 6; DualPipeV, DeepSeek-V3 technical report, Sec. 3.2.1, cut in half
  as in the DualPipe repository; torch's ``generate_stage_to_rank_mapping(style="v")``).

A pair ``("F&B", forward, backward)`` is DualPipe's overlapped forward and backward of two micro-batches.
"""
from __future__ import annotations

PAIR = "F&B"  # the kind of a paired forward + backward (DualPipe's notation)
PLACEMENTS = ("loop", "v")


def stage_of(rank: int, chunk: int, n_stages: int, placement: str = "loop") -> int:
    """The (virtual) stage that chunk ``chunk`` of ``rank`` runs, with ``n_stages`` = ``p`` ranks.

    * ``"loop"`` (interleaved 1F1B, Narayanan et al. 2021, Sec. 2.2.2): ``chunk * p + rank``.
    * ``"v"`` (ZB-V, Qi et al. 2024, Sec. 6; DualPipeV): the chain of stages runs down the ranks and
      back up — chunk ``c`` of rank ``r`` is ``c * p + r`` for even ``c`` and ``c * p + p - 1 - r`` for
      odd ``c``: with two chunks, rank ``r`` holds stages ``r`` and ``2p - 1 - r``.

    Raises:
        ValueError: an unknown placement.
    """
    if placement == "loop":
        return chunk * n_stages + rank
    if placement == "v":
        return chunk * n_stages + (rank if chunk % 2 == 0 else n_stages - 1 - rank)
    raise ValueError(f"unknown placement {placement!r}; choose one of {PLACEMENTS}")


def rank_of(stage: int, n_stages: int, placement: str = "loop") -> int:
    """The rank that holds (virtual) stage ``stage`` (the inverse of :func:`stage_of`)."""
    chunk, offset = divmod(stage, n_stages)
    return n_stages - 1 - offset if placement == "v" and chunk % 2 else offset


def flatten_pairs(actions: list[tuple]) -> list[tuple]:
    """``actions`` with every pair ``("F&B", forward, backward)`` written as its two actions, forward first:
    the order a rank executes them in (torch's runtime runs an ``OVERLAP_F_B`` the same way unless a model
    supplies its own overlapped forward-backward)."""
    out = []
    for action in actions:
        out += list(action[1:]) if action[0] == PAIR else [action]
    return out
