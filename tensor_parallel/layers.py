"""Column- and row-parallel linear layers (Shoeybi et al. 2019, Megatron-LM, Sec. 3).

A linear layer ``Y = X A^T + b`` with ``A`` of shape (out_features, in_features), as in
``torch.nn.Linear``, can be split over ``tp`` ranks in two ways:

* **column parallel** — ``A`` split by output features (rows of ``A``, columns of ``A^T``):
  rank r computes ``Y_r = X A_r^T + b_r``, its own slice of the output features. The
  input must be the same on every rank, so it enters through ``f``; the outputs can stay
  split (the usual case: a row-parallel layer follows) or be gathered (``gather_output``).
* **row parallel** — ``A`` split by input features: rank r computes the partial sum
  ``X_r A_r^T`` from its slice of the input features; the partial sums are added by ``g``
  (an all-reduce), then the bias is added **once**, after the reduction.

Both are built from the full ("master") weight of a dense layer, so the parallel layer
computes the same function as the dense one. Both take the tensor-parallel ``group`` (the
``tp`` group of the run's mesh; None: the whole world) and communicate only in it; "rank"
and ``tp`` are the rank in that group and its size. With ``sequence_parallel=True`` (Korthikanti
et al. 2022, Sec. 4.2.2) the column layer all-gathers its input along the sequence instead
of ``f``, and the row layer reduce-scatters its output along the sequence instead of ``g``.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from course.collectives import group_rank, group_size
from tensor_parallel.mappings import (copy_to_tensor_parallel_region, gather_from_sequence_parallel_region,
                                      gather_from_tensor_parallel_region, reduce_from_tensor_parallel_region,
                                      reduce_scatter_to_sequence_parallel_region, scatter_to_tensor_parallel_region)


def divide(numerator: int, denominator: int, what: str) -> int:
    """``numerator // denominator``; ValueError naming ``what`` if it does not divide evenly."""
    if numerator % denominator:
        raise ValueError(f"{what}={numerator} is not divisible by tp={denominator}; "
                         f"choose sizes that are multiples of tp or a tp that divides {numerator}")
    return numerator // denominator


def init_master(in_features: int, out_features: int, bias: bool, seed: int, dtype=torch.float32):
    """A dense weight (out, in) and bias (out,) drawn like ``nn.Linear``'s, from a generator seeded
    with ``seed`` — identical on every rank, so each rank can cut its own shard from it."""
    gen = torch.Generator().manual_seed(seed)
    weight = torch.empty(out_features, in_features, dtype=dtype, device="cpu")  # the module moves with .to()
    nn.init.kaiming_uniform_(weight, a=math.sqrt(5), generator=gen)
    b = None
    if bias:
        bound = 1 / math.sqrt(in_features)
        b = torch.empty(out_features, dtype=dtype, device="cpu").uniform_(-bound, bound, generator=gen)
    return weight, b


def _check_master(master_weight, master_bias, in_features, out_features, bias):
    if tuple(master_weight.shape) != (out_features, in_features):
        raise ValueError(f"master_weight has shape {tuple(master_weight.shape)}, expected "
                         f"(out_features, in_features) = {(out_features, in_features)} as in nn.Linear")
    if bias and (master_bias is None or tuple(master_bias.shape) != (out_features,)):
        raise ValueError(f"master_bias must have shape ({out_features},)")


