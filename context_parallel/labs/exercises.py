"""The exercises at the end of notebooks/07_context_parallelism.ipynb, and checks that say right or not yet.

Each ``check_*`` prints whether the answer is right (and, if not, a hint, never the answer) through the course's
one answer check (:func:`course.exercise_checks.report`) and returns True or False.
"""
from __future__ import annotations

import math
from functools import partial

from course.exercise_checks import report

_report = partial(report, rel=1e-6)

# Exercise 1: the online softmax by hand.
EXERCISE_1_BLOCKS = ([2.0, 5.0], [1.0, 7.0])  # scores of one query, two blocks of two keys


def check_online_softmax(m: float, l: float) -> bool:
    """Exercise 1: the running max ``m`` and running sum ``l`` after both blocks of ``EXERCISE_1_BLOCKS``
    (``l`` is the sum of ``exp(score - m)`` over the four keys)."""
    scores = [s for block in EXERCISE_1_BLOCKS for s in block]
    want_m = max(scores)
    want_l = sum(math.exp(s - want_m) for s in scores)
    first_only = sum(math.exp(s - max(EXERCISE_1_BLOCKS[0])) for s in EXERCISE_1_BLOCKS[0])
    not_rescaled = first_only + sum(math.exp(s - want_m) for s in EXERCISE_1_BLOCKS[1])
    hint = ("it looks like the first block's sum was not rescaled by exp(m_old - m_new)"
            if isinstance(l, (int, float)) and math.isclose(l, not_rescaled, rel_tol=1e-4)
            else "add exp(score - m) over all four scores, with the final m")
    ok_m = _report("running max m", m, want_m, "it is the largest score seen so far, over both blocks")
    ok_l = _report("running sum l", l, want_l, hint, rel=1e-4)
    return ok_m and ok_l


# Exercise 2: causal work per rank, in chunk pairs.


def causal_chunk_pairs(layout: str, cp: int, rank: int) -> int:
    """(query chunk, key chunk) pairs rank ``rank`` computes under a causal mask, with the sequence cut
    into ``2 cp`` equal chunks (contiguous: rank r holds chunks 2r and 2r+1; zig-zag: r and 2cp-1-r)."""
    chunks = [2 * rank, 2 * rank + 1] if layout == "contiguous" else [rank, 2 * cp - 1 - rank]
    return sum(c + 1 for c in chunks)  # query chunk c sees key chunks 0..c


def check_causal_work(cp: int, busiest_contiguous: int, busiest_zigzag: int) -> bool:
    """Exercise 2: the chunk pairs the *busiest* rank computes with the contiguous and with the zig-zag layout."""
    want_c = max(causal_chunk_pairs("contiguous", cp, r) for r in range(cp))
    want_z = max(causal_chunk_pairs("zigzag", cp, r) for r in range(cp))
    ok_c = _report("busiest rank's chunk pairs, contiguous", busiest_contiguous, want_c,
                   "the busiest rank holds the last two chunks; chunk c sees c + 1 chunks", rel=0)
    ok_z = _report("busiest rank's chunk pairs, zig-zag", busiest_zigzag, want_z,
                   "every rank holds one chunk from the front and one from the back", rel=0)
    return ok_c and ok_z


# Exercise 3: communication volume per layer.


def check_traffic(batch: int, seq: int, hidden: int, cp: int, ring_mb: float, ulysses_mb: float,
                  element_size: int = 2) -> bool:
    """Exercise 3: MB (1e6 bytes) one rank sends per attention layer in the **forward** pass, ring vs Ulysses,
    for (batch, seq, hidden = heads x head_dim), cp ranks and ``element_size`` bytes per number (bf16: 2)."""
    from context_parallel.ring_attention import ring_traffic_bytes
    from context_parallel.ulysses import ulysses_traffic_bytes

    want_r = ring_traffic_bytes(batch, seq, hidden, cp, element_size)["forward"] / 1e6
    want_u = ulysses_traffic_bytes(batch, seq, hidden, cp, element_size)["forward"] / 1e6
    ok_r = _report("ring, MB sent in the forward pass", ring_mb, want_r,
                   "each step but the last sends one K and one V block of batch x seq/cp x hidden", rel=0.01)
    ok_u = _report("Ulysses, MB sent in the forward pass", ulysses_mb, want_u,
                   "four all-to-alls (q, k, v, out) of one shard each; a rank keeps 1/cp of each", rel=0.01)
    return ok_r and ok_u


# Exercise 4: when does the ring hide its transfers?


def check_overlap_length(tokens_per_rank: float, flops_per_s: float = 312e12, bytes_per_s: float = 50e9) -> bool:
    """Exercise 4: the smallest ``seq / cp`` (tokens per rank) for which one ring step's attention compute (forward:
    ``4 b (s/cp)^2 h`` FLOPs for ``Q K^T`` and ``P V``) takes as long as sending its K and V blocks
    (``2 b (s/cp) h`` numbers of 2 bytes) — Liu et al. 2023, Sec. 3: the block must be at least
    ``flops / bandwidth`` long."""
    want = flops_per_s / bytes_per_s  # 4 b n^2 h / F = 4 b n h / B  =>  n = F / B
    return _report("tokens per rank where a ring step's compute equals its transfer", tokens_per_rank, want,
                   "set compute time = transfer time for one step and solve for s/cp (batch and h cancel)", rel=0.05)


