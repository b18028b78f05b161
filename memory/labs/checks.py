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
from memory.formulas import activation_bytes_per_layer, model_state_bytes

GPT_13B = dict(n_layer=40, n_embd=5120, n_head=40)  # a GPT-2-shaped 13B model (vocabulary 50257, 2048 positions)


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
