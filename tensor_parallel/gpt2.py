"""Tensor-parallel GPT-2 built from a ``transformers`` GPT2LMHeadModel (Shoeybi et al. 2019, Sec. 3).

The split, for ``tp = p`` ranks (rank r):

* **Attention** by heads: rank r keeps heads ``[r * n_head/p, (r + 1) * n_head/p)``. GPT-2
  fuses Q, K and V in one ``c_attn`` whose output is ``[Q | K | V]``, each ``n_embd`` wide,
  so rank r's part of ``c_attn`` is *three* slices — its columns of Q, of K and of V — not
  one contiguous chunk (:func:`reorder_qkv_for_tensor_parallel`). ``c_attn`` is column
  parallel, ``c_proj`` row parallel: 1 all-reduce forward (``g``), 1 backward (``f``).
* **MLP** column then row: ``c_fc`` column parallel, GeLU on the local slice, ``c_proj`` row
  parallel: again 1 all-reduce forward and 1 backward.
* **Embeddings**: the token embedding, tied to the output layer, is vocabulary parallel
  (:mod:`tensor_parallel.vocab`); position embeddings and layer norms are replicated.

GPT-2 stores its linear layers as ``transformers.pytorch_utils.Conv1D`` with weight
(in, out) and ``y = x W + b``; ``nn.Linear``'s layout is (out, in), so weights are
transposed when they are cut into shards.

With ``dropout=0`` (and eager attention, as :func:`course.model.build_gpt2` sets) the
tensor-parallel model's logits, loss and gradients equal the single-device model's up to
float32 rounding. Dropout on replicated tensors draws from each rank's default generator;
the ranks are seeded alike, so the masks agree (they must, or the replicas would diverge).
"""
from __future__ import annotations

import copy
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from tensor_parallel.block_types import BlockBase, ParallelBlock, SyncPointDropBlock, block_runs, run_parallel_blocks
from course.collectives import group_size, mark_backward, region
from tensor_parallel.layers import ColumnParallelLinear, RowParallelLinear, divide
from tensor_parallel.rules import validate_tp_config
from tensor_parallel.mappings import (copy_to_tensor_parallel_region, gather_from_sequence_parallel_region,
                                      gather_from_tensor_parallel_region, scatter_to_sequence_parallel_region)
from tensor_parallel.sequence_parallel import pad_sequence_to_multiple, sync_partial_grads
from tensor_parallel.vocab import VocabParallelEmbedding, vocab_parallel_lm_loss


def reorder_qkv_for_tensor_parallel(weight: torch.Tensor, bias: torch.Tensor, tp: int):
    """Reorder GPT-2's fused Q/K/V projection so that contiguous chunk r holds rank r's heads.

    Args:
        weight: (3 * n_embd, in_features) in ``nn.Linear`` layout, rows ``[Q; K; V]`` (``c_attn.weight.t()``).
        bias: (3 * n_embd,), ``[b_Q; b_K; b_V]``.

    Returns:
        ``(weight, bias)`` of the same shapes with rows ordered
        ``[Q_0; K_0; V_0; Q_1; K_1; V_1; ...]``, where ``Q_r`` are the ``n_embd / tp``
        rows of Q that belong to rank r's heads (likewise K, V). Chunk r of
        ``tp`` equal chunks is then rank r's ``[Q_r; K_r; V_r]``.
    """
    n_embd = weight.size(0) // 3
    divide(n_embd, tp, "n_embd")
    # BEGIN ASSIGN5_3_4
    q, k, v = weight.split(n_embd, dim=0)
    bq, bk, bv = bias.split(n_embd, dim=0)
    w_parts = [torch.cat(parts, dim=0) for parts in zip(q.chunk(tp), k.chunk(tp), v.chunk(tp))]
    b_parts = [torch.cat(parts, dim=0) for parts in zip(bq.chunk(tp), bk.chunk(tp), bv.chunk(tp))]
    return torch.cat(w_parts, dim=0), torch.cat(b_parts, dim=0)
    # END ASSIGN5_3_4