# Exercise 5: striped attention's balance.


def causal_query_key_pairs(layout: str, cp: int, seq: int, rank: int) -> int:
    """(query, key) token pairs rank ``rank`` computes under a causal mask (query t sees keys 0..t) with ``seq``
    tokens over ``cp`` ranks: ``contiguous`` (rank r holds tokens r seq/cp .. (r+1) seq/cp - 1) or ``striped``
    (Brandon et al. 2023: rank r holds tokens r, r + cp, r + 2 cp, ...)."""
    if layout == "contiguous":
        queries = range(rank * seq // cp, (rank + 1) * seq // cp)
    elif layout == "striped":
        queries = range(rank, seq, cp)
    else:
        raise ValueError(f"layout must be contiguous or striped, not {layout!r}")
    return sum(t + 1 for t in queries)


def check_striped_pairs(busiest_striped, busiest_contiguous, cp: int = 4, seq: int = 1024) -> bool:
    """Exercise 5: ``seq`` tokens over ``cp`` ranks, causal: the (query, key) pairs the busiest rank computes with the
    striped layout, and with the contiguous one (:func:`causal_query_key_pairs`)?"""
    want_s = max(causal_query_key_pairs("striped", cp, seq, r) for r in range(cp))
    want_c = max(causal_query_key_pairs("contiguous", cp, seq, r) for r in range(cp))
    ok_s = _report("busiest rank's pairs, striped", busiest_striped, want_s,
                   "rank r's queries are r, r + cp, ...: query t sees t + 1 keys; the last rank is busiest by "
                   "one key per query", rel=0)
    ok_c = _report("busiest rank's pairs, contiguous", busiest_contiguous, want_c,
                   "the last rank holds the last seq/cp queries, each seeing every key before it", rel=0)
    return ok_s and ok_c


# Exercise 6 and the worked problem at GPU scale: does the ring hide its transfers on 16 H100s?
GPU_CP = dict(h=4096, seq=131072, cp=16)  # one 128k-token sequence, width 4096 (multi-head: K and V as wide as Q)


def ring_step_seconds(h: int, seq: int, cp: int, hardware: str = "h100") -> dict:
    """One forward step of ring attention on GPUs of ``hardware``, priced from published figures: the attention
    products of a full (unmasked) block, ``4 (s/cp)^2 h`` FLOPs (``Q K^T`` and ``P V``), at the bf16 peak times the
    best matrix product's efficiency (:data:`course.hardware.HARDWARE`), against the transfer of the next K and V
    blocks (``2 (s/cp) h`` bf16 numbers) to the neighbour over each link (:func:`communication.collective_seconds`,
    a send, NCCL's latencies). The ring hides its transfers where compute >= transfer.

    Returns ``{"compute": seconds, "transfer": {link name: seconds}}``.
    """
    from communication import collective_seconds
    from course.hardware import HARDWARE

    hw = HARDWARE[hardware]
    n = seq // cp
    compute = 4 * n * n * h / (hw.peak_flops["bf16"] * hw.matmul_efficiency)
    links = {hw.intra.name: hw.intra, **({hw.inter.name: hw.inter} if hw.inter else {})}
    return {"compute": compute, "transfer": {name: collective_seconds("send", 2 * n * h * 2, 2, link.alpha, link.beta,
                                                                      link.base) for name, link in links.items()}}


def check_ring_step(compute_ms, nvlink_ms, infiniband_ms) -> bool:
    """Exercise 6: one forward ring step of :data:`GPU_CP` (128k tokens over 16 H100s, width 4096, bf16): the
    milliseconds of its block's attention products, and of sending the next K and V blocks over NVLink and over
    InfiniBand (:func:`ring_step_seconds`)?"""
    t = ring_step_seconds(**GPU_CP)
    ok_c = _report("one step's attention products (ms)", compute_ms, 1e3 * t["compute"],
                   "4 (s/cp)^2 h FLOPs at 989 TFLOP/s x 0.803", rel=0.02)
    ok_n = _report("K and V over NVLink (ms)", nvlink_ms, 1e3 * t["transfer"]["nvlink"],
                   "2 (s/cp) h numbers of 2 bytes at 450 GB/s, plus 8.4 + 3.4 us", rel=0.02)
    ok_i = _report("K and V over InfiniBand (ms)", infiniband_ms, 1e3 * t["transfer"]["infiniband"],
                   "the same bytes at 50 GB/s, plus 8.4 + 9.6 us", rel=0.02)
    return ok_c and ok_n and ok_i
