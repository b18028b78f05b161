"""Block communication strategies, selectable per layer with ``block_types``.

* ``tp`` — exact Megatron tensor parallelism (Shoeybi et al. 2019, Sec. 3): 2 all-reduces
  per block in the forward pass (after attention, after the MLP) and 2 in the backward
  pass. Computes exactly the single-device GPT-2 block. (:class:`tensor_parallel.gpt2.TensorParallelBlock`)
* ``spd`` — Sync-Point Drop (Kim et al. 2025, SPD, Sec. 3): the all-reduce after attention
  is dropped. Each rank feeds its MLP with its own *partial* attention output
  (``x + A_r + b``, where the exact block uses ``x + sum_r A_r + b``); the attention
  partials are added to the MLP partials and summed by the one all-reduce at the end of
  the block. 1 all-reduce forward and 1 backward per block. **An approximation**: the
  block is no longer the single-device block (the MLP never sees the other ranks' heads).
  The paper applies SPD to inference of trained models, choosing per block where to drop;
  the block below is our concrete reading of its block design, trained from scratch here.
* ``parallel`` — a run of consecutive ``parallel`` blocks is computed by each rank on its
  **own residual stream**, starting from the shared input and never synchronising inside
  the run; the ranks' contributions are summed once at the end of the run (1 all-reduce
  forward, 1 backward, per run). **A different architecture**: p narrower models side by
  side whose outputs are added. A run of one ``parallel`` block computes the same as ``spd``.

For a run of blocks, with ``x`` the shared input and rank r's stream ``s_r`` starting at
``x``, each block does (on rank r, no communication)::

    a = Attn_r(LN_1(s_r));  s_r = s_r + a + b_attn
    m = MLP_r(LN_2(s_r));   s_r = s_r + m + b_mlp
    d_r = d_r + a + m (+ b_attn + b_mlp on rank 0 only: the biases are counted once)

and the run returns ``x + sum_r d_r`` (``g``). Here ``Attn_r`` and ``MLP_r`` are rank r's
partial sums (its heads / its slice of the MLP through its rows of the output
projection, without bias). With sequence parallelism the run starts with an all-gather
along the sequence and ends with a reduce-scatter instead of ``f`` and ``g``.

Because each rank's layer norms and output biases see only that rank's stream, their
gradients are partial sums: :meth:`BlockBase.partial_grad_params` lists them, and the
model all-reduces their gradients after the backward pass
(:func:`tensor_parallel.sequence_parallel.sync_partial_grads`).
"""
from __future__ import annotations

from typing import Sequence

import torch
from torch import nn

from course.collectives import group_rank
from tensor_parallel.rules import BLOCK_TYPES, parse_block_types  # noqa: F401 (the block types, torch-free)
from tensor_parallel.mappings import (copy_to_tensor_parallel_region, gather_from_sequence_parallel_region,
                                      reduce_from_tensor_parallel_region, reduce_scatter_to_sequence_parallel_region)

def enter_region(x: torch.Tensor, sequence_parallel: bool, group=None) -> torch.Tensor:
    """Start of a tensor-parallel region: ``f``, or the sequence all-gather under sequence parallelism."""
    if sequence_parallel:
        return gather_from_sequence_parallel_region(x, group)
    return copy_to_tensor_parallel_region(x, group)


def exit_region(x: torch.Tensor, sequence_parallel: bool, group=None) -> torch.Tensor:
    """End of a tensor-parallel region: ``g``, or the sequence reduce-scatter under sequence parallelism."""
    if sequence_parallel:
        return reduce_scatter_to_sequence_parallel_region(x, group)
    return reduce_from_tensor_parallel_region(x, group)