def attention_bias(attention_mask: torch.Tensor | None, batch: int, seq: int, dtype, device) -> torch.Tensor:
    """Additive attention bias (batch, 1, seq, seq): 0 where query t may attend key s
    (s <= t and key s not padding), the dtype's minimum elsewhere — as GPT-2's eager attention."""
    allowed = torch.ones(seq, seq, dtype=torch.bool, device=device).tril()[None, None]
    if attention_mask is not None:
        allowed = allowed & attention_mask[:, None, None, :].bool()
    bias = torch.zeros(allowed.shape, dtype=dtype, device=device)
    return bias.masked_fill(~allowed, torch.finfo(dtype).min).expand(batch, 1, seq, seq)


class TensorParallelAttention(nn.Module):
    """GPT-2 self-attention with this rank's ``n_head / tp`` heads.

    Shapes: (batch, seq, n_embd) -> (batch, seq, n_embd), same on every rank (sequence
    parallel: (batch, seq / tp, n_embd) in and out). ``attn_bias``: see :func:`attention_bias`.
    ``group``: the tensor-parallel process group (None: the world).
    """

    def __init__(self, hf_attn, sequence_parallel: bool = False, group=None):
        super().__init__()
        p = group_size(group)
        n_embd, n_head = hf_attn.embed_dim, hf_attn.num_heads
        self.local_heads = divide(n_head, p, "n_head")
        self.head_dim = hf_attn.head_dim
        self.scaling = hf_attn.scaling
        w, b = reorder_qkv_for_tensor_parallel(hf_attn.c_attn.weight.detach().t(), hf_attn.c_attn.bias.detach(), p)
        self.c_attn = ColumnParallelLinear(n_embd, 3 * n_embd, master_weight=w, master_bias=b,
                                           sequence_parallel=sequence_parallel, group=group)
        self.c_proj = RowParallelLinear(n_embd, n_embd, master_weight=hf_attn.c_proj.weight.detach().t(),
                                        master_bias=hf_attn.c_proj.bias.detach(), input_is_parallel=True,
                                        sequence_parallel=sequence_parallel, group=group)
        self.attn_dropout = nn.Dropout(hf_attn.attn_dropout.p)
        self.resid_dropout = nn.Dropout(hf_attn.resid_dropout.p)

    def attend(self, qkv: torch.Tensor, attn_bias: torch.Tensor) -> torch.Tensor:
        """This rank's heads: qkv (batch, seq, 3 * n_embd / p) as ``[Q_r | K_r | V_r]`` -> (batch, seq, n_embd / p)."""
        batch, seq, _ = qkv.shape
        # BEGIN ASSIGN5_3_4
        q, k, v = qkv.split(self.local_heads * self.head_dim, dim=-1)
        q, k, v = (t.view(batch, seq, self.local_heads, self.head_dim).transpose(1, 2) for t in (q, k, v))
        scores = torch.matmul(q, k.transpose(-1, -2)) * self.scaling + attn_bias
        probs = self.attn_dropout(torch.softmax(scores, dim=-1))
        return torch.matmul(probs, v).transpose(1, 2).reshape(batch, seq, -1)
        # END ASSIGN5_3_4

    def forward(self, h: torch.Tensor, attn_bias: torch.Tensor) -> torch.Tensor:
        return self.resid_dropout(self.c_proj(self.attend(self.c_attn(h), attn_bias)))

    def partial(self, h: torch.Tensor, attn_bias: torch.Tensor) -> torch.Tensor:
        """This rank's partial sum of the output, no bias, no communication (for ``spd``/``parallel``)."""
        return self.c_proj.local(self.attend(self.c_attn.local(h), attn_bias))


