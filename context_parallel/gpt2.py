"""A ``transformers`` GPT-2 whose attention runs across the cp group (ring or Ulysses).

Context parallelism shards the *sequence*: every rank of the cp group holds the whole model and
its shard of every sequence's tokens (``layout``). Everything in a transformer block except
attention works token by token — embeddings, layer norms, the MLP, the LM head and the loss —
so it runs on the shard unchanged. Only attention mixes tokens, and only it needs the other
ranks: :func:`use_context_parallel_attention` registers an attention function with
``transformers`` (its ``AttentionInterface``) that runs ring attention
(:func:`context_parallel.ring_attention.ring_attention`) or Ulysses
(:func:`context_parallel.ulysses.ulysses_attention`) when the forward call carries a
:class:`ContextParallelAttention` (``model(..., context_parallel=attention)``), and plain causal
attention on the rank's own tokens otherwise (evaluation and decoding, on whole sentences).

Positions: a shard's tokens get their positions in the whole sequence (``position_ids``, which
packed sequences restart at every pair) for the position embedding, and the loss's targets are
shifted by one over the *whole* sequence before sharding (the token after a shard's last token lives
on another rank): :func:`shard_batch`. The causal mask follows the tokens' places in the sequence
(the layout), not the position ids.

Attention dropout is switched off: the blockwise kernels keep no probability matrix to drop
from (FlashAttention regenerates its dropout mask from a seed; this course's kernels do not).
Embedding and residual dropout still apply. Padding: sequences are right-padded, and under a
causal mask padding at the end changes no real token's output, so no padding mask is applied
(the packed training sequences and :mod:`course.decoding`'s prompts are right-padded).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from context_parallel.layouts import SequenceLayout
from context_parallel.ring_attention import ring_attention
from context_parallel.ulysses import ulysses_attention
from course.collate import IGNORE_INDEX

ATTENTION_NAME = "context_parallel"
METHODS = ("ring", "ulysses")


@dataclass
class ContextParallelAttention:
    """How attention runs across the cp group in one forward pass.

    Attributes:
        method: ``"ring"`` or ``"ulysses"``.
        layout: the :class:`context_parallel.layouts.SequenceLayout` of the shards.
        group: the cp group (the run's ``mesh.cp_group``; None: the world).
        block_size: tile size of ring attention's blockwise kernel.
        stats: one dict per attention layer call is appended here (ring: steps, tiles, seconds).
    """

    method: str
    layout: SequenceLayout
    group: object = None
    block_size: int = 128
    stats: list = field(default_factory=list)

    def __post_init__(self):
        if self.method not in METHODS:
            raise ValueError(f"unknown context-parallel attention {self.method!r}; choose one of {METHODS}")

    def __call__(self, q, k, v, scale: float) -> torch.Tensor:
        """(batch, heads, local_len, head_dim) shards -> this rank's output rows, same shape."""
        if self.method == "ring":
            stats: dict = {}
            self.stats.append(stats)
            return ring_attention(q, k, v, group=self.group, layout=self.layout, causal=True, scale=scale,
                                  block_size=self.block_size, stats=stats)
        return ulysses_attention(q, k, v, group=self.group, layout=self.layout, causal=True, scale=scale)


def _attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, context_parallel=None, **kwargs):
    """The function ``transformers`` calls for attention: (batch, heads, seq, head_dim) q/k/v ->
    (batch, seq, heads, head_dim) output and no attention weights."""
    if dropout:
        raise ValueError("context-parallel attention has no attention dropout; build the model with "
                         "use_context_parallel_attention, which switches it off")
    if context_parallel is None:  # one rank, whole (right-padded) sequences: plain causal attention
        out = F.scaled_dot_product_attention(query, key, value, is_causal=True, scale=scaling)
    else:
        out = context_parallel(query, key, value, scaling)
    return out.transpose(1, 2).contiguous(), None


def _no_mask(*args, **kwargs):
    return None  # attention is causal by position; right padding needs no mask (module docstring)


def use_context_parallel_attention(model):
    """Make a ``transformers`` GPT-2 (``GPT2LMHeadModel``) run its attention through this module:
    registers the attention function, selects it in the model's config and switches attention
    dropout off. Returns the model (changed in place)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    AttentionInterface.register(ATTENTION_NAME, _attention)
    AttentionMaskInterface.register(ATTENTION_NAME, _no_mask)
    model.config._attn_implementation = ATTENTION_NAME
    model.config.attn_pdrop = 0.0
    for block in model.transformer.h:
        block.attn.attn_dropout.p = 0.0
    return model


def shift_targets(labels: torch.Tensor) -> torch.Tensor:
    """(batch, seq) labels -> (batch, seq) targets: position t is scored on token t+1 (``labels[:, t+1]``),
    the last position on nothing (-100). Shifted over the whole sequence, before sharding."""
    targets = torch.full_like(labels, IGNORE_INDEX)
    targets[:, :-1] = labels[:, 1:]
    return targets


def shard_batch(batch: dict, layout: SequenceLayout, cp_rank: int) -> dict:
    """This rank's shard of a (batch, seq_len) batch: ``input_ids``, ``position_ids`` (the batch's own, e.g.
    restarting at every packed pair, else the global positions 0..seq_len-1) and ``targets``
    (:func:`shift_targets`), each (batch, seq_len / cp). The causal mask does not use ``position_ids``: it
    follows the tokens' places in the sequence (``layout``)."""
    ids = batch["input_ids"]
    positions = batch.get("position_ids")
    if positions is None:
        positions = torch.arange(ids.size(1), device=ids.device)[None, :].expand_as(ids)
    return {"input_ids": layout.shard(ids, 1, cp_rank), "position_ids": layout.shard(positions, 1, cp_rank),
            "targets": layout.shard(shift_targets(batch["labels"]), 1, cp_rank)}


def shard_loss_sum(model, shard: dict, attention: ContextParallelAttention | None) -> tuple[torch.Tensor, int]:
    """Summed next-token cross-entropy (nats) over this shard's targets, and how many targets it has.

    The mean over a whole batch is the sum of every shard's sum over the batch's target count
    (:func:`course.loss.lm_loss` of the unsharded batch)."""
    logits = model(input_ids=shard["input_ids"], position_ids=shard["position_ids"], use_cache=False,
                   context_parallel=attention).logits
    targets = shard["targets"]
    loss = F.cross_entropy(logits.reshape(-1, logits.size(-1)).float(), targets.reshape(-1),
                           ignore_index=IGNORE_INDEX, reduction="sum")
    return loss, int((targets != IGNORE_INDEX).sum())
