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
* Interleaved 1F1B (Narayanan et al. 2021, Sec. 2.2.2, Fig. 4 bottom): each rank holds
  ``v`` model chunks (virtual stages); chunk ``c`` of rank ``r`` is virtual stage
  ``c * p + r`` of ``v * p``. Actions are ``(kind, micro-batch, chunk)``. The bubble
  shrinks to ``(p - 1) / (v * m + p - 1)`` of the step, for ``v`` times the messages.
* ZB-H1 (Qi et al. 2024, "Zero Bubble Pipeline Parallelism", Sec. 2.1, Fig. 3): the
  backward is split into ``("B", i)``, the gradient with respect to the stage's input
  (sent upstream at once), and ``("W", i)``, the gradient with respect to its weights,
  which has no consumer in the pipeline and so can wait to fill a bubble. Rank ``r``
  defers ``r`` weight gradients; every ``W`` runs before the step ends (before the
  optimizer step). Peak in-flight micro-batches (forwarded, weight gradient not yet
  done) stay at 1F1B's ``p``; the bubble is about a third of 1F1B's when F, B and W
  take equal time.
* V-shaped schedules (placement ``"v"``, :func:`stage_of`): ``p`` ranks, ``2p`` stages, rank ``r``
  holds stage ``r`` (chunk 0) and stage ``2p - 1 - r`` (chunk 1), so rank 0 holds the first and the
  last stage and the bottom of the V (stages ``p - 1`` and ``p``) is one rank's local hand-over.
  ZB-V (Qi et al. 2024, Sec. 6; torch's ``ScheduleZBVZeroBubble``) and DualPipeV (DeepSeek-V3
  technical report, Sec. 3.2.1, Fig. 5, cut in half as in the DualPipe repository; torch's
  ``ScheduleDualPipeV``). Actions ``(kind, micro-batch, chunk)`` with kind ``"F"``, ``"B"`` (input
  gradient only), ``"W"`` (weight gradient) or ``"BW"`` (the whole backward, input and weights in
  one pass, in a list that splits the others), and for DualPipeV the *pair*
  ``("F&B", ("F", i, c), ("BW", j, c'))``: the forward of one micro-batch and the backward of
  another, issued together so that one's communication hides behind the other's computation
  (:func:`flatten_pairs` gives the order a runner executes).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from pipeline.placement import PAIR, PLACEMENTS, flatten_pairs, rank_of, stage_of  # noqa: F401 (the registry's names)

Action = tuple  # (kind, micro-batch) or (kind, micro-batch, chunk); kind "F", "B", "W" or "BW"; or a pair
# ("F&B", forward action, backward action)

def _check(rank: int, n_stages: int, micro_batches: int) -> None:
    if n_stages < 1 or micro_batches < 1:
        raise ValueError(f"need at least one stage and one micro-batch, got p={n_stages}, m={micro_batches}")
    if not 0 <= rank < n_stages:
        raise ValueError(f"rank {rank} is not a stage of a {n_stages}-stage pipeline")


def gpipe_actions(rank: int, n_stages: int, micro_batches: int) -> list[Action]:
    """GPipe's actions on ``rank``: ``F0 .. F{m-1}`` then ``B0 .. B{m-1}``.

    Raises:
        ValueError: ``n_stages`` or ``micro_batches`` < 1, or ``rank`` outside ``0 .. n_stages - 1``.
    """
    _check(rank, n_stages, micro_batches)
    # BEGIN ASSIGN5_2_4
    return [("F", i) for i in range(micro_batches)] + [("B", i) for i in range(micro_batches)]
    # END ASSIGN5_2_4


def one_f_one_b_actions(rank: int, n_stages: int, micro_batches: int) -> list[Action]:
    """1F1B's actions on ``rank``: warm-up forwards, steady one-forward-one-backward, cool-down backwards.

    Warm-up: ``min(p - rank - 1, m)`` forwards. Steady state: ``F(k), B(j)`` pairs until
    every forward is done. Cool-down: the remaining backwards. E.g. p = 4, m = 6,
    rank 1: ``F0 F1 | F2 B0 F3 B1 F4 B2 F5 B3 | B4 B5``.

    Raises:
        ValueError: ``n_stages`` or ``micro_batches`` < 1, or ``rank`` outside ``0 .. n_stages - 1``.
    """
    _check(rank, n_stages, micro_batches)
    # BEGIN ASSIGN5_2_4
    warmup = min(n_stages - rank - 1, micro_batches)
    actions = [("F", i) for i in range(warmup)]
    next_backward = 0
    for i in range(warmup, micro_batches):
        actions += [("F", i), ("B", next_backward)]
        next_backward += 1
    actions += [("B", i) for i in range(next_backward, micro_batches)]
    return actions
    # END ASSIGN5_2_4


def micro_batches_per_round(n_stages: int, micro_batches: int) -> int:
    """Micro-batches per round of the interleaved schedule: ``p`` if ``m >= p``, else ``m``.

    Megatron-LM needs ``m`` divisible by ``p``; like torch's ``ScheduleInterleaved1F1B``
    this also accepts ``m < p`` (one round of ``m``) and any ``m`` divisible by the number
    of rounds ``max(1, m // p)``.

    Raises:
        ValueError: ``m`` not a multiple of ``max(1, m // p)`` (e.g. p = 4, m = 9): use a multiple of p.
    """
    rounds = max(1, micro_batches // n_stages)
    if micro_batches % rounds:
        raise ValueError(f"interleaved 1F1B needs the number of micro-batches ({micro_batches}) to be a multiple of "
                         f"the number of rounds max(1, m // p) = {rounds}; use a --micro_batches that is a multiple of "
                         f"the number of stages ({n_stages}) or smaller than it")
    return micro_batches // rounds


def interleaved_warmup(rank: int, n_stages: int, micro_batches: int, virtual_stages: int) -> int:
    """Warm-up forwards of interleaved 1F1B on ``rank``: ``(v - 1) * q + 2 * (p - rank - 1)``, at most ``v * m``,
    with ``q`` = :func:`micro_batches_per_round` (``q = p`` when ``p`` divides ``m``)."""
    q = micro_batches_per_round(n_stages, micro_batches)
    return min((virtual_stages - 1) * q + 2 * (n_stages - rank - 1), virtual_stages * micro_batches)


def interleaved_1f1b_actions(rank: int, n_stages: int, micro_batches: int, virtual_stages: int) -> list[Action]:
    """Interleaved 1F1B's actions on ``rank``: ``(kind, micro-batch, chunk)`` with kind ``"F"`` or ``"B"``.

    Megatron-LM's order (Narayanan et al. 2021, Sec. 2.2.2; torch's ``ScheduleInterleaved1F1B``):
    the ``k``-th forward of the rank (``k = 0 .. v*m - 1``) runs chunk ``(k // q) % v``, i.e.
    rounds of ``q`` micro-batches go through chunk 0, then chunk 1, ... (depth first);
    each chunk takes its micro-batches in order. The ``k``-th backward runs chunk
    ``v - 1 - (k // q) % v`` (the last chunk first). The rank runs
    :func:`interleaved_warmup` forwards, then alternates one forward and one backward,
    then runs the remaining backwards. With ``v = 1`` the warm-up is ``2 * (p - rank - 1)``,
    twice 1F1B's (as in torch), so more micro-batches are in flight than with :func:`one_f_one_b_actions`.

    E.g. p = 2, m = 2, v = 2, rank 0: F(0,c0) F(1,c0) F(0,c1) F(1,c1) | B(0,c1) B(1,c1) B(0,c0) B(1,c0).

    Args:
        virtual_stages: ``v``, the model chunks per rank (virtual stages per rank), >= 1.

    Raises:
        ValueError: ``virtual_stages`` < 1 (and see :func:`micro_batches_per_round`, :func:`gpipe_actions`).
    """
    _check(rank, n_stages, micro_batches)
    if virtual_stages < 1:
        raise ValueError(f"need at least one chunk per rank, got v={virtual_stages}")
    # BEGIN ASSIGN5_2_5
    q = micro_batches_per_round(n_stages, micro_batches)
    total = virtual_stages * micro_batches
    warmup = interleaved_warmup(rank, n_stages, micro_batches, virtual_stages)
    next_mb = {"F": [0] * virtual_stages, "B": [0] * virtual_stages}

    def action(kind: str, k: int) -> Action:
        chunk = (k // q) % virtual_stages
        if kind == "B":
            chunk = virtual_stages - 1 - chunk
        i = next_mb[kind][chunk]
        next_mb[kind][chunk] += 1
        return (kind, i, chunk)

    actions = [action("F", k) for k in range(warmup)]
    for k in range(warmup, total):
        actions += [action("F", k), action("B", k - warmup)]
    actions += [action("B", k) for k in range(total - warmup, total)]
    return actions
    # END ASSIGN5_2_5


def zb_h1_actions(rank: int, n_stages: int, micro_batches: int) -> list[Action]:
    """ZB-H1's actions on ``rank`` (Qi et al. 2024, Sec. 2.1, Fig. 3; torch's ``ScheduleInterleavedZeroBubble``, v = 1).

    ``("F", i)`` forward, ``("B", i)`` gradient with respect to the stage's input only,
    ``("W", i)`` gradient with respect to the stage's weights. Like 1F1B: ``min(p - rank - 1, m)``
    warm-up forwards, then ``F, B`` pairs, then the remaining ``B``. The ``W`` are taken in
    micro-batch order, one right after each ``B`` except that the first ``rank`` of them are
    deferred: after the ``k``-th ``B`` comes ``W(k - rank)`` (if ``k >= rank``), and the
    deferred ones close the list. E.g. p = 2, m = 3: rank 0 ``F0 F1 B0 W0 F2 B1 W1 B2 W2``,
    rank 1 ``F0 B0 F1 B1 W0 F2 B2 W1 W2``.

    Raises:
        ValueError: ``n_stages`` or ``micro_batches`` < 1, or ``rank`` outside ``0 .. n_stages - 1``.
    """
    _check(rank, n_stages, micro_batches)
    # BEGIN ASSIGN5_2_6
    warmup = min(n_stages - rank - 1, micro_batches)
    actions = [("F", i) for i in range(warmup)]
    next_w = 0

    def backward(k: int) -> list[Action]:
        nonlocal next_w
        out = [("B", k)]
        if k >= rank:
            out.append(("W", next_w))
            next_w += 1
        return out

    for k in range(micro_batches - warmup):
        actions += [("F", warmup + k)] + backward(k)
    for k in range(micro_batches - warmup, micro_batches):
        actions += backward(k)
    actions += [("W", i) for i in range(next_w, micro_batches)]
    return actions
    # END ASSIGN5_2_6


def _check_v(rank: int, n_stages: int, micro_batches: int, least: int = 1) -> None:
    _check(rank, n_stages, micro_batches)
    if micro_batches < least:
        raise ValueError(f"DualPipeV needs at least as many micro-batches as stages (2p = {least}), got "
                         f"m={micro_batches}; use --micro_batches >= {least}")


def zbv_actions(rank: int, n_stages: int, micro_batches: int) -> list[Action]:
    """ZB-V's actions on ``rank`` of ``p`` (Qi et al. 2024, "Zero Bubble Pipeline Parallelism", Sec. 6, Fig. 8;
    torch's ``ScheduleZBVZeroBubble``). V placement: chunk 0 is stage ``rank``, chunk 1 stage ``2p - 1 - rank``
    (:func:`stage_of`); actions ``(kind, micro-batch, chunk)``, kind ``"F"``, ``"B"`` (input gradient only)
    or ``"W"``.

    Laid out as if there were ``n = max(2p - 1, m)`` micro-batches (enough to fill the V), then the
    actions of micro-batches ``>= m`` are dropped. Warm-up: ``2(p - rank) - 1`` forwards of chunk 0; then
    ``rank`` times ``F`` chunk 1, ``F`` chunk 0; then ``p - rank`` times ``F B W`` of chunk 1. Steady
    state, while chunk 0 has forwards left or chunk 1 lags behind it: ``F`` chunk 0 (if any left),
    ``B W`` chunk 0, ``F B W`` chunk 1. Cool-down: ``rank`` times ``B`` chunk 0, ``B`` chunk 1 (their
    ``W`` deferred); ``p - rank`` times ``B W`` chunk 0; then the deferred ``W`` of chunk 1, then of
    chunk 0, each in micro-batch order. E.g. p = 1, m = 2: ``F0.0 F0.1 B0.1 W0.1 F1.0 B0.0 W0.0 F1.1 B1.1
    W1.1 B1.0 W1.0`` (``Fi.c``: micro-batch i, chunk c).

    Raises:
        ValueError: ``n_stages`` or ``micro_batches`` < 1, or ``rank`` outside ``0 .. n_stages - 1``.
    """
    _check(rank, n_stages, micro_batches)
    # BEGIN ASSIGN5_2_7
    p, n = n_stages, max(2 * n_stages - 1, micro_batches)
    count = {(kind, c): 0 for kind in "FBW" for c in (0, 1)}
    actions: list[Action] = []

    def add(kind: str, chunk: int) -> None:
        actions.append((kind, count[kind, chunk], chunk))
        count[kind, chunk] += 1

    for _ in range(2 * (p - rank) - 1):
        add("F", 0)
    for _ in range(rank):
        add("F", 1)
        add("F", 0)
    for _ in range(p - rank):
        for kind in "FBW":
            add(kind, 1)
    while count["F", 1] < count["F", 0] or count["F", 0] < n:
        if count["F", 0] < n:
            add("F", 0)
        add("B", 0)
        add("W", 0)
        for kind in "FBW":
            add(kind, 1)
    for _ in range(rank):
        add("B", 0)
        add("B", 1)
    for _ in range(p - rank):
        add("B", 0)
        add("W", 0)
    for c in (1, 0):
        while count["W", c] < count["B", c]:
            add("W", c)
    return [a for a in actions if a[1] < micro_batches]
    # END ASSIGN5_2_7


def dualpipev_actions(rank: int, n_stages: int, micro_batches: int) -> list[Action]:
    """DualPipeV's actions on ``rank`` of ``p`` (DeepSeek-V3 technical report, Sec. 3.2.1, Fig. 5, "cut in
    half" to one direction on ``p`` ranks as in the DualPipe repository; torch's ``ScheduleDualPipeV``).

    V placement: chunk 0 is stage ``rank``, chunk 1 stage ``2p - 1 - rank`` (:func:`stage_of`). Actions
    ``(kind, micro-batch, chunk)`` — kind ``"F"``, ``"BW"`` (whole backward), ``"B"`` (input gradient only,
    its ``W`` queued) or ``"W"`` (the oldest queued weight gradient) — and pairs
    ``("F&B", ("F", i, c), ("BW", j, 1 - c))``: a forward of one chunk issued with the whole backward of the
    other, so that the forward's communication overlaps the backward's computation and vice versa. Each
    chunk takes its forwards, and its backwards, in micro-batch order. The eight phases:

    1. ``2(p - rank - 1)`` forwards of chunk 0;
    2. ``rank + 1`` times ``F`` chunk 0, ``F`` chunk 1;
    3. ``p - rank - 1`` times ``B`` chunk 1, a queued ``W``, ``F`` chunk 1 (zero-bubble warm-up);
    4. ``m - 2p + rank + 1`` times the pair (``F`` chunk 0 & ``BW`` chunk 1), then the pair (``F`` chunk 1 &
       ``BW`` chunk 0) — except that the last rank issues its first ``F`` chunk 0 and ``BW`` chunk 1 unpaired;
    5. ``p - rank - 1`` times ``BW`` chunk 1, then the pair (``F`` chunk 1 & ``BW`` chunk 0);
    6. ``rank + 1`` times a backward of chunk 1 then of chunk 0: whole (``BW``) in the first half, split
       (``B``, its ``W`` queued) from the middle on — the switch at iteration ``(rank + 1) // 2``, before
       chunk 1's backward on odd ranks, between the two on even ranks;
    7. ``p - rank - 1`` times a queued ``W``, then ``B`` chunk 0;
    8. ``rank + 1`` queued ``W`` (as many as are left).

    E.g. p = 1, m = 2: ``F0.0 F0.1 F1.0 BW0.1 (F1.1 & BW0.0) BW1.1 B1.0 W1.0`` (``Fi.c``: micro-batch i,
    chunk c).

    Raises:
        ValueError: ``n_stages`` < 1, ``rank`` outside ``0 .. n_stages - 1``, or fewer micro-batches than
            the ``2p`` stages (torch refuses them too).
    """
    _check_v(rank, n_stages, micro_batches, 2 * n_stages)
    # BEGIN ASSIGN5_2_7
    p, m = n_stages, micro_batches
    next_f, next_b = [0, 0], [0, 0]
    queued: list[tuple[int, int]] = []  # (chunk, micro-batch) whose W waits
    actions: list[Action] = []

    def forward(c: int) -> Action:
        next_f[c] += 1
        return ("F", next_f[c] - 1, c)

    def backward(c: int, split: bool = False) -> Action:
        next_b[c] += 1
        if split:
            queued.append((c, next_b[c] - 1))
        return ("B" if split else "BW", next_b[c] - 1, c)

    def weight() -> None:
        if queued:
            c, i = queued.pop(0)
            actions.append(("W", i, c))

    def pair(f: int, b: int) -> Action:
        return (PAIR, forward(f), backward(b))

    actions += [forward(0) for _ in range(2 * (p - rank - 1))]
    for _ in range(rank + 1):
        actions += [forward(0), forward(1)]
    for _ in range(p - rank - 1):
        actions.append(backward(1, split=True))
        weight()
        actions.append(forward(1))
    for k in range(m - 2 * p + rank + 1):
        if k == 0 and rank == p - 1:
            actions += [forward(0), backward(1)]
        else:
            actions.append(pair(0, 1))
        actions.append(pair(1, 0))
    for _ in range(p - rank - 1):
        actions += [backward(1), pair(1, 0)]
    split = False
    for k in range(rank + 1):
        if k == (rank + 1) // 2 and rank % 2 == 1:
            split = True
        actions.append(backward(1, split))
        if k == (rank + 1) // 2 and rank % 2 == 0:
            split = True
        actions.append(backward(0, split))
    for _ in range(p - rank - 1):
        weight()
        actions.append(backward(0, split=True))
    for _ in range(rank + 1):
        weight()
    return actions
    # END ASSIGN5_2_7


@dataclass(frozen=True)
class Schedule:
    """One pipeline schedule, declared once (:data:`SCHEDULES`): what the runner, the simulator, the
    benchmarks, the plots, the scripts' options and the tests take it from.

    Attributes:
        name: the option value (``--schedule``), e.g. ``"1f1b"``.
        title: how plots and tables name it.
        actions: ``actions(rank, p, m, v)`` — the rank's action list (``v``, chunks per rank, is 1
            unless :attr:`interleaved`).
        work_per_micro: units of work per micro-batch and stage relative to one forward + backward,
            for the theoretical bubble: 1 for GPipe and 1F1B; ``v`` for interleaved (``v`` chunks per
            rank, each with ``1/v`` of the work, so the warm-up costs ``1/v`` as much); 3 for ZB-H1
            (with F, B and W equally long, deferring W fills two thirds of the bubble); 6 for ZB-V (two
            chunks of F, B, W per micro-batch and the bubble of one 1F1B slot, ``p - 1`` units per rank);
            3 for DualPipeV (its ``(p - 1)(F&B + B - 3W)`` with F = B = W = 1, the whole backward BW = 2
            and the pair F&B = 3 is ``2(p - 1)`` units against the ``6m`` of work).
        interleaved: the schedule takes ``v > 1`` model chunks per rank (virtual stages, looped over the ranks).
        source: the paper and section.
        placement: where a rank's chunks sit in the chain of stages (:func:`stage_of`): ``"loop"`` (one chunk,
            or interleaved), or ``"v"`` — always two chunks per rank, rank ``r`` holding stages ``r`` and
            ``2p - 1 - r`` (ZB-V, DualPipeV).
    """

    name: str
    title: str
    actions: Callable[[int, int, int, int], list[Action]]
    work_per_micro: Callable[[int], int]
    interleaved: bool
    source: str
    placement: str = "loop"

    def chunks_per_rank(self, virtual_stages: int = 1) -> int:
        """The model chunks each rank holds: ``virtual_stages`` for an :attr:`interleaved` schedule, 2 with
        the V placement, else 1."""
        return 2 if self.placement == "v" else virtual_stages if self.interleaved else 1

    def bubble(self, n_stages: int, micro_batches: int, virtual_stages: int = 1) -> float:
        """The theoretical bubble fraction ``(p - 1) / (w m + p - 1)``, ``w`` = :attr:`work_per_micro`,
        with every stage and every action equally long (:func:`pipeline.metrics.bubble_fraction`)."""
        from pipeline.metrics import bubble_fraction

        return bubble_fraction(n_stages, self.work_per_micro(virtual_stages) * micro_batches)


SCHEDULES: dict[str, Schedule] = {s.name: s for s in [
    Schedule("gpipe", "GPipe", lambda r, p, m, v: gpipe_actions(r, p, m), lambda v: 1, False,
             "Huang et al. 2019, GPipe, Sec. 2.2"),
    Schedule("1f1b", "1F1B", lambda r, p, m, v: one_f_one_b_actions(r, p, m), lambda v: 1, False,
             "Narayanan et al. 2021, Megatron-LM, Sec. 2.2.1 (PipeDream-Flush)"),
    Schedule("interleaved", "interleaved 1F1B", interleaved_1f1b_actions, lambda v: v, True,
             "Narayanan et al. 2021, Megatron-LM, Sec. 2.2.2"),
    Schedule("zb-h1", "ZB-H1", lambda r, p, m, v: zb_h1_actions(r, p, m), lambda v: 3, False,
             "Qi et al. 2024, Zero Bubble Pipeline Parallelism, Sec. 2.1"),
    Schedule("zbv", "ZB-V", lambda r, p, m, v: zbv_actions(r, p, m), lambda v: 6, False,
             "Qi et al. 2024, Zero Bubble Pipeline Parallelism, Sec. 6", placement="v"),
    Schedule("dualpipev", "DualPipeV", lambda r, p, m, v: dualpipev_actions(r, p, m), lambda v: 3, False,
             "DeepSeek-AI 2024, DeepSeek-V3 Technical Report, Sec. 3.2.1 (cut in half: DualPipeV)", placement="v"),
]}


def get_schedule(name: str) -> Schedule:
    """The :class:`Schedule` called ``name``.

    Raises:
        ValueError: an unknown name (the message lists the known ones).
    """
    if name not in SCHEDULES:
        raise ValueError(f"unknown schedule {name!r}; choose one of {tuple(SCHEDULES)}")
    return SCHEDULES[name]


def schedule_actions(schedule: str, rank: int, n_stages: int, micro_batches: int,
                     virtual_stages: int = 1) -> list[Action]:
    """The action list of ``schedule`` (a name in :data:`SCHEDULES`) on ``rank``.

    Args:
        virtual_stages: ``v``, model chunks per rank; only an ``interleaved`` schedule takes ``v > 1``. A V
            schedule (``placement == "v"``) always runs two chunks; it takes 1 (the default) or 2.

    Raises:
        ValueError: unknown schedule name; ``virtual_stages != 1`` for a schedule with one chunk per rank
            (and see :func:`gpipe_actions`, :func:`interleaved_1f1b_actions`).
    """
    entry = get_schedule(schedule)
    if entry.placement == "v":
        if virtual_stages not in (1, 2):
            raise ValueError(f"the {schedule} schedule runs two chunks per rank in a V (stages r and 2p - 1 - r), got "
                             f"virtual_stages={virtual_stages}; leave it at 1 or 2")
        return entry.actions(rank, n_stages, micro_batches, 2)
    if virtual_stages != 1 and not entry.interleaved:
        raise ValueError(f"the {schedule} schedule runs one chunk per rank, got virtual_stages={virtual_stages}; "
                         "use the interleaved schedule for several chunks")
    return entry.actions(rank, n_stages, micro_batches, virtual_stages)


def all_actions(schedule: str, n_stages: int, micro_batches: int, virtual_stages: int = 1) -> list[list[Action]]:
    """The action lists of every rank ``0 .. n_stages - 1``."""
    return [schedule_actions(schedule, r, n_stages, micro_batches, virtual_stages) for r in range(n_stages)]
