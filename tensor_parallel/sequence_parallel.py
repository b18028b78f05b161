"""Sequence parallelism (Korthikanti et al. 2022, Reducing Activation Recomputation in Large
Transformer Models, Sec. 4.2.2).

Plain tensor parallelism leaves the layer norms, dropouts and residual additions
*replicated*: every rank stores the same (batch, seq, hidden) activations for them.
Sequence parallelism splits those regions along the sequence: rank r keeps tokens
``[r * T/p, (r + 1) * T/p)``. At the border of each tensor-parallel region

* ``f`` (identity forward / all-reduce backward) becomes an **all-gather** along the
  sequence (backward: reduce-scatter), and
* ``g`` (all-reduce forward / identity backward) becomes a **reduce-scatter** along the
  sequence (backward: all-gather).

An all-reduce is a reduce-scatter followed by an all-gather, so the traffic is the same
as plain TP while the activations outside the attention and MLP shrink p times.

In the model (:class:`tensor_parallel.gpt2.TensorParallelGPT2`): the embedding output is
split along the sequence, ``ColumnParallelLinear``/``RowParallelLinear`` are built with
``sequence_parallel=True``, and the final layer norm's output is all-gathered before the
(vocabulary-parallel) output layer. The sequence length must be divisible by ``tp``;
the model pads the input at the end (causal attention makes trailing padding harmless).

Each rank's layer norms and row-parallel biases now see only its tokens, so their
gradients are partial sums over the sequence: :func:`sync_partial_grads` adds them up
after the backward pass (Megatron-LM does the same for its "sequence-parallel" parameters).
"""
from __future__ import annotations

from typing import Iterable

import torch

from course.collectives import all_reduce, group_size, region


def sync_partial_grads(params: Iterable[torch.nn.Parameter], group=None) -> None:
    """Sum the gradients of ``params`` over the ranks of the tensor-parallel ``group`` (None:
    the world), in place, in one all-reduce.

    For replicated parameters whose gradient on each rank covers only that rank's part of
    the work (its sequence chunk, or its own residual stream for ``spd``/``parallel``
    blocks). A missing gradient (None) counts as zeros. On return every rank holds the
    same, complete gradient.
    """
    params = list(params)
    if not params or group_size(group) == 1:
        return
    with region("grad_sync", "step"):
        # BEGIN ASSIGN5_3_5
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
        flat = all_reduce(torch.cat([g.reshape(-1) for g in grads]), group)
        offset = 0
        for p in params:
            p.grad = flat[offset:offset + p.numel()].view_as(p).clone()
            offset += p.numel()
        # END ASSIGN5_3_5


def pad_sequence_to_multiple(input_ids: torch.Tensor, attention_mask: torch.Tensor | None, multiple: int,
                             pad_id: int = 0) -> tuple[torch.Tensor, torch.Tensor, int]:
    """Pad (batch, seq) inputs at the end so that seq is a multiple of ``multiple``.

    Returns ``(input_ids, attention_mask, original_seq)``; padded positions have mask 0.
    """
    batch, seq = input_ids.shape
    if attention_mask is None:
        attention_mask = torch.ones_like(input_ids)
    extra = (-seq) % multiple
    if extra:
        input_ids = torch.cat([input_ids, input_ids.new_full((batch, extra), pad_id)], dim=1)
        attention_mask = torch.cat([attention_mask, attention_mask.new_zeros((batch, extra))], dim=1)
    return input_ids, attention_mask, seq
