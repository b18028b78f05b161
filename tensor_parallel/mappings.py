"""The conjugate communication operators of Megatron-LM as autograd functions.

Shoeybi et al. 2019 (Megatron-LM), Sec. 3, Fig. 3: a tensor-parallel region starts with
``f`` and ends with ``g``:

* ``f`` — identity in the forward pass, all-reduce (sum over ranks) in the backward pass.
  Every rank uses the same input, but each rank's part of the model only sees part of
  the gradient with respect to it; the all-reduce adds those parts up.
* ``g`` — all-reduce in the forward pass, identity in the backward pass. Each rank
  holds a partial sum of the output; the sum is the same on every rank, so its gradient
  is the same on every rank and passes through unchanged.

``f`` and ``g`` are conjugate: each one's backward is the other's forward.

Scatter and gather along the last (hidden) dimension are the other conjugate pair:
``scatter`` keeps this rank's chunk (backward: all-gather the chunks of the gradient),
``gather`` concatenates every rank's chunk (backward: keep this rank's chunk of the gradient).

The sequence-parallel pair (Korthikanti et al. 2022, Sec. 4.2.2, ``g`` and ``g-bar``) works
along the sequence dimension (dim 1 of (batch, seq, hidden) tensors):

* ``gather_from_sequence_parallel_region`` — all-gather forward, reduce-scatter backward,
* ``reduce_scatter_to_sequence_parallel_region`` — reduce-scatter forward, all-gather backward,
* ``scatter_to_sequence_parallel_region`` — keep this rank's chunk forward, all-gather backward.

All tensors keep their dtype and device; chunks are equal, rank r holds chunk r. Every
operator takes the tensor-parallel ``group`` (the ``tp`` group of the run's mesh; None: the
whole world, when tensor parallelism is the only parallelism) and communicates in it only;
"rank" here is the rank in that group.
"""
from __future__ import annotations

import torch

from course.collectives import all_gather, all_reduce, group_rank, group_size, reduce_scatter

SEQUENCE_DIM = 1


def split_along_dim(x: torch.Tensor, dim: int, group=None) -> torch.Tensor:
    """This rank's chunk of ``x`` along ``dim`` (size ``x.size(dim) // tp``; no communication).

    ``tp`` is the size of ``group`` and "this rank" its rank in ``group``.

    Raises:
        ValueError: ``x.size(dim)`` is not divisible by ``tp``.
    """
    p = group_size(group)
    if x.size(dim) % p:
        raise ValueError(f"cannot split size {x.size(dim)} of dim {dim} into {p} equal chunks; "
                         f"make it divisible by tp={p}")
    # BEGIN ASSIGN5_3_1
    return x.chunk(p, dim=dim)[group_rank(group)].contiguous()
    # END ASSIGN5_3_1


class CopyToTensorParallelRegion(torch.autograd.Function):
    """``f``: forward identity, backward all-reduce of the gradient."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        # BEGIN ASSIGN5_3_1
        return x.view_as(x)
        # END ASSIGN5_3_1

    @staticmethod
    def backward(ctx, grad):
        # BEGIN ASSIGN5_3_1
        return all_reduce(grad, ctx.group), None
        # END ASSIGN5_3_1


class ReduceFromTensorParallelRegion(torch.autograd.Function):
    """``g``: forward all-reduce, backward identity."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        # BEGIN ASSIGN5_3_1
        return all_reduce(x, ctx.group)
        # END ASSIGN5_3_1

    @staticmethod
    def backward(ctx, grad):
        # BEGIN ASSIGN5_3_1
        return grad, None
        # END ASSIGN5_3_1


class ScatterToTensorParallelRegion(torch.autograd.Function):
    """Keep this rank's chunk of the last dimension; backward all-gathers the gradient's chunks."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        # BEGIN ASSIGN5_3_1
        return split_along_dim(x, -1, ctx.group)
        # END ASSIGN5_3_1

    @staticmethod
    def backward(ctx, grad):
        # BEGIN ASSIGN5_3_1
        return all_gather(grad, -1, ctx.group), None
        # END ASSIGN5_3_1


class GatherFromTensorParallelRegion(torch.autograd.Function):
    """Concatenate every rank's chunk along the last dimension; backward keeps this rank's chunk."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        # BEGIN ASSIGN5_3_1
        return all_gather(x, -1, ctx.group)
        # END ASSIGN5_3_1

    @staticmethod
    def backward(ctx, grad):
        # BEGIN ASSIGN5_3_1
        return split_along_dim(grad, -1, ctx.group), None
        # END ASSIGN5_3_1


