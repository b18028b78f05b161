"""A differentiable all-to-all: the backward pass of an all-to-all is the all-to-all back.

In the forward pass rank i sends ``input_splits[j]`` rows to rank j and receives
``output_splits[j]`` rows from it. Row for row, the gradient of what rank i received from j
belongs to the rows j sent, so the backward pass sends each received chunk's gradient back to
where it came from: an all-to-all with the two split lists swapped (Lepikhin et al. 2020,
GShard, Sec. 3.2; ``torch.distributed.nn.functional.all_to_all_single`` does the same).
Every rank of the group must take part in both passes, also with nothing to send.
"""
from __future__ import annotations

import torch

from course.collectives import all_to_all_single


class _AllToAll(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, output_splits, input_splits, group):
        ctx.output_splits, ctx.input_splits, ctx.group = output_splits, input_splits, group
        return all_to_all_single(x, output_splits, input_splits, group=group)

    @staticmethod
    def backward(ctx, grad):
        grad_input = None
        # BEGIN ASSIGN5_8_2
        grad_input = all_to_all_single(grad.contiguous(), ctx.input_splits, ctx.output_splits, group=ctx.group)
        # END ASSIGN5_8_2
        return grad_input, None, None, None


def all_to_all(x: torch.Tensor, output_splits: list[int], input_splits: list[int], group) -> torch.Tensor:
    """:func:`course.collectives.all_to_all_single` with a backward pass (see the module docstring).

    Args:
        x: (sum(input_splits), ...) rows; chunk j goes to group rank j.
        output_splits: rows received from each group rank.
        input_splits: rows sent to each group rank.
        group: the process group (the ep group of the run's mesh).

    Returns:
        (sum(output_splits), ...) the chunks received, in group-rank order.
    """
    return _AllToAll.apply(x, output_splits, input_splits, group)
