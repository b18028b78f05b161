"""Ring attention across the cp group, forward and backward (assignment 5.7.2).

Liu, Zaharia & Abbeel 2023 (Ring Attention with Blockwise Transformers for Near-Infinite
Context), Sec. 3 and Alg. 1. Each of the ``p`` ranks of the cp group holds one shard of the
sequence: its queries, keys and values (``layout`` says which positions). Attention needs every
query against every key, so the key/value shards travel around the ring: at step s rank r
computes its queries against the keys/values that started on rank ``r - s`` (mod p), folding
them into its online softmax (:func:`context_parallel.blockwise_attention.attend_blocks`), while
it passes them on to rank ``r + 1`` and receives the next ones from rank ``r - 1``. After p
steps every rank has seen every key; p - 1 transfers overlap with p computations::

    step 0: rank 0 computes with KV0, rank 1 with KV1, ...   and sends its KV to the right
    step 1: rank 0 computes with KV(p-1), rank 1 with KV0, ...
    ...

Overlap: the batch that moves the next block is posted (:func:`course.collectives.start_exchange`)
*before* the current block is computed and waited for *after*, so the transfer runs during the
computation; each step's send and receive are one ``batch_isend_irecv`` (safe under NCCL's rules:
docs/architecture.md, "Point-to-point under NCCL's rules").

The backward pass travels the same ring: the keys/values go round again (recomputing each
tile's probabilities from the saved log-sum-exp), the query gradient accumulates at home, and the
gradient of each key/value block travels *with* the block, each rank adding what its queries
contribute; after the last step one more transfer sends every block's finished gradient to its
home rank (the right neighbour).

With a causal mask the tiles whose keys all come after their queries are skipped; how much each
rank computes then depends on the layout (:mod:`context_parallel.layouts`).
"""
from __future__ import annotations

import contextlib
import time

import torch

from context_parallel.blockwise_attention import (DEFAULT_BLOCK_SIZE, attend_blocks, attend_blocks_backward, check_qkv,
                                                  observed)
from context_parallel.layouts import SequenceLayout, check_layout
from context_parallel.online_softmax import SoftmaxState, finish
from course.collectives import P2P, global_rank, group_rank, group_size, start_exchange
from course.measure import now


class _StepRecorder:
    """Per-step record of one pass, made around the ring's loop rather than inside it: within ``with``, each call of
    :func:`context_parallel.blockwise_attention.attend_blocks` (or its backward) is one step
    (:func:`context_parallel.blockwise_attention.observed`) — which block it took (its home rank, from its keys'
    positions), the tiles computed, the compute span (:func:`course.measure.now`: the wall clock after the device's
    queued work) and the CPU seconds of the computation (``time.thread_time``: on a CPU shared by more ranks than
    cores it is the work done, where the wall clock also counts the waits for a core); the wait after a step lasts
    until the next step begins (or the pass ends). Writes ``stats[name]`` and its totals on leaving; with
    ``stats`` None it records nothing and costs nothing."""

    def __init__(self, stats: dict | None, name: str, device: torch.device, layout: SequenceLayout):
        self.stats, self.name, self.device = stats, name, device
        self.home = {int(layout.positions(r)[0]): r for r in range(layout.cp)} if stats is not None else {}
        self.steps: list[dict] = []
        self._watching = contextlib.nullcontext() if stats is None else observed(self)

    def __enter__(self):
        self._watching.__enter__()
        return self

    def begin(self) -> None:
        self.start, self.cpu_start = now(self.device), time.thread_time()
        if self.steps:
            self.steps[-1]["wait"] = (self.steps[-1]["wait"][0], self.start)

    def end(self, tiles: int, k_pos: torch.Tensor) -> None:
        end = now(self.device)
        self.steps.append({"step": len(self.steps), "src": self.home[int(k_pos[0])], "tiles": tiles,
                           "compute": (self.start, end), "wait": (end, end),
                           "cpu_seconds": time.thread_time() - self.cpu_start})

    def __exit__(self, *exc) -> None:
        self._watching.__exit__(*exc)
        if self.stats is None or exc[0] is not None:
            return
        if self.steps:
            self.steps[-1]["wait"] = (self.steps[-1]["wait"][0], now(self.device))
        self.stats[self.name] = self.steps
        self.stats[f"{self.name}_tiles"] = sum(s["tiles"] for s in self.steps)
        self.stats[f"{self.name}_compute_seconds"] = sum(s["compute"][1] - s["compute"][0] for s in self.steps)
        self.stats[f"{self.name}_wait_seconds"] = sum(s["wait"][1] - s["wait"][0] for s in self.steps)
        self.stats[f"{self.name}_cpu_seconds"] = sum(s["cpu_seconds"] for s in self.steps)


