"""Blockwise attention with an online softmax, forward and backward (assignment 5.7.1).

:func:`blockwise_attention` equals ``torch.nn.functional.scaled_dot_product_attention`` (causal or
not) but never holds more than one (block x block) tile of scores: the queries are cut into
blocks of ``block_size`` rows and, for each, the keys and values into blocks of ``block_size``;
each tile is folded into the query block's running softmax
(:func:`context_parallel.online_softmax.online_softmax_update`). With a causal mask a tile whose
keys all come after its queries is skipped, and one whose keys all come before needs no mask
(:func:`context_parallel.online_softmax.causal_block`): about half the tiles are never computed.
Dao et al. 2022 (FlashAttention), Alg. 1, with the loop order of Dao 2023 (FlashAttention-2,
Sec. 3.1: queries outside, keys inside).

**Why a backward of its own** (a ``torch.autograd.Function``) rather than autograd through the
loop: autograd would save every tile's probabilities for the backward pass — the whole
(seq x seq) matrix again, in pieces — and the memory the blocks saved would be spent anyway. The
forward pass keeps only ``q``, ``k``, ``v``, the output and one log-sum-exp per query row
(O(seq) memory); the backward pass recomputes each tile's probabilities from them
(:func:`context_parallel.online_softmax.block_gradients`; FlashAttention Sec. 3.1,
"recomputation"), trading a second matrix product per tile for memory. Ring attention reuses
both loops (:func:`attend_blocks`, :func:`attend_blocks_backward`) on the keys of other ranks.
"""
from __future__ import annotations

import contextlib
from contextvars import ContextVar

import torch

from context_parallel.online_softmax import SoftmaxState, block_gradients, causal_block, finish, online_softmax_update


_OBSERVER: ContextVar = ContextVar("attend_blocks_observer", default=None)


@contextlib.contextmanager
def observed(observer):
    """Within the ``with`` block, every :func:`attend_blocks` and :func:`attend_blocks_backward` call tells
    ``observer`` ``begin()`` before it computes and ``end(tiles, k_pos)`` after (the tiles it computed, the
    positions of its keys): how ring attention times each step of its loop from outside it
    (:mod:`context_parallel.ring_attention`). Outside such a block the calls tell no one."""
    token = _OBSERVER.set(observer)
    try:
        yield observer
    finally:
        _OBSERVER.reset(token)


def _tiles(n: int, block_size: int):
    return [(start, min(start + block_size, n)) for start in range(0, n, block_size)]


def check_qkv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, block_size: int) -> None:
    """Check attention inputs before any work: ``q`` (batch, heads, q_len, head_dim), ``k`` and ``v``
    (batch, heads, k_len, head_dim), ``block_size`` a whole number >= 1.

    Raises:
        ValueError: naming the shapes or the block size that do not fit.
    """
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        raise ValueError(f"q, k, v must be (batch, heads, seq, head_dim), got shapes {tuple(q.shape)}, "
                         f"{tuple(k.shape)}, {tuple(v.shape)}")
    if k.shape[:-1] != v.shape[:-1] or q.shape[:2] != k.shape[:2] or q.size(-1) != k.size(-1):
        raise ValueError(f"q, k, v shapes do not fit: {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}")
    if not isinstance(block_size, int) or block_size < 1:
        raise ValueError(f"block_size must be a whole number >= 1, not {block_size!r}")


def attend_blocks(state: SoftmaxState, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, q_pos: torch.Tensor,
                  k_pos: torch.Tensor, scale: float, block_size: int, causal: bool = True) -> int:
    """Fold keys ``k`` and values ``v`` (batch, heads, k_len, head_dim), at positions ``k_pos``
    (k_len,), into ``state``, the running softmax of queries ``q`` (batch, heads, q_len, head_dim)
    at positions ``q_pos`` (q_len,), tile by tile (``block_size`` queries x ``block_size`` keys).
    ``state`` is updated in place. Returns the number of tiles computed (skipped ones not counted).
    """
    observer = _OBSERVER.get()
    if observer is not None:
        observer.begin()
    computed = 0
    for q0, q1 in _tiles(q.size(-2), block_size):
        rows = state.rows(q0, q1)
        for k0, k1 in _tiles(k.size(-2), block_size):
            needed, mask = causal_block(q_pos[q0:q1], k_pos[k0:k1]) if causal else (True, None)
            if not needed:
                continue
            rows = online_softmax_update(rows, q[..., q0:q1, :], k[..., k0:k1, :], v[..., k0:k1, :], scale,
                                         None if mask is None else mask.to(q.device))
            computed += 1
        state.write_rows(q0, rows)
    if observer is not None:
        observer.end(computed, k_pos)
    return computed