class ScatterToSequenceParallelRegion(torch.autograd.Function):
    """Keep this rank's chunk of the sequence; backward all-gathers the gradient along the sequence."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        # BEGIN ASSIGN5_3_5
        return split_along_dim(x, SEQUENCE_DIM, ctx.group)
        # END ASSIGN5_3_5

    @staticmethod
    def backward(ctx, grad):
        # BEGIN ASSIGN5_3_5
        return all_gather(grad, SEQUENCE_DIM, ctx.group), None
        # END ASSIGN5_3_5


class GatherFromSequenceParallelRegion(torch.autograd.Function):
    """All-gather along the sequence; backward reduce-scatters (the ranks' gradients are partial sums)."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        # BEGIN ASSIGN5_3_5
        return all_gather(x, SEQUENCE_DIM, ctx.group)
        # END ASSIGN5_3_5

    @staticmethod
    def backward(ctx, grad):
        # BEGIN ASSIGN5_3_5
        return reduce_scatter(grad, SEQUENCE_DIM, ctx.group), None
        # END ASSIGN5_3_5


class ReduceScatterToSequenceParallelRegion(torch.autograd.Function):
    """Reduce-scatter along the sequence (sum partial outputs, keep own chunk); backward all-gathers."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        # BEGIN ASSIGN5_3_5
        return reduce_scatter(x, SEQUENCE_DIM, ctx.group)
        # END ASSIGN5_3_5

    @staticmethod
    def backward(ctx, grad):
        # BEGIN ASSIGN5_3_5
        return all_gather(grad, SEQUENCE_DIM, ctx.group), None
        # END ASSIGN5_3_5


def copy_to_tensor_parallel_region(x: torch.Tensor, group=None) -> torch.Tensor:
    """``f`` (Shoeybi et al. 2019, Sec. 3): ``x`` of any shape, same on every rank -> the same tensor."""
    return CopyToTensorParallelRegion.apply(x, group)


def reduce_from_tensor_parallel_region(x: torch.Tensor, group=None) -> torch.Tensor:
    """``g`` (Shoeybi et al. 2019, Sec. 3): partial sums of any shape -> their sum over ranks."""
    return ReduceFromTensorParallelRegion.apply(x, group)


def scatter_to_tensor_parallel_region(x: torch.Tensor, group=None) -> torch.Tensor:
    """(..., n) -> (..., n / tp): this rank's chunk of the last dimension."""
    return ScatterToTensorParallelRegion.apply(x, group)


def gather_from_tensor_parallel_region(x: torch.Tensor, group=None) -> torch.Tensor:
    """(..., n / tp) -> (..., n): every rank's chunk, concatenated in rank order."""
    return GatherFromTensorParallelRegion.apply(x, group)


def scatter_to_sequence_parallel_region(x: torch.Tensor, group=None) -> torch.Tensor:
    """(batch, seq, ...) -> (batch, seq / tp, ...): this rank's part of the sequence."""
    return ScatterToSequenceParallelRegion.apply(x, group)


def gather_from_sequence_parallel_region(x: torch.Tensor, group=None) -> torch.Tensor:
    """(batch, seq / tp, ...) -> (batch, seq, ...): all-gather forward, reduce-scatter backward."""
    return GatherFromSequenceParallelRegion.apply(x, group)


def reduce_scatter_to_sequence_parallel_region(x: torch.Tensor, group=None) -> torch.Tensor:
    """(batch, seq, ...) partial sums -> (batch, seq / tp, ...) of their sum: reduce-scatter forward."""
    return ReduceScatterToSequenceParallelRegion.apply(x, group)


# Short names used in the paper and the notebook.
f = copy_to_tensor_parallel_region
g = reduce_from_tensor_parallel_region
