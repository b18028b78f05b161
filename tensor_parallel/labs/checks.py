"""Answer checks for the exercises of notebooks/03_tensor_parallel.ipynb.

Each ``check_*`` compares a learner's answer with the value worked out here from Megatron-LM's layout
(Shoeybi et al. 2019, Sec. 3; Korthikanti et al. 2022, Sec. 4.2.2) — not from the assignment code, which
may not be written yet — prints whether it is right and, if not, a hint, and returns True or False.
"""
from __future__ import annotations

import math
from functools import partial

from course.exercise_checks import report


_report = partial(report, rel=1e-6)  # course.exercise_checks: the one answer check
_report_model = partial(report, rel=0.02)  # answers worked out by hand from a model: 2 % for rounding on the way

# The worked problem at GPU scale (notebook 03): one GPT-3 175B layer (Brown et al. 2020, Table 2.1: h = 12288,
# 96 heads) split over t = 8 H100s, a micro-batch of one 2048-token sequence, bf16.
GPT3_LAYER = dict(h=12288, tokens=2048, t=8)


def tp_layer_seconds(h: int, tokens: int, t: int, hardware: str = "h100") -> dict:
    """The forward pass of one tensor-parallel transformer layer on ``t`` GPUs of ``hardware``, priced from
    published figures: ``{"gemm": seconds, "all_reduce": {link name: seconds}}``.

    * the layer's matrix products, ``24 tokens h^2`` FLOPs (Q, K, V and the output projection ``8 h^2`` per token,
      the MLP's two ``4h``-wide products ``16 h^2``; Narayanan et al. 2021, Sec. 5.1), split ``t`` ways, at the
      bf16 peak times the best matrix product's measured efficiency (:data:`course.hardware.HARDWARE`);
    * Megatron's two all-reduces of the ``(tokens, h)`` bf16 activation (``g`` after attention and after the MLP;
      Shoeybi et al. 2019, Sec. 3), ring algorithm with NCCL's latencies (:func:`communication.collective_seconds`)
      over each of the hardware's links: NVLink inside the node, InfiniBand if the group spanned nodes.

    Attention's ``s x s`` products are left out (they do not change the comparison's order of magnitude).
    """
    from communication import collective_seconds
    from course.hardware import HARDWARE

    hw = HARDWARE[hardware]
    gemm = 24 * tokens * h * h / t / (hw.peak_flops["bf16"] * hw.matmul_efficiency)
    nbytes = tokens * h * 2
    links = {hw.intra.name: hw.intra, **({hw.inter.name: hw.inter} if hw.inter else {})}
    return {"gemm": gemm, "all_reduce": {name: 2 * collective_seconds("all_reduce", nbytes, t, link.alpha, link.beta,
                                                                      link.base) for name, link in links.items()}}


def check_allreduces_per_step(answer) -> bool:
    """Exercise 1: GPT-2 124M (12 blocks) with plain tensor parallelism (``tp`` blocks, no sequence
    parallelism): how many all-reduces do the blocks run in one training step (forward + backward)?"""
    return _report("all-reduces per step in the blocks", answer, 12 * (2 + 2),
                   "each block has g after attention and after the MLP (forward) and f before each (backward)")


def check_block_traffic(tp_bytes, sp_bytes) -> bool:
    """Exercise 2: one block of GPT-2 1.5B (h = 1600), b = 8, s = 1024, bf16 activations, t = 8, ring
    algorithm: how many bytes does one rank send in the block's forward pass with plain TP, and with
    TP + sequence parallelism?"""
    t, volume = 8, 8 * 1024 * 1600 * 2
    tp = 2 * 2 * (t - 1) / t * volume  # 2 all-reduces, each 2(t-1)/t of the tensor
    sp = 2 * 2 * (t - 1) / t * volume  # 2 all-gathers + 2 reduce-scatters, each (t-1)/t
    ok_tp = _report("bytes sent, plain TP", tp_bytes, tp,
                    "a ring all-reduce sends 2(t-1)/t of the tensor's bytes per rank; the forward pass has two")
    ok_sp = _report("bytes sent, TP + SP", sp_bytes, sp,
                    "an all-gather and a reduce-scatter each send (t-1)/t of the full tensor; there are two of each")
    return ok_tp and ok_sp


