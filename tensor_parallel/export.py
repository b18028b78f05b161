"""A tensor-parallel GPT-2 put back together as ``transformers``' GPT-2 (for ``--export_hf``).

:class:`tensor_parallel.TensorParallelGPT2` keeps on each of the tp ranks its shards of the single-device
model it was cut from (:mod:`tensor_parallel.gpt2`). :func:`hf_state_dict` undoes the cut: each sharded
weight is all-gathered in the tp group along the dimension it was split on, and laid out as
``GPT2LMHeadModel`` stores it —

* ``c_attn`` (column parallel): rank r holds ``[Q_r; K_r; V_r]`` (its heads' rows of Q, K and V,
  :func:`tensor_parallel.gpt2.reorder_qkv_for_tensor_parallel`); gathered, the rows are regrouped to
  ``[Q; K; V]``;
* ``c_fc`` (column parallel) gathered along the output rows, the two ``c_proj`` (row parallel) along the
  input columns; their biases are either split with the rows (column) or replicated (row);
* every linear weight transposed back from ``nn.Linear``'s (out, in) to GPT-2's ``Conv1D`` (in, out);
* the vocabulary-parallel embedding gathered along the vocabulary and its padding rows dropped; the
  LM head is the same tensor (tied);
* layer norms and the position embedding are replicated: each rank's own copy.

Only ``tp`` blocks compute GPT-2's function; ``spd`` and ``parallel`` blocks
(:mod:`tensor_parallel.block_types`) are other models with the same weights, and are refused.
"""
from __future__ import annotations

import torch

from course.collectives import all_gather, group_size


def _qkv_to_gpt2(weight: torch.Tensor, bias: torch.Tensor, tp: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Gathered ``[Q_0; K_0; V_0; Q_1; ...]`` rows (3 n_embd, n_embd) -> ``[Q; K; V]`` (the inverse of
    :func:`tensor_parallel.gpt2.reorder_qkv_for_tensor_parallel`)."""
    def regroup(t):
        q, k, v = zip(*(chunk.chunk(3, dim=0) for chunk in t.chunk(tp, dim=0)))
        return torch.cat([*q, *k, *v], dim=0)

    return regroup(weight), regroup(bias)


def hf_state_dict(model) -> dict[str, torch.Tensor]:
    """The weights of ``model`` (a :class:`tensor_parallel.TensorParallelGPT2`) as a ``GPT2LMHeadModel``
    state dict of full tensors: ``transformer.wte.weight`` (vocab_size, n_embd), ``transformer.h.<i>.attn.
    c_attn.weight`` (n_embd, 3 n_embd), ..., ``lm_head.weight`` (the tied embedding). Collective: every rank
    of ``model.group`` calls it and gets the same dict.

    Raises:
        ValueError: a block of another type than ``tp`` (its function is not GPT-2's).
    """
    other = sorted(set(model.block_types) - {"tp"})
    if other:
        raise ValueError(f"blocks of type {other} are not GPT-2 blocks (they compute another function with the same "
                         "weights); only a model of tp blocks exports as transformers' GPT-2")
    group, p = model.group, group_size(model.group)

    def rows(t):  # split along dim 0 (column-parallel weights and biases, the vocabulary)
        return all_gather(t.detach(), 0, group=group)

    def cols(t):  # split along dim 1 (row-parallel weights)
        return all_gather(t.detach(), 1, group=group)

    state = {"transformer.wte.weight": rows(model.wte.weight)[: model.vocab_size],
             "transformer.wpe.weight": model.wpe.weight.detach()}
    for i, block in enumerate(model.h):
        h = f"transformer.h.{i}."
        qkv_w, qkv_b = _qkv_to_gpt2(rows(block.attn.c_attn.weight), rows(block.attn.c_attn.bias), p)
        state.update({
            h + "ln_1.weight": block.ln_1.weight.detach(), h + "ln_1.bias": block.ln_1.bias.detach(),
            h + "attn.c_attn.weight": qkv_w.t(), h + "attn.c_attn.bias": qkv_b,
            h + "attn.c_proj.weight": cols(block.attn.c_proj.weight).t(), h + "attn.c_proj.bias":
                block.attn.c_proj.bias.detach(),
            h + "ln_2.weight": block.ln_2.weight.detach(), h + "ln_2.bias": block.ln_2.bias.detach(),
            h + "mlp.c_fc.weight": rows(block.mlp.c_fc.weight).t(), h + "mlp.c_fc.bias": rows(block.mlp.c_fc.bias),
            h + "mlp.c_proj.weight": cols(block.mlp.c_proj.weight).t(), h + "mlp.c_proj.bias":
                block.mlp.c_proj.bias.detach(),
        })
    state["transformer.ln_f.weight"], state["transformer.ln_f.bias"] = model.ln_f.weight.detach(), model.ln_f.bias.detach()
    state["lm_head.weight"] = state["transformer.wte.weight"]
    return {k: v.contiguous() for k, v in state.items()}
