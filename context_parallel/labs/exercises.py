"""The exercises at the end of notebooks/07_context_parallelism.ipynb, and checks that say right or wrong.

Each ``check_*`` prints whether the answer is right (and, if not, a hint, never the answer) and
returns True or False.
"""
from __future__ import annotations

import math

# Exercise 1: the online softmax by hand.
EXERCISE_1_BLOCKS = ([2.0, 5.0], [1.0, 7.0])  # scores of one query, two blocks of two keys


def check_online_softmax(m: float, l: float) -> bool:
    """Exercise 1: the running max ``m`` and running sum ``l`` after both blocks of ``EXERCISE_1_BLOCKS``
    (``l`` is the sum of ``exp(score - m)`` over the four keys)."""
    scores = [s for block in EXERCISE_1_BLOCKS for s in block]
    want_m = max(scores)
    want_l = sum(math.exp(s - want_m) for s in scores)
    if not math.isclose(m, want_m, rel_tol=1e-6):
        print("m is not right: it is the largest score seen so far, over both blocks.")
        return False
    if not math.isclose(l, want_l, rel_tol=1e-4):
        first_only = sum(math.exp(s - max(EXERCISE_1_BLOCKS[0])) for s in EXERCISE_1_BLOCKS[0])
        hint = (" It looks like the first block's sum was not rescaled by exp(m_old - m_new)."
                if math.isclose(l, first_only + sum(math.exp(s - want_m) for s in EXERCISE_1_BLOCKS[1]), rel_tol=1e-4)
                else " Add exp(score - m) over all four scores, with the final m.")
        print("l is not right." + hint)
        return False
    print("Right: m and l after both blocks.")
    return True


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
    ok = True
    if busiest_contiguous != want_c:
        print(f"contiguous: not right. The busiest rank holds the last two chunks; chunk c sees c + 1 chunks.")
        ok = False
    if busiest_zigzag != want_z:
        print("zig-zag: not right. Every rank holds one chunk from the front and one from the back.")
        ok = False
    if ok:
        print(f"Right: with cp = {cp} the ring's steps wait for the busiest rank, so the contiguous layout takes "
              f"{want_c / want_z:.2f}x the zig-zag one's compute time per pass.")
    return ok


# Exercise 3: communication volume per layer.


def check_traffic(batch: int, seq: int, hidden: int, cp: int, ring_mb: float, ulysses_mb: float,
                  element_size: int = 2) -> bool:
    """Exercise 3: MB (1e6 bytes) one rank sends per attention layer in the **forward** pass, ring vs Ulysses,
    for (batch, seq, hidden = heads x head_dim), cp ranks and ``element_size`` bytes per number (bf16: 2)."""
    from context_parallel.ring_attention import ring_traffic_bytes
    from context_parallel.ulysses import ulysses_traffic_bytes

    want_r = ring_traffic_bytes(batch, seq, hidden, cp, element_size)["forward"] / 1e6
    want_u = ulysses_traffic_bytes(batch, seq, hidden, cp, element_size)["forward"] / 1e6
    ok = True
    if not math.isclose(ring_mb, want_r, rel_tol=0.01):
        print("ring: not right. Each step but the last sends one K and one V block of batch x seq/cp x hidden.")
        ok = False
    if not math.isclose(ulysses_mb, want_u, rel_tol=0.01):
        print("Ulysses: not right. Four all-to-alls (q, k, v, out) of one shard each; a rank keeps 1/cp of each.")
        ok = False
    if ok:
        print(f"Right: the ring sends {want_r / want_u:.1f}x what Ulysses sends here.")
    return ok


# Exercise 4: when does the ring hide its transfers?


def check_overlap_length(tokens_per_rank: float, flops_per_s: float = 312e12, bytes_per_s: float = 50e9) -> bool:
    """Exercise 4: the smallest ``seq / cp`` (tokens per rank) for which one ring step's attention compute (forward:
    ``4 b (s/cp)^2 h`` FLOPs for ``Q K^T`` and ``P V``) takes as long as sending its K and V blocks
    (``2 b (s/cp) h`` numbers of 2 bytes) — Liu et al. 2023, Sec. 3: the block must be at least
    ``flops / bandwidth`` long."""
    want = flops_per_s / bytes_per_s  # 4 b n^2 h / F = 4 b n h / B  =>  n = F / B
    if math.isclose(tokens_per_rank, want, rel_tol=0.05):
        print(f"Right: about {want:.0f} tokens per rank; shorter shards leave the ring waiting for its transfers.")
        return True
    print("Not right: set compute time = transfer time for one step and solve for s/cp (batch and h cancel).")
    return False