def attend_blocks_backward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, dout: torch.Tensor, lse: torch.Tensor,
                           delta: torch.Tensor, q_pos: torch.Tensor, k_pos: torch.Tensor, scale: float,
                           block_size: int, causal: bool = True):
    """The gradients the keys/values ``k``, ``v`` at ``k_pos`` contribute, tile by tile, for queries
    ``q`` at ``q_pos`` with output gradient ``dout``, final log-sum-exp ``lse`` and
    ``delta = rowsum(dout * out)`` (batch, heads, q_len).

    Returns:
        ``(dq, dk, dv, tiles)``: ``dq`` (shape of ``q``) is these keys' part of the queries' gradient,
        ``dk``, ``dv`` (shapes of ``k``, ``v``) the whole gradient of these keys from these queries
        (dtype of ``lse``), and the number of tiles computed.
    """
    observer = _OBSERVER.get()
    if observer is not None:
        observer.begin()
    dq = torch.zeros(q.shape, dtype=lse.dtype, device=q.device)
    dk = torch.zeros(k.shape, dtype=lse.dtype, device=k.device)
    dv = torch.zeros(v.shape, dtype=lse.dtype, device=v.device)
    computed = 0
    for q0, q1 in _tiles(q.size(-2), block_size):
        for k0, k1 in _tiles(k.size(-2), block_size):
            needed, mask = causal_block(q_pos[q0:q1], k_pos[k0:k1]) if causal else (True, None)
            if not needed:
                continue
            gq, gk, gv = block_gradients(q[..., q0:q1, :], k[..., k0:k1, :], v[..., k0:k1, :], dout[..., q0:q1, :],
                                         lse[..., q0:q1], delta[..., q0:q1], scale,
                                         None if mask is None else mask.to(q.device))
            dq[..., q0:q1, :] += gq
            dk[..., k0:k1, :] += gk
            dv[..., k0:k1, :] += gv
            computed += 1
    if observer is not None:
        observer.end(computed, k_pos)
    return dq, dk, dv, computed


class BlockwiseAttention(torch.autograd.Function):
    """Blockwise attention with its own backward (see the module docstring). Use :func:`blockwise_attention`."""

    @staticmethod
    def forward(ctx, q, k, v, causal: bool, block_size: int, scale: float, stats: dict | None):
        q_pos, k_pos = torch.arange(q.size(-2), device="cpu"), torch.arange(k.size(-2), device="cpu")  # host: positions
        state = SoftmaxState.empty(q, v.size(-1))
        tiles = attend_blocks(state, q, k, v, q_pos, k_pos, scale, block_size, causal)
        out, lse = finish(state)
        out = out.to(q.dtype)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.causal, ctx.block_size, ctx.scale, ctx.stats = causal, block_size, scale, stats
        if stats is not None:
            stats["forward_tiles"] = tiles
        return out

    @staticmethod
    def backward(ctx, dout):
        q, k, v, out, lse = ctx.saved_tensors
        delta = (dout.to(lse.dtype) * out.to(lse.dtype)).sum(dim=-1)
        q_pos, k_pos = torch.arange(q.size(-2), device="cpu"), torch.arange(k.size(-2), device="cpu")
        dq, dk, dv, tiles = attend_blocks_backward(q, k, v, dout, lse, delta, q_pos, k_pos, ctx.scale, ctx.block_size,
                                                   ctx.causal)
        if ctx.stats is not None:
            ctx.stats["backward_tiles"] = tiles
        return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), None, None, None, None


DEFAULT_BLOCK_SIZE = 64  # rows and columns of a tile of scores: the one default of blockwise and ring attention


def blockwise_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool,
                        scale: float | None = None, block_size: int = DEFAULT_BLOCK_SIZE,
                        stats: dict | None = None) -> torch.Tensor:
    """Softmax attention computed tile by tile with an online softmax (Dao et al. 2022, Alg. 1).

    Equals ``torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale)``
    in value and gradient, for any ``block_size`` (also one that does not divide the sequence
    lengths). The arguments after ``q, k, v`` are keywords, in the order every attention function
    of this package takes them (docs/architecture.md, "The parallel functions' API"); this one runs
    on one rank, so it has no ``group`` and no ``layout``.

    Args:
        q: (batch, heads, q_len, head_dim); k: (batch, heads, k_len, head_dim);
            v: (batch, heads, k_len, v_dim) (``v_dim`` may differ from ``head_dim``, as in SDPA).
        causal: required keyword (no default, so no call changes meaning silently; SDPA's
            ``is_causal`` defaults to False). Query i sees keys 0..i: with ``q_len != k_len`` the
            mask is aligned to the top left, as SDPA's ``is_causal`` is (query i sees key j iff j <= i).
        scale: factor of the scores (default ``head_dim ** -0.5``).
        block_size: rows and columns of one tile of scores.
        stats: optional dict that receives ``forward_tiles`` and ``backward_tiles`` (tiles computed).

    Returns:
        (batch, heads, q_len, v_dim), dtype of ``q`` (statistics are kept in float32 or wider).

    Raises:
        ValueError: shapes that are not (batch, heads, seq, head_dim) or do not fit; ``block_size`` < 1.
    """
    check_qkv(q, k, v, block_size)
    scale = q.size(-1) ** -0.5 if scale is None else scale
    return BlockwiseAttention.apply(q, k, v, causal, block_size, scale, stats)