class RingAttention(torch.autograd.Function):
    """Ring attention with its own backward (see the module docstring). Use :func:`ring_attention`."""

    @staticmethod
    def forward(ctx, q, k, v, layout: SequenceLayout, group, causal: bool, block_size: int, scale: float,
                stats: dict | None):
        p, r = group_size(group), group_rank(group)
        right, left = global_rank(group, (r + 1) % p), global_rank(group, (r - 1) % p)
        q_pos = layout.positions(r)
        state = SoftmaxState.empty(q, v.size(-1))
        kv = torch.stack([k, v]).contiguous()  # one message per step: (2, batch, heads, local_len, head_dim)
        with _StepRecorder(stats, "forward", q.device, layout):  # times each attend_blocks call: the loop's steps
            # BEGIN ASSIGN5_7_2
            for step in range(p):
                pending = None
                if step < p - 1:  # post the next transfer before computing on the block we have
                    incoming = torch.empty_like(kv)
                    pending = start_exchange([P2P("send", kv, right), P2P("recv", incoming, left)], group)
                src = (r - step) % p  # the rank this block started on
                attend_blocks(state, q, kv[0], kv[1], q_pos, layout.positions(src), scale, block_size, causal)
                if pending is not None:
                    pending.wait()
                    kv = incoming
            # END ASSIGN5_7_2
        out, lse = finish(state)
        out = out.to(q.dtype)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.layout, ctx.group, ctx.causal, ctx.block_size, ctx.scale, ctx.stats = (layout, group, causal, block_size,
                                                                                  scale, stats)
        return out

    @staticmethod
    def backward(ctx, dout):
        q, k, v, out, lse = ctx.saved_tensors
        layout, group, causal, block_size, scale = ctx.layout, ctx.group, ctx.causal, ctx.block_size, ctx.scale
        p, r = group_size(group), group_rank(group)
        right, left = global_rank(group, (r + 1) % p), global_rank(group, (r - 1) % p)
        q_pos = layout.positions(r)
        delta = (dout.to(lse.dtype) * out.to(lse.dtype)).sum(dim=-1)
        dq = torch.zeros(q.shape, dtype=lse.dtype, device=q.device)
        kv = torch.stack([k, v]).contiguous()
        dkv = None  # the gradient of the block this rank holds, as far as the ranks before it got
        with _StepRecorder(ctx.stats, "backward", q.device, layout):  # times each attend_blocks_backward call
            # BEGIN ASSIGN5_7_2
            pending_dkv = incoming_dkv = None
            for step in range(p):
                pending_kv = None
                if step < p - 1:
                    incoming_kv = torch.empty_like(kv)
                    pending_kv = start_exchange([P2P("send", kv, right), P2P("recv", incoming_kv, left)], group)
                src = (r - step) % p
                gq, gk, gv, _ = attend_blocks_backward(q, kv[0], kv[1], dout, lse, delta, q_pos,
                                                       layout.positions(src), scale, block_size, causal)
                dq += gq
                if pending_dkv is not None:  # the block's gradient so far, from the left
                    pending_dkv.wait()
                    dkv = incoming_dkv
                dkv = torch.stack([gk, gv]) if dkv is None else dkv + torch.stack([gk, gv])
                if p > 1:  # pass it on with the block (after the last step: to the block's home, the right neighbour)
                    incoming_dkv = torch.empty_like(dkv)
                    pending_dkv = start_exchange([P2P("send", dkv, right), P2P("recv", incoming_dkv, left)], group)
                if pending_kv is not None:
                    pending_kv.wait()
                    kv = incoming_kv
            if pending_dkv is not None:
                pending_dkv.wait()
                dkv = incoming_dkv
            # END ASSIGN5_7_2
        dk, dv = dkv[0], dkv[1]
        return (dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), None, None, None, None, None, None)


