"""Vocabulary-parallel embedding and cross-entropy (Shoeybi et al. 2019, Megatron-LM, Sec. 3).

GPT-2's embedding matrix E (vocab_size, hidden) is the largest weight of a small model,
and it is tied to the output layer (logits = h E^T). Megatron splits E by rows, i.e. by
vocabulary range: rank r owns token ids ``[r * V/p, (r + 1) * V/p)``.

* **Embedding**: each rank looks up the ids in its range and writes zeros for the others;
  an all-reduce (``g``) adds the p partial results, so every rank gets every row.
* **Output layer and loss**: each rank computes logits for its own range only, (..., V/p).
  Gathering (batch x seq x V) logits would be expensive; instead the cross-entropy is
  computed from three all-reduces of (batch x seq) scalars — the global maximum (for a
  numerically stable softmax), the target's logit (only the rank that owns the target has
  it) and the sum of exponentials. The backward pass needs no communication: each rank's
  gradient is ``softmax - one_hot(target)`` restricted to its own range.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from course.collectives import all_reduce, all_reduce_max, group_rank, group_size
from tensor_parallel.layers import divide
from tensor_parallel.mappings import reduce_from_tensor_parallel_region

IGNORE_INDEX = -100


def vocab_range(vocab_size: int, rank: int, tp: int) -> tuple[int, int]:
    """``[start, end)`` of the token ids rank ``rank`` owns (equal ranges; ValueError if uneven)."""
    per_rank = divide(vocab_size, tp, "vocab_size")
    return rank * per_rank, (rank + 1) * per_rank


class VocabParallelEmbedding(nn.Module):
    """Embedding whose rows are split by vocabulary range over the ranks.

    Shapes: ``input_ids`` (...) of token ids in ``[0, num_embeddings)``, the same on every
    rank -> (..., embedding_dim), the same on every rank. Parameter on rank r: ``weight``
    (num_embeddings / tp, embedding_dim), rows ``[vocab_start, vocab_end)`` of the master.

    Args:
        master_weight: the dense (num_embeddings, embedding_dim) weight to cut from; drawn
            from N(0, 0.02) with ``seed`` if None (GPT-2's initialisation).
        group: the tensor-parallel process group (None: the world); rank r is the rank in it.

    Raises:
        ValueError: ``num_embeddings`` not divisible by ``tp``; master shape wrong.
    """

    def __init__(self, num_embeddings: int, embedding_dim: int, master_weight: torch.Tensor | None = None,
                 seed: int = 0, group=None):
        super().__init__()
        self.group = group
        self.num_embeddings, self.embedding_dim = num_embeddings, embedding_dim
        self.vocab_start, self.vocab_end = vocab_range(num_embeddings, group_rank(group), group_size(group))
        if master_weight is None:
            gen = torch.Generator().manual_seed(seed)
            master_weight = torch.empty(num_embeddings, embedding_dim, device="cpu").normal_(0.0, 0.02, generator=gen)
        if tuple(master_weight.shape) != (num_embeddings, embedding_dim):
            raise ValueError(f"master_weight has shape {tuple(master_weight.shape)}, "
                             f"expected {(num_embeddings, embedding_dim)}")
        self.weight = nn.Parameter(master_weight[self.vocab_start:self.vocab_end].detach().clone())

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        # BEGIN ASSIGN5_3_3
        outside = (input_ids < self.vocab_start) | (input_ids >= self.vocab_end)
        local_ids = (input_ids - self.vocab_start).masked_fill(outside, 0)
        partial = F.embedding(local_ids, self.weight).masked_fill(outside.unsqueeze(-1), 0.0)
        return reduce_from_tensor_parallel_region(partial, self.group)
        # END ASSIGN5_3_3

    def extra_repr(self) -> str:
        return (f"{self.num_embeddings}, {self.embedding_dim}, "
                f"rows [{self.vocab_start}, {self.vocab_end}) on this rank")


class VocabParallelCrossEntropy(torch.autograd.Function):
    """Cross-entropy over vocabulary-sharded logits; see :func:`vocab_parallel_cross_entropy`."""

    @staticmethod
    def forward(ctx, logits, target, ignore_index, group):
        # logits: (N, V/p) this rank's vocabulary range; target: (N,) global token ids.
        vocab_start = group_rank(group) * logits.size(-1)
        ctx.dtype = logits.dtype
        logits = logits if logits.dtype == torch.float64 else logits.float()  # float64 stays exact (tests at 1e-10)
        valid = target != ignore_index
        # BEGIN ASSIGN5_3_3
        global_max = all_reduce_max(logits.max(dim=-1).values, group)
        shifted = logits - global_max.unsqueeze(-1)
        local_target = target - vocab_start
        outside = (local_target < 0) | (local_target >= logits.size(-1))
        local_target = local_target.masked_fill(outside, 0)
        target_logit = shifted.gather(-1, local_target.unsqueeze(-1)).squeeze(-1).masked_fill(outside, 0.0)
        target_logit = all_reduce(target_logit, group)
        exp = shifted.exp()
        sum_exp = all_reduce(exp.sum(dim=-1), group)
        loss = (sum_exp.log() - target_logit).masked_fill(~valid, 0.0)
        ctx.save_for_backward(exp / sum_exp.unsqueeze(-1), local_target, outside, valid)
        # END ASSIGN5_3_3
        return loss

    @staticmethod
    def backward(ctx, grad_loss):
        # BEGIN ASSIGN5_3_3
        softmax, local_target, outside, valid = ctx.saved_tensors
        grad = softmax.clone()
        grad.scatter_add_(-1, local_target.unsqueeze(-1), -(~outside).to(grad.dtype).unsqueeze(-1))
        grad = grad * (grad_loss * valid).unsqueeze(-1)
        # END ASSIGN5_3_3
        return grad.to(ctx.dtype), None, None, None


def vocab_parallel_cross_entropy(logits: torch.Tensor, target: torch.Tensor,
                                 ignore_index: int = IGNORE_INDEX, group=None) -> torch.Tensor:
    """Per-token cross-entropy (nats) from this rank's slice of the logits.

    Args:
        logits: (..., vocab_size / tp), rank r's columns ``[r * V/p, (r+1) * V/p)``.
        target: (...) token ids in ``[0, vocab_size)``, or ``ignore_index``; same on every rank.
        group: the tensor-parallel process group (None: the world).

    Returns:
        (...) float32 losses (float64 for float64 logits), ``logsumexp(all logits) - logit[target]``, 0 where ignored;
        the same on every rank. Its backward needs no communication.

    Source: Shoeybi et al. 2019, Megatron-LM, Sec. 3 (parallel output embedding + loss fusion).
    """
    shape = target.shape
    loss = VocabParallelCrossEntropy.apply(logits.reshape(-1, logits.size(-1)), target.reshape(-1), ignore_index,
                                           group)
    return loss.view(shape)


def vocab_parallel_lm_loss(logits: torch.Tensor, labels: torch.Tensor, reduction: str = "mean",
                           group=None) -> torch.Tensor:
    """:func:`course.loss.lm_loss` on vocabulary-sharded logits.

    Next-token cross-entropy: position t's logits score label t+1; positions whose label is
    -100 (source, ``<eos_src>``, padding) are not counted.

    Args:
        logits: (batch, seq, vocab_size / tp); labels: (batch, seq).
        reduction: ``mean`` over counted tokens (0 if there are none) or ``sum``.
        group: the tensor-parallel process group (None: the world).
    """
    per_token = vocab_parallel_cross_entropy(logits[:, :-1], labels[:, 1:], group=group)
    total = per_token.sum()
    if reduction == "sum":
        return total
    return total / (labels[:, 1:] != IGNORE_INDEX).sum().clamp_min(1)