class BlockBase(nn.Module):
    """The parts of a tensor-parallel GPT-2 block: replicated layer norms, split attention and MLP,
    over the tensor-parallel ``group`` (None: the world)."""

    block_type = "base"

    def __init__(self, ln_1: nn.LayerNorm, attn: nn.Module, ln_2: nn.LayerNorm, mlp: nn.Module,
                 sequence_parallel: bool = False, group=None):
        super().__init__()
        self.ln_1, self.attn, self.ln_2, self.mlp = ln_1, attn, ln_2, mlp
        self.sequence_parallel, self.group = sequence_parallel, group

    def replicated_params(self) -> list[nn.Parameter]:
        """Layer norms and the output biases: the same full tensor on every rank."""
        return [*self.ln_1.parameters(), *self.ln_2.parameters(), self.attn.c_proj.bias, self.mlp.c_proj.bias]

    def partial_grad_params(self) -> list[nn.Parameter]:
        """Replicated parameters whose gradient on one rank is only a part of the whole.

        Exact ``tp`` blocks: none without sequence parallelism (every rank sees the whole
        sequence and the all-reduced gradient); all replicated ones with it (each rank
        sees its part of the sequence). ``spd``/``parallel`` blocks: all replicated ones.
        """
        return self.replicated_params() if self.sequence_parallel else []

    def local_step(self, s: torch.Tensor, attn_bias: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """One block on this rank's own stream ``s`` (batch, seq, hidden), no communication.

        Returns the updated stream and this rank's contribution ``d_r`` (see module docstring).
        """
        a = self.attn.resid_dropout(self.attn.partial(self.ln_1(s), attn_bias))
        s = s + a + self.attn.c_proj.bias
        m = self.mlp.dropout(self.mlp.partial(self.ln_2(s)))
        s = s + m + self.mlp.c_proj.bias
        d = a + m
        if group_rank(self.group) == 0:
            d = d + self.attn.c_proj.bias + self.mlp.c_proj.bias
        return s, d


class SyncPointDropBlock(BlockBase):
    """``spd``: one all-reduce per block (Kim et al. 2025). Not equal to the single-device block."""

    block_type = "spd"

    def partial_grad_params(self) -> list[nn.Parameter]:
        return self.replicated_params()

    def forward(self, x: torch.Tensor, attn_bias: torch.Tensor) -> torch.Tensor:
        _, d = self.local_step(enter_region(x, self.sequence_parallel, self.group), attn_bias)
        return x + exit_region(d, self.sequence_parallel, self.group)


class ParallelBlock(BlockBase):
    """``parallel``: a block of a run computed on per-rank residual streams (see :func:`run_parallel_blocks`)."""

    block_type = "parallel"

    def partial_grad_params(self) -> list[nn.Parameter]:
        return self.replicated_params()

    def forward(self, x: torch.Tensor, attn_bias: torch.Tensor) -> torch.Tensor:
        return run_parallel_blocks([self], x, attn_bias, self.sequence_parallel, self.group)


def run_parallel_blocks(blocks: Sequence[BlockBase], x: torch.Tensor, attn_bias: torch.Tensor,
                        sequence_parallel: bool = False, group=None) -> torch.Tensor:
    """A run of ``parallel`` blocks: communicate at its start (``f``) and end (``g``) only.

    Args:
        x: (batch, seq, hidden) the same on every rank (sequence parallel: this rank's
            (batch, seq / tp, hidden)).

    Returns:
        ``x + sum_r d_r``, same shape as ``x``.
    """
    s = enter_region(x, sequence_parallel, group)
    total = torch.zeros_like(s)
    for block in blocks:
        s, d = block.local_step(s, attn_bias)
        total = total + d
    return x + exit_region(total, sequence_parallel, group)


def block_runs(block_types: Sequence[str]) -> list[tuple[int, int]]:
    """``[start, end)`` index ranges: each maximal run of ``parallel`` blocks is one range,
    every other block a range of its own."""
    runs, i = [], 0
    while i < len(block_types):
        j = i + 1
        if block_types[i] == "parallel":
            while j < len(block_types) and block_types[j] == "parallel":
                j += 1
        runs.append((i, j))
        i = j
    return runs