def ring_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, group=None,
                   layout: SequenceLayout | None = None, causal: bool, scale: float | None = None,
                   block_size: int = DEFAULT_BLOCK_SIZE, stats: dict | None = None) -> torch.Tensor:
    """Attention of this rank's queries over the whole sequence's keys, the keys travelling the ring
    (Liu et al. 2023, Ring Attention, Alg. 1).

    The arguments after ``q, k, v`` are keywords, in the order and with the defaults every attention
    function of this package has (docs/architecture.md, "The parallel functions' API").

    Args:
        q, k, v: (batch, heads, local_len, head_dim): this rank's shard of the queries, keys and
            values, holding the positions ``layout.positions(rank in group)``. The values are as wide
            as the queries (one message carries keys and values together).
        group: the context-parallel group (the ``cp`` group of the run's mesh); None: the world.
        layout: the :class:`context_parallel.layouts.SequenceLayout` of the shards; None: the
            contiguous layout (rank r holds positions ``[r * local_len, (r+1) * local_len)``).
        causal: required keyword (SDPA's ``is_causal`` defaults to False; no default here, so no
            call changes meaning silently): query t sees keys 0..t (by global position).
        scale: factor of the scores (default ``head_dim ** -0.5``).
        block_size: rows and columns of a tile of scores inside a step.
        stats: optional dict that receives, per pass (``forward``, ``backward``), the list of steps
            (block's home rank ``src``, ``tiles`` computed, ``compute`` and ``wait`` spans in
            seconds of ``time.time()``, ``cpu_seconds`` of the computation) and their totals
            (``forward_tiles``, ``forward_compute_seconds``, ``forward_cpu_seconds``, ...).

    Returns:
        (batch, heads, local_len, head_dim): this rank's rows of the attention output; the same as
        :func:`torch.nn.functional.scaled_dot_product_attention` over the whole sequence, sharded
        by ``layout``. Gradients flow to this rank's ``q``, ``k``, ``v``.

    Raises:
        ValueError: shapes that do not fit, values of another width than the queries', or a layout
            for another cp size or shard length.
    """
    check_qkv(q, k, v, block_size)
    if v.size(-1) != q.size(-1):
        raise ValueError(f"ring attention sends keys and values as one message, so v must be as wide as q and k "
                         f"(head_dim {q.size(-1)}), not {v.size(-1)}; use ulysses_attention or blockwise_attention "
                         f"for a different value width")
    p = group_size(group)
    layout = SequenceLayout("contiguous", p, q.size(-2) * p) if layout is None else layout
    check_layout(layout, p, q, k)
    scale = q.size(-1) ** -0.5 if scale is None else scale
    return RingAttention.apply(q, k, v, layout, group, causal, block_size, scale, stats)


def ring_traffic_bytes(batch: int, seq_len: int, hidden: int, cp: int, element_size: int = 4) -> dict[str, float]:
    """Bytes one rank sends per attention layer in :func:`ring_attention` (``hidden = heads * head_dim``).

    Forward: p - 1 key/value blocks of ``2 * batch * seq_len/p * hidden`` elements. Backward: the
    key/value blocks again (p - 1) and the travelling gradient of the keys/values (p transfers: the
    last one home).
    """
    block = 2 * batch * seq_len // cp * hidden * element_size
    return {"forward": float((cp - 1) * block), "backward": float((2 * cp - 1) * block if cp > 1 else 0)}
