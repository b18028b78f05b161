"""Answer checks for the exercises of notebooks/05_memory.ipynb.

Each ``check_*`` compares a learner's number with the value worked out here from the papers' formulas
(:mod:`memory.formulas`, not from the assignment code, which may not be written yet), prints whether it
is right and, if not, a hint, and returns True or False. Sizes in GB are 10^9 bytes, as in the ZeRO paper.
"""
from __future__ import annotations

import math
from functools import partial

from course.exercise_checks import report
from course.model import estimate_parameters
from memory.formulas import activation_bytes_per_layer, adam_bytes_per_parameter, model_state_bytes

GPT_13B = dict(n_layer=40, n_embd=5120, n_head=40)  # a GPT-2-shaped 13B model (vocabulary 50257, 2048 positions)
# The worked problem at GPU scale (notebook 05): a 70B model (Llama 2 70B's shape, Touvron et al. 2023, Table 1:
# 80 layers, width 8192, 64 heads, 70e9 parameters) trained with ZeRO-3 over 64 H100s of 80 GB, one 4096-token
# sequence per GPU, 16-bit activations (the formula counts multi-head attention: Llama's grouped K/V is smaller).
LLAMA_70B = dict(n_params=70e9, n_layer=80, h=8192, a=64, s=4096, b=1, dp=64, device_bytes=80e9)


def fit_at_scale(n_params: float, n_layer: int, h: int, a: int, s: int, b: int, dp: int, device_bytes: float) -> dict:
    """GB per GPU of a ZeRO-3 run (mixed-precision Adam, 16 bytes per parameter over ``dp``,
    :func:`memory.formulas.model_state_bytes`) and of its activations (Korthikanti et al. 2022,
    :func:`memory.formulas.activation_bytes_per_layer` times the layers) with each recomputation, and whether the
    sum fits ``device_bytes``: ``{"state_gb", "activations_gb": {recompute: GB}, "fits": {recompute: bool}}``."""
    state = sum(model_state_bytes(3, int(n_params), dp, "mixed").values())
    acts = {r: n_layer * activation_bytes_per_layer(s, b, h, a, recompute=r) for r in ("none", "selective", "full")}
    return {"state_gb": state / 1e9, "activations_gb": {r: v / 1e9 for r, v in acts.items()},
            "fits": {r: state + v <= device_bytes for r, v in acts.items()}}


_report = partial(report, rel=0.01)  # course.exercise_checks: the one answer check


def check_zero2_gb(answer) -> bool:
    """Exercise 1: a 7.5B-parameter model, mixed-precision Adam, dp = 64, ZeRO-2: GB of model state per
    rank (within 1%)? (ZeRO, Fig. 1.)"""
    expected = sum(model_state_bytes(2, int(7.5e9), 64, "mixed").values()) / 1e9
    return _report("ZeRO-2 GB per rank", answer, expected,
                   "ZeRO-2 keeps the 2-byte parameters whole and shards the 2-byte gradients and the 12 bytes of "
                   "optimizer state over dp: 2Ψ + 14Ψ/dp")


def _smallest_dp(stage: int, n_params: int, device_bytes: float) -> int:
    dp = 1
    while sum(model_state_bytes(stage, n_params, dp, "mixed").values()) > device_bytes:
        dp *= 2
        if dp > 2 ** 20:
            return 0
    return dp


def check_smallest_dp(zero1_dp, zero3_dp) -> bool:
    """Exercise 2: the GPT-2-shaped 13B model (40 blocks, width 5120, vocabulary 50257, 2048 positions),
    mixed-precision Adam, model state only, 80 GB per GPU: the smallest power-of-two dp at which it fits
    with ZeRO-1, and with ZeRO-3?"""
    n = estimate_parameters("gpt2", 50257, 2048, **GPT_13B)
    ok1 = _report("smallest dp, ZeRO-1", zero1_dp, _smallest_dp(1, n, 80e9),
                  "ZeRO-1 keeps 4 bytes per parameter on every rank (parameters and gradients); "
                  "only the 12 bytes of optimizer state shrink with dp", rel=0)
    ok3 = _report("smallest dp, ZeRO-3", zero3_dp, _smallest_dp(3, n, 80e9),
                  "ZeRO-3 divides all 16 bytes per parameter by dp", rel=0)
    return ok1 and ok3