class TensorParallelMLP(nn.Module):
    """GPT-2 MLP, ``c_fc`` column parallel and ``c_proj`` row parallel over ``group``:
    (batch, seq, n_embd) -> same."""

    def __init__(self, hf_mlp, sequence_parallel: bool = False, group=None):
        super().__init__()
        inner, n_embd = hf_mlp.c_fc.weight.shape[1], hf_mlp.c_fc.weight.shape[0]
        self.c_fc = ColumnParallelLinear(n_embd, inner, master_weight=hf_mlp.c_fc.weight.detach().t(),
                                         master_bias=hf_mlp.c_fc.bias.detach(), sequence_parallel=sequence_parallel,
                                         group=group)
        self.c_proj = RowParallelLinear(inner, n_embd, master_weight=hf_mlp.c_proj.weight.detach().t(),
                                        master_bias=hf_mlp.c_proj.bias.detach(), input_is_parallel=True,
                                        sequence_parallel=sequence_parallel, group=group)
        self.act = hf_mlp.act
        self.dropout = nn.Dropout(hf_mlp.dropout.p)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        # BEGIN ASSIGN5_3_4
        return self.dropout(self.c_proj(self.act(self.c_fc(h))))
        # END ASSIGN5_3_4

    def partial(self, h: torch.Tensor) -> torch.Tensor:
        """This rank's partial sum of the output, no bias, no communication (for ``spd``/``parallel``)."""
        return self.c_proj.local(self.act(self.c_fc.local(h)))


class TensorParallelBlock(BlockBase):
    """``tp``: the exact GPT-2 block, 2 all-reduces forward (``g`` after attention and MLP), 2 backward."""

    block_type = "tp"

    def forward(self, x: torch.Tensor, attn_bias: torch.Tensor) -> torch.Tensor:
        # BEGIN ASSIGN5_3_4
        x = x + self.attn(self.ln_1(x), attn_bias)
        return x + self.mlp(self.ln_2(x))
        # END ASSIGN5_3_4


BLOCK_CLASSES = {"tp": TensorParallelBlock, "spd": SyncPointDropBlock, "parallel": ParallelBlock}


@dataclass
class TensorParallelOutput:
    """``logits``: (batch, seq, padded_vocab / tp), this rank's vocabulary slice; ``loss``: scalar or None."""

    logits: torch.Tensor
    loss: torch.Tensor | None = None


