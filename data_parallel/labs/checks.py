"""Answer checks for the exercises of notebooks/01_data_parallel.ipynb.

Each ``check_*`` compares a learner's number with the value worked out here from the formulas (not from the
assignment code, which may not be written yet), prints whether it is right and, if not, a hint, and returns
True or False. The formulas are tested against the code they describe (tests/data_parallel/test_checks.py).
"""
from __future__ import annotations

from course.exercise_checks import report as _report

# The worked problem at GPU scale (notebook 01, section 5): GPT-2 1.5B trained data-parallel on H100s, bf16.
GPU_MODEL = dict(vocab_size=50257, n_positions=1024, n_embd=1600, n_layer=48)  # GPT-2 1.5B (Radford et al. 2019)
GPU_SEQ = 1024  # tokens per sequence


def effective_batch_size(per_rank_batch: int, dp: int, accumulation_steps: int = 1) -> int:
    """Sequences whose gradients one optimizer step averages: ``per_rank_batch x dp x accumulation_steps``
    (Li et al. 2020, PyTorch DDP, Sec. 3.2.4 for gradient accumulation)."""
    return per_rank_batch * dp * accumulation_steps


def gpt2_parameter_count(vocab_size: int, n_positions: int, n_embd: int, n_layer: int) -> int:
    """Parameters of ``GPT2LMHeadModel`` with the LM head tied to the token embedding (counted once).

    Token and position embeddings ``(V + P) h``; per block two layer norms (``4h``), the attention's
    ``c_attn`` (``h x 3h`` + ``3h``) and ``c_proj`` (``h x h`` + ``h``), the MLP's ``c_fc`` (``h x 4h`` +
    ``4h``) and ``c_proj`` (``4h x h`` + ``h``): ``12h^2 + 13h``; the final layer norm ``2h``.
    """
    h = n_embd
    return (vocab_size + n_positions) * h + n_layer * (12 * h * h + 13 * h) + 2 * h


def gpt2_parameter_tensors(n_layer: int) -> int:
    """Parameter tensors of ``GPT2LMHeadModel`` (tied head not counted again): ``wte``, ``wpe``, 12 per block
    (weight and bias of ``ln_1``, ``c_attn``, attention ``c_proj``, ``ln_2``, ``c_fc``, MLP ``c_proj``) and
    ``ln_f``'s two — the all-reduces per step of :func:`data_parallel.average_gradients`, one per tensor."""
    return 2 + 12 * n_layer + 2


def ring_bytes_sent_per_rank(payload_bytes: float, world_size: int) -> float:
    """Bytes each rank sends in a ring all-reduce of ``payload_bytes``: ``2 (p - 1) / p`` of it
    (reduce-scatter then all-gather, ``p - 1`` steps of ``1/p`` each; Thakur et al. 2005, Sec. 4)."""
    return 2 * (world_size - 1) / world_size * payload_bytes


def shared_fraction_of_first_steps(dp: int) -> float:
    """Of the examples the run at ``dp`` ranks trains on in its first steps, the fraction the run at one
    rank trains on in its first steps too (same seed, same global batch size, steps few enough that no
    shard is exhausted): rank 0's shard starts where the one-rank run's order starts, the others start
    ``n/dp``, ``2n/dp``, ... into it, so ``1/dp`` (:func:`data_parallel.data_order.global_batch_indices`)."""
    return 1 / dp