def check_activation_gb(plain, tp_sp_selective) -> bool:
    """Exercise 3: one layer of GPT-2 1.5B (h = 1600, a = 25), s = 1024, b = 8, 16-bit activations and
    1-byte dropout masks: GB of activations per layer on one device, and per rank with t = 4, sequence
    parallelism and selective recomputation (Korthikanti et al. 2022, Table 2)?"""
    ok1 = _report("GB per layer, one device", plain, activation_bytes_per_layer(1024, 8, 1600, 25) / 1e9,
                  "s·b·h·(34 + 5·a·s/h) bytes")
    ok2 = _report("GB per layer, t = 4, SP, selective", tp_sp_selective,
                  activation_bytes_per_layer(1024, 8, 1600, 25, 4, True, "selective") / 1e9,
                  "selective recomputation drops the 5·a·s/h term; sequence parallelism divides the rest by t: 34·s·b·h/t")
    return ok1 and ok2


def check_fused_gelu_bytes(answer) -> bool:
    """Exercise 4: the course's block in fp32 on the CPU, where a dropout mask is a float32 tensor: how many
    bytes per s·b·h (the linear term, leaving out the a·s/h part) would it keep if its GELU were one
    fused operation that saves only its input (as the paper counts it)?"""
    return _report("bytes per s·b·h with a fused GELU", answer, 16 * 4 + 2 * 4,
                   "the paper's count is (16e + 2m) per s·b·h: 34 for e = 2, m = 1; here e = m = 4", rel=0)


def check_bf16_state_bytes(answer) -> bool:
    """Exercise 5: with ``--precision bf16`` (autocast: bf16 products, fp32 parameters, gradients and Adam state,
    section 8), how many bytes of model state per parameter does a rank hold at ZeRO-0?"""
    return _report("model state per parameter under bf16 autocast", answer,
                   sum(adam_bytes_per_parameter("fp32").values()),
                   "autocast changes the products, not what is held: fp32 parameters (4), gradients (4) and Adam's two "
                   "moments (8)", rel=0)


def check_selective_gb(answer) -> bool:
    """Exercise 6: one layer of GPT-2 1.5B (h = 1600, a = 25), s = 1024, b = 8, 16-bit, no tensor parallelism: GB of
    activations with selective recomputation (the s x s attention part recomputed)?"""
    return _report("GB per layer, selective recomputation", answer,
                   activation_bytes_per_layer(1024, 8, 1600, 25, recompute="selective") / 1e9,
                   "selective recomputation keeps the 34·s·b·h bytes and drops the 5·a·s/h term")


def check_zero0_calls(answer) -> bool:
    """Exercise 7: ZeRO-0 all-reduces each parameter tensor in a call of its own. How many calls per step for the
    section's GPT-2 (2 blocks, vocabulary 1000)?"""
    return _report("ZeRO-0 all-reduce calls per step", answer, 2 + 12 * 2 + 2,
                   "wte and wpe, 12 tensors per block, ln_f's weight and bias (the head is tied)", rel=0)


def check_70b_fit(state_gb, no_recompute_gb, full_recompute_gb) -> bool:
    """Exercise 8: the 70B model of section 7's worked problem (:data:`LLAMA_70B`): GB of model state per GPU under
    ZeRO-3 on 64 GPUs, and GB of activations of all 80 layers for one 4096-token sequence without recomputation and
    with full recomputation (:func:`fit_at_scale`)?"""
    f = fit_at_scale(**LLAMA_70B)
    ok_s = _report("ZeRO-3 model state per GPU (GB)", state_gb, f["state_gb"], "16 bytes per parameter over dp")
    ok_n = _report("activations, no recomputation (GB)", no_recompute_gb, f["activations_gb"]["none"],
                   "80 x s·b·h·(34 + 5·a·s/h) bytes")
    ok_f = _report("activations, full recomputation (GB)", full_recompute_gb, f["activations_gb"]["full"],
                   "full recomputation keeps each layer's input: 80 x 2·s·b·h bytes")
    return ok_s and ok_n and ok_f