class TensorParallelGPT2(nn.Module):
    """GPT-2 split over the ranks of a tensor-parallel process group (``tp`` = its size).

    Built on every rank from the same ``transformers.GPT2LMHeadModel`` (same seed), of
    which each rank keeps its shards. ``forward(input_ids, attention_mask=None,
    labels=None)`` takes (batch, seq) tensors, the same on every rank, and returns a
    :class:`TensorParallelOutput`; :meth:`gather_logits` makes the full (batch, seq,
    vocab_size) logits. After ``loss.backward()`` call :meth:`sync_grads` (it all-reduces
    the gradients of replicated parameters that saw only part of the work; a no-op for
    plain ``tp``).

    Args:
        hf_model: the single-device model (eager attention).
        block_types: one of ``tp``/``spd``/``parallel`` per layer (see
            :mod:`tensor_parallel.block_types`); None: all ``tp``.
        sequence_parallel: Korthikanti et al. 2022 sequence parallelism.
        group: the tensor-parallel process group (the ``tp`` group of the run's mesh; None:
            the whole world). Every collective of the model runs in it.

    Raises:
        ValueError: ``n_head`` or the MLP width not divisible by ``tp``; bad ``block_types``.
    """

    def __init__(self, hf_model, block_types=None, sequence_parallel: bool = False, group=None):
        super().__init__()
        config = hf_model.config
        self.group = group
        p = group_size(group)
        self.block_types = validate_tp_config(config, p, block_types)
        self.tp, self.sequence_parallel = p, sequence_parallel
        self.vocab_size = config.vocab_size
        self.padded_vocab_size = -(-config.vocab_size // p) * p  # rows added so that ranks split evenly
        tr = hf_model.transformer
        wte = tr.wte.weight.detach()
        if self.padded_vocab_size > self.vocab_size:
            wte = torch.cat([wte, wte.new_zeros(self.padded_vocab_size - self.vocab_size, wte.size(1))])
        self.wte = VocabParallelEmbedding(self.padded_vocab_size, config.n_embd, master_weight=wte, group=group)
        self.wpe = copy.deepcopy(tr.wpe)
        self.drop = nn.Dropout(tr.drop.p)
        self.h = nn.ModuleList(
            BLOCK_CLASSES[kind](copy.deepcopy(block.ln_1), TensorParallelAttention(block.attn, sequence_parallel, group),
                                copy.deepcopy(block.ln_2), TensorParallelMLP(block.mlp, sequence_parallel, group),
                                sequence_parallel, group)
            for kind, block in zip(self.block_types, tr.h))
        self.ln_f = copy.deepcopy(tr.ln_f)
        self.runs = block_runs(self.block_types)

    def _blocks(self, x: torch.Tensor, attn_bias: torch.Tensor) -> torch.Tensor:
        for start, end in self.runs:
            if self.block_types[start] == "parallel":
                x = run_parallel_blocks(list(self.h[start:end]), x, attn_bias, self.sequence_parallel, self.group)
            else:
                x = self.h[start](x, attn_bias)
        return x

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                labels: torch.Tensor | None = None) -> TensorParallelOutput:
        seq = input_ids.size(1)
        if self.sequence_parallel:
            input_ids, attention_mask, seq = pad_sequence_to_multiple(input_ids, attention_mask, self.tp)
        batch, padded_seq = input_ids.shape
        positions = torch.arange(padded_seq, device=input_ids.device)[None]
        with region("embedding"):
            h = self.wte(input_ids) + self.wpe(positions)
            if self.sequence_parallel:
                # BEGIN ASSIGN5_3_5
                h = scatter_to_sequence_parallel_region(h, self.group)
                # END ASSIGN5_3_5
            h = self.drop(h)
        h = mark_backward(h, "embedding")
        bias = attention_bias(attention_mask, batch, padded_seq, h.dtype, h.device)
        with region("blocks"):
            h = self._blocks(h, bias)
        h = mark_backward(h, "blocks")
        with region("head"):
            h = self.ln_f(h)
            if self.sequence_parallel:
                # BEGIN ASSIGN5_3_5
                h = gather_from_sequence_parallel_region(h, self.group)
                # END ASSIGN5_3_5
            else:
                # BEGIN ASSIGN5_3_4
                h = copy_to_tensor_parallel_region(h, self.group)
                # END ASSIGN5_3_4
            logits = F.linear(h, self.wte.weight)[:, :seq]
            if self.padded_vocab_size > self.vocab_size:  # padding rows never win the softmax
                ids = torch.arange(self.wte.vocab_start, self.wte.vocab_end, device=logits.device)
                logits = logits.masked_fill(ids >= self.vocab_size, torch.finfo(logits.dtype).min)
            loss = None
            if labels is not None:
                loss = mark_backward(vocab_parallel_lm_loss(logits, labels, group=self.group), "head")
        return TensorParallelOutput(logits, loss)

    def gather_logits(self, logits: torch.Tensor) -> torch.Tensor:
        """(batch, seq, padded_vocab / tp) -> (batch, seq, vocab_size), the same on every rank."""
        return gather_from_tensor_parallel_region(logits, self.group)[..., : self.vocab_size]

    def partial_grad_params(self) -> list[nn.Parameter]:
        """Replicated parameters whose per-rank gradient is a partial sum (see :meth:`sync_grads`)."""
        params = [p for block in self.h for p in block.partial_grad_params()]
        if self.sequence_parallel:
            params += list(self.ln_f.parameters())
        return params

    def sync_grads(self, *_ignored) -> None:
        """All-reduce the partial gradients (one call; usable as ``train_epoch(after_backward=...)``)."""
        sync_partial_grads(self.partial_grad_params(), self.group)
