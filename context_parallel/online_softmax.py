"""The online softmax: attention over one block of keys at a time (assignment 5.7.1).

Softmax attention of a query row ``q`` over keys ``k_1 .. k_n`` is ``sum_j p_j v_j`` with
``p_j = exp(s_j - m) / l``, ``s_j = scale q . k_j``, ``m = max_j s_j`` (subtracted so that no
``exp`` overflows) and ``l = sum_j exp(s_j - m)``. The max and the sum need every score, so a
plain implementation holds the whole (seq x seq) score matrix. The online softmax
(Milakov & Gimelshein 2018, Alg. 3) keeps three running statistics per query row instead —
the largest score seen so far ``m``, the sum ``l`` of ``exp(s - m)`` and the accumulator
``acc = sum exp(s - m) v`` — and folds in one block of keys at a time. When a block brings a
larger maximum ``m'``, everything summed so far was relative to the old ``m`` and is rescaled
by ``exp(m - m')``. At the end ``out = acc / l`` and the log-sum-exp ``lse = m + log l``,
which is all the backward pass needs to recompute any block's probabilities
``p = exp(s - lse)`` (Dao et al. 2022, FlashAttention, Alg. 1 and Sec. 3.1).

Shapes: queries ``q`` (batch, heads, q_len, head_dim); keys and values of one block
``k``, ``v`` (batch, heads, block, head_dim); per-row statistics (batch, heads, q_len).
Positions (``q_pos``, ``k_pos``) are 1-D int64 tensors on the CPU: the global position of each
query and key in the sequence, so that the same code masks causally whether the keys are this
rank's own, another rank's (ring attention) or a zig-zag shard's.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class SoftmaxState:
    """Running statistics of the online softmax for queries (batch, heads, q_len).

    Attributes:
        m: (batch, heads, q_len) largest score seen so far (``-inf``: no key yet).
        l: (batch, heads, q_len) sum of ``exp(score - m)`` over the keys seen.
        acc: (batch, heads, q_len, head_dim) sum of ``exp(score - m) * v`` over the keys seen.
    """

    m: torch.Tensor
    l: torch.Tensor
    acc: torch.Tensor

    @classmethod
    def empty(cls, q: torch.Tensor, value_dim: int | None = None) -> "SoftmaxState":
        """No key seen yet, for queries ``q`` (batch, heads, q_len, head_dim); float32 or wider."""
        dtype = torch.promote_types(q.dtype, torch.float32)
        stats = q.shape[:-1]
        return cls(torch.full(stats, float("-inf"), dtype=dtype, device=q.device),
                   torch.zeros(stats, dtype=dtype, device=q.device),
                   torch.zeros(*stats, value_dim or q.size(-1), dtype=dtype, device=q.device))

    def rows(self, start: int, end: int) -> "SoftmaxState":
        """The statistics of query rows ``start .. end - 1`` (views)."""
        return SoftmaxState(self.m[..., start:end], self.l[..., start:end], self.acc[..., start:end, :])

    def write_rows(self, start: int, part: "SoftmaxState") -> None:
        """Put ``part`` (from :meth:`rows`, updated) back at rows ``start ..``."""
        end = start + part.m.size(-1)
        self.m[..., start:end] = part.m
        self.l[..., start:end] = part.l
        self.acc[..., start:end, :] = part.acc


def causal_block(q_pos: torch.Tensor, k_pos: torch.Tensor) -> tuple[bool, torch.Tensor | None]:
    """Causal masking by block: may queries at ``q_pos`` (q_block,) see keys at ``k_pos`` (k_block,)?

    A query at position t sees the keys at positions <= t.

    Returns:
        ``(needed, mask)``: ``needed`` is False when no query of the block sees any of its keys
        (the block is skipped: no work at all); otherwise ``mask`` is None when every query sees
        every key (no mask to apply), or a (q_block, k_block) bool tensor, True where the query
        sees the key.
    """
    # BEGIN ASSIGN5_7_1
    if int(k_pos.min()) > int(q_pos.max()):
        return False, None
    if int(k_pos.max()) <= int(q_pos.min()):
        return True, None
    return True, k_pos[None, :] <= q_pos[:, None]
    # END ASSIGN5_7_1


def online_softmax_update(state: SoftmaxState, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float,
                          mask: torch.Tensor | None = None) -> SoftmaxState:
    """Fold one block of keys ``k`` and values ``v`` (batch, heads, block, head_dim) into the running
    softmax of queries ``q`` (batch, heads, q_len, head_dim) (Milakov & Gimelshein 2018, Alg. 3;
    Dao et al. 2022, Alg. 1, lines 9-12).

    Args:
        state: the statistics so far (:class:`SoftmaxState`, float32 or wider).
        scale: the factor of the scores ``scale * q k^T`` (usually ``head_dim ** -0.5``).
        mask: None (every query sees every key of the block) or a bool tensor broadcastable to
            (q_len, block), True where the query sees the key. A query that sees no key of the
            block keeps its statistics unchanged.

    Returns:
        The new :class:`SoftmaxState` (new tensors; ``state`` is not changed).
    """
    # BEGIN ASSIGN5_7_1
    scores = (q.to(state.acc.dtype) @ k.to(state.acc.dtype).transpose(-2, -1)) * scale
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    m_new = torch.maximum(state.m, scores.amax(dim=-1))
    m_safe = torch.where(torch.isinf(m_new), torch.zeros_like(m_new), m_new)  # rows that have seen no key yet
    p = torch.exp(scores - m_safe[..., None])
    rescale = torch.exp(state.m - m_safe)
    return SoftmaxState(m_new, rescale * state.l + p.sum(dim=-1),
                        rescale[..., None] * state.acc + p @ v.to(state.acc.dtype))
    # END ASSIGN5_7_1


def finish(state: SoftmaxState) -> tuple[torch.Tensor, torch.Tensor]:
    """The attention output and log-sum-exp from the final statistics.

    Returns:
        ``(out, lse)``: ``out = acc / l`` (batch, heads, q_len, head_dim) and ``lse = m + log l``
        (batch, heads, q_len), in the statistics' dtype. A row that saw no key gets ``out = 0``
        and ``lse = -inf``.
    """
    # BEGIN ASSIGN5_7_1
    seen = state.l > 0
    out = state.acc / torch.where(seen, state.l, torch.ones_like(state.l))[..., None]
    lse = torch.where(seen, state.m + torch.log(torch.where(seen, state.l, torch.ones_like(state.l))),
                      torch.full_like(state.l, float("-inf")))
    return out, lse
    # END ASSIGN5_7_1


def block_gradients(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, dout: torch.Tensor, lse: torch.Tensor,
                    delta: torch.Tensor, scale: float,
                    mask: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The gradients one block of keys/values contributes, recomputed from the saved log-sum-exp
    (Dao et al. 2022, Alg. 4 / Dao 2023, FlashAttention-2, Alg. 2).

    The probabilities are recomputed, ``p = exp(scale q k^T - lse)`` (masked entries 0); then
    ``dv = p^T dout``, ``dp = dout v^T``, ``ds = p (dp - delta)``, ``dq = scale ds k`` and
    ``dk = scale ds^T q``, where ``delta = rowsum(dout * out)`` is the same for every block.

    Args:
        q, dout: (batch, heads, q_len, head_dim): queries and the gradient of the output.
        k, v: (batch, heads, block, head_dim).
        lse, delta: (batch, heads, q_len): the final log-sum-exp of each query row (from
            :func:`finish`, over *all* keys) and ``rowsum(dout * out)``.
        mask: as in :func:`online_softmax_update`.

    Returns:
        ``(dq, dk, dv)``: this block's part of the gradient of the queries (add up over blocks),
        and the gradients of ``k`` and ``v`` from these queries; shapes of ``q``, ``k``, ``v``,
        in the dtype of ``lse``.
    """
    # BEGIN ASSIGN5_7_1
    dtype = lse.dtype
    q, k, v, dout = q.to(dtype), k.to(dtype), v.to(dtype), dout.to(dtype)
    scores = (q @ k.transpose(-2, -1)) * scale
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    lse_safe = torch.where(torch.isinf(lse), torch.zeros_like(lse), lse)
    p = torch.exp(scores - lse_safe[..., None])
    dv = p.transpose(-2, -1) @ dout
    ds = p * (dout @ v.transpose(-2, -1) - delta[..., None])
    return (ds @ k) * scale, (ds.transpose(-2, -1) @ q) * scale, dv
    # END ASSIGN5_7_1
