"""Expert parallelism: the experts of a layer are shared out over the ranks of the ep group, and
tokens travel to their experts and back with two all-to-alls (Lepikhin et al. 2020, GShard,
Sec. 2.2-3.2; Fedus et al. 2021, Switch Transformer, Sec. 2.2 and Fig. 3; Megatron-Core's
``MoEAlltoAllTokenDispatcher``).

With E experts over ep ranks, rank j holds experts ``[j * E/ep, (j + 1) * E/ep)`` (its *local*
experts). After the router and the permutation (:mod:`moe.permutation`) each rank has its kept
tokens grouped by expert, ``counts[e]`` rows for expert e — and, because the experts are
numbered rank by rank, grouped by the rank that owns them. Then:

1. **exchange counts**: an all-to-all of the E counts tells every rank how many rows it will
   receive from each rank for each of its local experts — sizes known only now, at run time;
2. **dispatch**: ``all_to_all_single`` with uneven splits sends each rank its rows; they arrive
   grouped by source rank, then local expert, and are regrouped by local expert, then source,
   so each local expert's rows are consecutive;
3. the local experts run (:class:`moe.experts.GroupedExperts`);
4. **combine**: the rows are put back in arrival order and the reverse all-to-all (the splits
   swapped) returns every output to the rank its token came from, in the order it was sent.

The gate-weighted sum then happens where the token lives (:func:`moe.permutation.unpermute`).
Every rank of the ep group calls every all-to-all, also when it sends or receives nothing.
Counts and buffers stay on the tokens' device (NCCL takes CUDA tensors only); the split sizes
become Python ints, which costs one device synchronisation per layer.
"""
from __future__ import annotations

from typing import NamedTuple

import torch

from course.collectives import all_to_all_single, group_size
from moe.all_to_all import all_to_all


class DispatchState(NamedTuple):
    """What :func:`combine` needs to undo :func:`dispatch`.

    Attributes:
        input_splits: rows this rank sent to each ep rank.
        output_splits: rows this rank received from each ep rank.
        order: (M,) int64, received row ``order[i]`` is row i of the regrouped tokens.
    """

    input_splits: list[int]
    output_splits: list[int]
    order: torch.Tensor


def exchange_counts(counts: torch.Tensor, group) -> torch.Tensor:
    """Tell every rank of ``group`` how many rows it will receive from this rank for each of its experts.

    Args:
        counts: (E,) int64 rows this rank sends to each of the E experts (on the tokens' device).
        group: the ep group (ep ranks; rank j holds experts ``[j * E/ep, (j + 1) * E/ep)``).

    Returns:
        (ep, E/ep) int64: ``[i, e]`` = rows ep rank i sends to this rank's local expert e.
    """
    ep = group_size(group)
    received = None
    # BEGIN ASSIGN5_8_2
    received = all_to_all_single(counts, group=group).view(ep, -1)
    # END ASSIGN5_8_2
    return received


def dispatch(tokens: torch.Tensor, counts: torch.Tensor, group) -> tuple[torch.Tensor, torch.Tensor, DispatchState]:
    """Send every row to the rank that holds its expert, and group the rows that arrive by local expert.

    Args:
        tokens: (N, h) rows grouped by expert (:func:`moe.permutation.permute`).
        counts: (E,) int64 rows per expert, summing to N.
        group: the ep group.

    Returns:
        ``(rows, local_counts, state)``: rows (M, h) for this rank's local experts, grouped by
        local expert and, within one, by source rank; local_counts (E/ep,) int64; the
        :class:`DispatchState` for :func:`combine`. Differentiable with respect to ``tokens``.
    """
    ep = group_size(group)
    received_counts = exchange_counts(counts, group)  # (ep, E/ep)
    rows = local_counts = state = None
    # BEGIN ASSIGN5_8_2
    local = received_counts.shape[1]
    input_splits = counts.view(ep, local).sum(dim=1).tolist()
    output_splits = received_counts.sum(dim=1).tolist()
    received = all_to_all(tokens, output_splits, input_splits, group)          # [source rank][local expert]
    expert_of_row = torch.repeat_interleave(torch.arange(local, device=counts.device).repeat(ep),
                                            received_counts.reshape(-1))
    order = torch.argsort(expert_of_row, stable=True)                          # -> [local expert][source rank]
    rows, local_counts = received[order], received_counts.sum(dim=0)
    state = DispatchState(input_splits, output_splits, order)
    # END ASSIGN5_8_2
    return rows, local_counts, state


def combine(y: torch.Tensor, state: DispatchState, group) -> torch.Tensor:
    """Return the experts' outputs to the ranks their tokens came from (the reverse of :func:`dispatch`).

    Args:
        y: (M, h) outputs of the local experts, in the order of :func:`dispatch`'s rows.
        state: the :class:`DispatchState` of that dispatch.
        group: the ep group.

    Returns:
        (N, h) the output for each row this rank sent, in the order it sent them. Differentiable.
    """
    out = None
    # BEGIN ASSIGN5_8_2
    arrived = torch.empty_like(state.order)
    arrived[state.order] = torch.arange(state.order.numel(), device=state.order.device)
    out = all_to_all(y[arrived], state.input_splits, state.output_splits, group)
    # END ASSIGN5_8_2
    return out