def dp_step_seconds(n_params: float, global_batch: int, seq: int, dp: int, hardware: str = "h100") -> dict:
    """One data-parallel step on ``dp`` GPUs of ``hardware`` (:data:`course.hardware.HARDWARE`), priced from
    published figures: ``{"compute": seconds, "all_reduce": seconds, "ratio": all_reduce / compute, "link"}``.

    * compute: ``6 N`` FLOPs per token (forward and backward, Kaplan et al. 2020, Sec. 2.1) for the rank's
      ``global_batch / dp`` sequences of ``seq`` tokens, at the bf16 peak times the best-shaped matrix
      product's measured efficiency (``matmul_efficiency``: what the GPU reaches at best);
    * all-reduce: one ring all-reduce of the bf16 gradient (``2 N`` bytes) over the ``dp`` ranks, on the link
      the group spans (NVLink inside a node of 8, InfiniBand beyond: the ring's slowest hop), with NCCL's
      per-step and per-call latencies (:func:`communication.collective_seconds`), not overlapped.

    Raises:
        ValueError: ``global_batch`` not divisible by ``dp``, or an unknown hardware.
    """
    from communication import collective_seconds
    from course.hardware import HARDWARE

    if hardware not in HARDWARE:
        raise ValueError(f"hardware must be one of {sorted(HARDWARE)}, not {hardware!r}")
    if global_batch % dp:
        raise ValueError(f"a global batch of {global_batch} sequences does not split over dp = {dp} ranks")
    hw = HARDWARE[hardware]
    rate = hw.peak_flops["bf16"] * hw.matmul_efficiency
    compute = 6 * n_params * (global_batch // dp) * seq / rate
    link = hw.link(dp)
    reduce = collective_seconds("all_reduce", 2 * n_params, dp, link.alpha, link.beta, link.base)
    return {"compute": compute, "all_reduce": reduce, "ratio": reduce / compute, "link": link.name}


def break_even_batch(n_params: float, seq: int, dp: int, hardware: str = "h100") -> int:
    """The smallest global batch (sequences, a multiple of ``dp``) whose per-rank compute in
    :func:`dp_step_seconds` lasts at least as long as its gradient all-reduce."""
    per_rank = 1
    while True:
        t = dp_step_seconds(n_params, per_rank * dp, seq, dp, hardware)
        if t["compute"] >= t["all_reduce"]:
            return per_rank * dp
        per_rank += 1


# ---- the exercises -------------------------------------------------------------------------------

def check_effective_batch_size(answer) -> bool:
    """Exercise 1: 8 data-parallel ranks, each with micro-batches of 16 sequences, accumulate the gradients
    of 4 micro-batches before every optimizer step. How many sequences does one optimizer step average over?"""
    return _report("effective batch size", answer, effective_batch_size(16, 8, 4),
                   "every rank contributes accumulation_steps x per-rank batch; the all-reduce averages over dp ranks")


def check_gradient_bytes(payload, sent_per_rank) -> bool:
    """Exercise 2: GPT-2 124M (vocabulary 50257, 1024 positions, width 768, 12 blocks, tied LM head) trained
    data-parallel on 8 ranks with float32 gradients. (a) How many bytes of gradients does one step all-reduce
    (the payload)? (b) How many bytes does each rank send if the all-reduce is a ring?"""
    n = gpt2_parameter_count(50257, 1024, 768, 12)
    ok_a = _report("gradient bytes all-reduced per step", payload, 4 * n,
                   "count the parameters (embeddings (V + P) h, 12 h^2 + 13 h per block, 2 h for ln_f; the "
                   "head is tied) and multiply by 4 bytes")
    ok_b = _report("bytes each rank sends (ring)", sent_per_rank, ring_bytes_sent_per_rank(4 * n, 8),
                   "a ring all-reduce is a reduce-scatter and an all-gather, each p - 1 messages of payload / p")
    return ok_a and ok_b


def check_all_reduce_calls(answer) -> bool:
    """Exercise 3: how many all-reduce calls does ``average_gradients`` (one per parameter tensor) make per step
    for GPT-2 124M (12 blocks)?"""
    return _report("all-reduce calls per step", answer, gpt2_parameter_tensors(12),
                   "wte and wpe, 12 tensors per block (weights and biases of 2 layer norms, c_attn, attn c_proj, "
                   "c_fc, mlp c_proj), and ln_f's weight and bias; the tied head is the embedding")


def check_shared_fraction(answer) -> bool:
    """Exercise 4: the runs of ``project/run_data_parallel.py`` at ``--dp 1`` and ``--dp 4`` (same seed, global
    batch 64) each train 10 steps on Multi30k's 29,000 training pairs. What fraction of the examples the dp = 4
    run trains on does the dp = 1 run train on too?"""
    return _report("shared fraction of the examples", answer, shared_fraction_of_first_steps(4),
                   "both cut the same shuffle; the dp = 1 run reads it from the start, rank r of the dp = 4 run from "
                   "r n / 4 on, 16 examples per step")


def check_token_count_bytes(calls, payload_bytes) -> bool:
    """Exercise 5: the exact recipe of section 3 (each rank divides its summed token losses by the *global* token
    count) costs one extra all-reduce per step, of the ranks' token counts. How many extra all-reduce calls per step,
    and how many bytes does each carry (``data_parallel.experiments.gpt2_token_weighted_gradient_demo`` all-reduces
    the count as one float64)?"""
    ok_calls = _report("extra all-reduces per step", calls, 1,
                       "the ranks need one number, the global count of target tokens, before their backward passes")
    ok_bytes = _report("bytes of that all-reduce", payload_bytes, 8,
                       "one count per rank, summed: a single float64 (8 bytes), whatever dp is")
    return ok_calls and ok_bytes


def check_dp_break_even(answer) -> bool:
    """Exercise 6: GPT-2 1.5B (:data:`GPU_MODEL`) data-parallel on 64 H100s (8 nodes of 8: the ring crosses
    InfiniBand), sequences of 1024 tokens, bf16 gradients, nothing overlapped. From what global batch (sequences,
    a multiple of 64) does a rank's compute last at least as long as the gradient all-reduce
    (:func:`dp_step_seconds`)?"""
    n = gpt2_parameter_count(**GPU_MODEL)
    return _report("global batch where compute catches up with the all-reduce", answer,
                   break_even_batch(n, GPU_SEQ, 64),
                   "the all-reduce's time does not depend on the batch: 2(p-1)(alpha + beta 2N/p) + base on "
                   "InfiniBand; a rank's compute is 6 N (B/64) 1024 / (989e12 x 0.803); solve for B and round up to "
                   "a multiple of 64")
