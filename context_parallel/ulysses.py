"""Ulysses: all-to-all between sequence and head sharding (assignment 5.7.3).

Jacobs et al. 2023 (DeepSpeed Ulysses: System Optimizations for Enabling Training of Extreme
Long Sequence Transformer Models), Sec. 3.1, Fig. 2. Each of the ``p`` ranks of the cp group
holds a shard of the sequence for every head: q, k, v of shape (batch, heads, seq/p, head_dim).
Attention needs the whole sequence but treats the heads independently, so one all-to-all
re-cuts the tensors the other way — every rank gets the *whole* sequence for ``heads/p`` heads,
(batch, heads/p, seq, head_dim) — attention runs locally with any kernel (here PyTorch's
``scaled_dot_product_attention``), and a second all-to-all turns the output back into a
sequence shard with every head::

    (b, h, s/p, d) --all-to-all: scatter heads, gather sequence--> (b, h/p, s, d)
        --> attention on the whole sequence, h/p heads -->
    (b, h/p, s, d) --all-to-all: scatter sequence, gather heads--> (b, h, s/p, d)

The backward pass of an all-to-all is the all-to-all the other way. Per layer a rank sends
``(p-1)/p`` of four (b, h, s/p, d) tensors forward (q, k, v, out) and four backward; the ring
sends about ``2 (p-1)`` such tensors forward and ``2 (2p-1)`` backward
(:func:`context_parallel.ring_attention.ring_traffic_bytes`): Ulysses moves less as p grows,
but needs ``heads`` divisible by ``p`` and an all-to-all, whose bandwidth falls across nodes.

The shards are in the contiguous layout (rank r holds positions ``[r s/p, (r+1) s/p)``), so the
gathered sequence is in position order. Any other layout works too: the gathered positions are
then the ranks' positions one after another, and the causal mask is built from them.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from context_parallel.blockwise_attention import DEFAULT_BLOCK_SIZE
from context_parallel.layouts import SequenceLayout, check_layout
from context_parallel.rules import check_heads
from course.collectives import all_to_all_single, group_size

HEAD_DIM, SEQ_DIM = 1, 2  # of (batch, heads, seq, head_dim)


def all_to_all(x: torch.Tensor, scatter_dim: int, gather_dim: int, group=None) -> torch.Tensor:
    """Cut ``x`` into p equal chunks along ``scatter_dim``, send chunk j to group rank j, and concatenate the
    chunks received, in group-rank order, along ``gather_dim`` (``scatter_dim`` shrinks p times,
    ``gather_dim`` grows p times). One :func:`course.collectives.all_to_all_single` of the chunks stacked
    on a new first dimension, so it is counted there (kind ``all_to_all``, ``(p-1)/p`` of ``x``'s bytes
    sent). Jacobs et al. 2023, Sec. 3.1.

    Raises:
        ValueError: the size of ``scatter_dim`` is not divisible by the group size.
    """
    p = group_size(group)
    if x.size(scatter_dim) % p:
        raise ValueError(f"all_to_all: size {x.size(scatter_dim)} of dim {scatter_dim} is not divisible by the "
                         f"group size {p}")
    if p == 1:
        return x
    received = all_to_all_single(torch.stack(x.chunk(p, dim=scatter_dim)), group=group)
    return torch.cat(received.unbind(0), dim=gather_dim)


class SequenceToHeads(torch.autograd.Function):
    """(batch, heads, seq/p, head_dim) -> (batch, heads/p, seq, head_dim); backward the other way."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        # BEGIN ASSIGN5_7_3
        return all_to_all(x, scatter_dim=HEAD_DIM, gather_dim=SEQ_DIM, group=group)
        # END ASSIGN5_7_3

    @staticmethod
    def backward(ctx, grad):
        # BEGIN ASSIGN5_7_3
        return all_to_all(grad, scatter_dim=SEQ_DIM, gather_dim=HEAD_DIM, group=ctx.group), None
        # END ASSIGN5_7_3


class HeadsToSequence(torch.autograd.Function):
    """(batch, heads/p, seq, head_dim) -> (batch, heads, seq/p, head_dim); backward the other way."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        # BEGIN ASSIGN5_7_3
        return all_to_all(x, scatter_dim=SEQ_DIM, gather_dim=HEAD_DIM, group=group)
        # END ASSIGN5_7_3

    @staticmethod
    def backward(ctx, grad):
        # BEGIN ASSIGN5_7_3
        return all_to_all(grad, scatter_dim=HEAD_DIM, gather_dim=SEQ_DIM, group=ctx.group), None
        # END ASSIGN5_7_3


def ulysses_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, group=None,
                      layout: SequenceLayout | None = None, causal: bool, scale: float | None = None,
                      block_size: int = DEFAULT_BLOCK_SIZE) -> torch.Tensor:
    """DeepSpeed-Ulysses attention (Jacobs et al. 2023, Sec. 3.1) over the ranks of ``group``.

    The arguments after ``q, k, v`` are keywords, in the order and with the defaults every attention
    function of this package has (docs/architecture.md, "The parallel functions' API").

    Args:
        q, k, v: (batch, heads, seq/p, head_dim): this rank's shard of the sequence, every head
            (``v``'s last dimension may differ from ``head_dim``, as in SDPA).
        group: the context-parallel group (the ``cp`` group of the run's mesh); None: the world.
        layout: the shards' :class:`context_parallel.layouts.SequenceLayout`; None: the contiguous
            layout. A causal mask is built from it: zig-zag shards need ``layout=`` (the shards'
            values cannot tell which positions they hold).
        causal: required keyword (SDPA's ``is_causal`` defaults to False; no default here, so no
            call changes meaning silently): query t sees keys 0..t (by global position).
        scale: factor of the scores (default ``head_dim ** -0.5``).
        block_size: accepted for the common signature and unused: the local attention is PyTorch's
            ``scaled_dot_product_attention``, which picks its own tiles.

    Returns:
        (batch, heads, seq/p, v_dim): this rank's rows of the attention output.

    Raises:
        ValueError: ``heads`` not divisible by the group size (:func:`check_heads`); a layout for
            another cp size or shard length.
    """
    p = group_size(group)
    check_heads(q.size(HEAD_DIM), p)
    if isinstance(layout, SequenceLayout):
        check_layout(layout, p, q, k)
    mask = None
    if causal and layout is not None and layout.kind != "contiguous":
        positions = torch.cat([layout.positions(j) for j in range(p)])  # the gathered order
        if positions.numel() != p * q.size(SEQ_DIM):
            raise ValueError(f"the layout gives {positions.numel()} positions to the {p} ranks, but each rank holds "
                             f"{q.size(SEQ_DIM)}; build the layout for cp = {p} and this sequence length")
        mask = (positions[None, :] <= positions[:, None]).to(q.device)
    is_causal = causal and mask is None
    # BEGIN ASSIGN5_7_3
    q, k, v = (SequenceToHeads.apply(t, group) for t in (q, k, v))
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=is_causal, scale=scale)
    return HeadsToSequence.apply(out, group)
    # END ASSIGN5_7_3


def ulysses_traffic_bytes(batch: int, seq_len: int, hidden: int, cp: int, element_size: int = 4) -> dict[str, float]:
    """Bytes one rank sends per attention layer in :func:`ulysses_attention` (``hidden = heads * head_dim``):
    four all-to-alls of a (batch, heads, seq/p, head_dim) tensor each way, of which ``(p-1)/p`` leaves the rank."""
    one = batch * seq_len // cp * hidden * element_size * (cp - 1) / cp
    return {"forward": 4 * one, "backward": 4 * one}