class ColumnParallelLinear(nn.Module):
    """Linear layer with the weight split by output features over the ranks.

    Shapes: input (..., in_features), the same on every rank (or, with
    ``sequence_parallel``, this rank's (batch, seq / tp, in_features)); output
    (..., out_features / tp), or (..., out_features) with ``gather_output=True``.
    Parameters on rank r: ``weight`` (out_features / tp, in_features) = rows
    ``[r * out/p, (r + 1) * out/p)`` of the master weight, and the same slice of the bias.

    Args:
        master_weight, master_bias: the dense (out, in) weight and (out,) bias to cut the
            shard from (e.g. ``nn.Linear.weight``); drawn from ``seed`` if None.
        group: the tensor-parallel process group (None: the world).

    Raises:
        ValueError: ``out_features`` not divisible by ``tp``; master shapes wrong.

    Source: Shoeybi et al. 2019, Megatron-LM, Sec. 3 (Eq. 3, the first GEMM of the MLP).
    """

    def __init__(self, in_features: int, out_features: int, bias: bool = True, gather_output: bool = False,
                 sequence_parallel: bool = False, master_weight: torch.Tensor | None = None,
                 master_bias: torch.Tensor | None = None, seed: int = 0, group=None):
        super().__init__()
        self.group = group
        p, rank = group_size(group), group_rank(group)
        self.in_features, self.out_features = in_features, out_features
        self.out_per_rank = divide(out_features, p, "out_features")
        self.gather_output, self.sequence_parallel = gather_output, sequence_parallel
        if master_weight is None:
            master_weight, master_bias = init_master(in_features, out_features, bias, seed)
        _check_master(master_weight, master_bias, in_features, out_features, bias)
        weight = bias_shard = None
        # BEGIN ASSIGN5_3_2
        weight = master_weight.chunk(p, dim=0)[rank]
        if bias:
            bias_shard = master_bias.chunk(p, dim=0)[rank]
        # END ASSIGN5_3_2
        self.weight = nn.Parameter(weight.detach().clone())
        self.bias = nn.Parameter(bias_shard.detach().clone()) if bias else None

    def local(self, x: torch.Tensor) -> torch.Tensor:
        """This rank's output slice without any communication: (..., in) -> (..., out / tp)."""
        return F.linear(x, self.weight, self.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.sequence_parallel:
            # BEGIN ASSIGN5_3_5
            x = gather_from_sequence_parallel_region(x, self.group)
            # END ASSIGN5_3_5
        else:
            # BEGIN ASSIGN5_3_2
            x = copy_to_tensor_parallel_region(x, self.group)
            # END ASSIGN5_3_2
        # BEGIN ASSIGN5_3_2
        y = self.local(x)
        return gather_from_tensor_parallel_region(y, self.group) if self.gather_output else y
        # END ASSIGN5_3_2

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features} "
                f"({self.out_per_rank} on this rank), gather_output={self.gather_output}, "
                f"sequence_parallel={self.sequence_parallel}")


class RowParallelLinear(nn.Module):
    """Linear layer with the weight split by input features over the ranks.

    Shapes: input (..., in_features / tp) when ``input_is_parallel`` (the output of a
    column-parallel layer), else (..., in_features), the same on every rank, of which this
    rank takes its slice. Output (..., out_features), the same on every rank (with
    ``sequence_parallel``: this rank's (batch, seq / tp, out_features)).
    Parameters on rank r: ``weight`` (out_features, in_features / tp) = columns
    ``[r * in/p, (r + 1) * in/p)`` of the master weight; ``bias`` (out_features,), the whole
    bias, replicated — added once, after the partial sums are reduced.

    Args:
        master_weight, master_bias: the dense (out, in) weight and (out,) bias to cut from.
        group: the tensor-parallel process group (None: the world).

    Raises:
        ValueError: ``in_features`` not divisible by ``tp``; master shapes wrong;
            ``sequence_parallel`` without ``input_is_parallel``.

    Source: Shoeybi et al. 2019, Megatron-LM, Sec. 3 (the second GEMM of the MLP, ``g``).
    """

    def __init__(self, in_features: int, out_features: int, bias: bool = True, input_is_parallel: bool = True,
                 sequence_parallel: bool = False, master_weight: torch.Tensor | None = None,
                 master_bias: torch.Tensor | None = None, seed: int = 0, group=None):
        super().__init__()
        self.group = group
        p, rank = group_size(group), group_rank(group)
        self.in_features, self.out_features = in_features, out_features
        self.in_per_rank = divide(in_features, p, "in_features")
        if sequence_parallel and not input_is_parallel:
            raise ValueError("RowParallelLinear with sequence_parallel=True needs input_is_parallel=True")
        self.input_is_parallel, self.sequence_parallel = input_is_parallel, sequence_parallel
        if master_weight is None:
            master_weight, master_bias = init_master(in_features, out_features, bias, seed)
        _check_master(master_weight, master_bias, in_features, out_features, bias)
        weight = None
        # BEGIN ASSIGN5_3_2
        weight = master_weight.chunk(p, dim=1)[rank]
        # END ASSIGN5_3_2
        self.weight = nn.Parameter(weight.detach().clone())
        self.bias = nn.Parameter(master_bias.detach().clone()) if bias else None

    def local(self, x: torch.Tensor) -> torch.Tensor:
        """This rank's partial sum, no bias, no communication: (..., in / tp) -> (..., out)."""
        return F.linear(x, self.weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.input_is_parallel:
            x = scatter_to_tensor_parallel_region(x, self.group)
        partial = self.local(x)
        if self.sequence_parallel:
            # BEGIN ASSIGN5_3_5
            y = reduce_scatter_to_sequence_parallel_region(partial, self.group)
            # END ASSIGN5_3_5
        else:
            # BEGIN ASSIGN5_3_2
            y = reduce_from_tensor_parallel_region(partial, self.group)
            # END ASSIGN5_3_2
        # BEGIN ASSIGN5_3_2
        return y + self.bias if self.bias is not None else y
        # END ASSIGN5_3_2

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features} ({self.in_per_rank} on this rank), "
                f"out_features={self.out_features}, input_is_parallel={self.input_is_parallel}, "
                f"sequence_parallel={self.sequence_parallel}")