def check_mlp_shard_shapes(c_fc_shape, c_proj_shape) -> bool:
    """Exercise 3: the MLP of GPT-2 1.5B (h = 1600, inner 4h) split over t = 8, weights in ``nn.Linear``'s
    (out, in) layout: the shape of one rank's ``c_fc`` weight and of its ``c_proj`` weight (tuples)?"""
    h, t = 1600, 8
    ok_fc = _report("c_fc shard", tuple(c_fc_shape) if c_fc_shape is not None else None, (4 * h // t, h),
                    "c_fc is column parallel: it splits its output features, the rows of (out, in)")
    ok_proj = _report("c_proj shard", tuple(c_proj_shape) if c_proj_shape is not None else None, (h, 4 * h // t),
                      "c_proj is row parallel: it splits its input features, the columns of (out, in)")
    return ok_fc and ok_proj


def check_vocab_loss_bytes(answer) -> bool:
    """Exercise 4: the vocabulary-parallel cross-entropy of b = 8 sequences of s = 1024 tokens in fp32: how
    many bytes of tensors does its forward pass hand to all-reduces (count each all-reduce's tensor once)?"""
    return _report("bytes all-reduced by the vocab-parallel loss", answer, 3 * 4 * 8 * 1024,
                   "three all-reduces (max, target logit, sum of exponentials), one fp32 number per token each")


def check_grad_sync_elements(answer) -> bool:
    """Exercise 5: with sequence parallelism every rank sees only its part of the sequence, so the gradients of the
    parameters every rank holds whole (``replicated_params``: both layer norms' weight and bias, and the bias of
    each row-parallel layer) are partial and ``grad_sync`` all-reduces them once per step. How many elements per
    block for the tiny preset (h = 128)?"""
    return _report("elements grad_sync all-reduces per block (h = 128)", answer, 6 * 128,
                   "ln_1 and ln_2 have a weight and a bias of h each; attention's and the MLP's c_proj (row parallel) "
                   "each a bias of h")


def check_mixed_block_collectives(answer) -> bool:
    """Exercise 6: ``--block_types tp,spd,tp,spd`` on the tiny preset (4 blocks): how many all-reduces per layer, on
    average, in the forward pass?"""
    return _report("forward all-reduces per layer, tp,spd,tp,spd", answer, (2 + 1 + 2 + 1) / 4,
                   "a tp block all-reduces after attention and after the MLP, an spd block only after the MLP")


def check_tp_layer_times(gemm_ms, nvlink_ms, infiniband_ms) -> bool:
    """Exercise 7: one GPT-3 175B layer's forward pass (:data:`GPT3_LAYER`: h = 12288, 2048 tokens, t = 8 H100s,
    bf16): the milliseconds of its matrix products, and of its two all-reduces over NVLink, and over InfiniBand
    were the tp group spread over nodes (:func:`tp_layer_seconds`)."""
    t = tp_layer_seconds(**GPT3_LAYER)
    ok_g = _report_model("matrix products (ms)", gemm_ms, 1e3 * t["gemm"],
                         "24 tokens h^2 FLOPs split over t, at 989 TFLOP/s x 0.803 (the best matrix product's share)")
    ok_n = _report_model("two all-reduces over NVLink (ms)", nvlink_ms, 1e3 * t["all_reduce"]["nvlink"],
                         "each: base 8.4 us + 2(t-1) x 3.4 us + 2(t-1)/t x (2048 x 12288 x 2 bytes) / 450 GB/s")
    ok_i = _report_model("two all-reduces over InfiniBand (ms)", infiniband_ms, 1e3 * t["all_reduce"]["infiniband"],
                         "the same ring at 50 GB/s and 9.6 us per step")
    return ok_g and ok_n and ok_i
