"""Answer checks for the exercises of notebooks/08_mixture_of_experts.ipynb.

Each ``check_*`` compares a learner's number with the value worked out here from the formulas (not from the
assignment code, which may not be written yet), prints whether it is right and, if not, a hint, and returns
True or False.
"""
from __future__ import annotations

import math
from functools import partial

from course.exercise_checks import report


_report = partial(report, rel=1e-6)  # course.exercise_checks: the one answer check
_report_model = partial(report, rel=0.02)  # answers worked out by hand from a model: 2 % for rounding on the way

# The worked problem at GPU scale (notebook 08): one MoE layer of DeepSeek-V3's shape (DeepSeek-AI 2024, Sec. 4.2:
# width 7168, routed experts of inner width 2048 with SwiGLU, top-8 of 256), 16384 tokens per GPU, bf16, its
# experts spread over ep = 8 H100s of one node.
DEEPSEEK_V3_LAYER = dict(h=7168, inner=2048, top_k=8, tokens=16384, ep=8)


def expert_layer_seconds(h: int, inner: int, top_k: int, tokens: int, ep: int, max_violation: float = 0.0,
                         hardware: str = "h100") -> dict:
    """The forward pass of one MoE layer's routed experts on ``ep`` GPUs of ``hardware``: each GPU routes ``tokens``
    tokens, ``top_k`` choices each, and receives on average ``tokens x top_k`` (token, expert) rows; a SwiGLU expert
    computes three ``h x inner`` products per row, ``6 h inner`` FLOPs. With load imbalance MaxVio (the busiest
    expert's load over the mean, less 1; Wang et al. 2024) the busiest GPU gets ``1 + max_violation`` times the mean
    (its experts taken as the busiest), and every GPU waits for it at the combine all-to-all.

    Returns:
        ``{"balanced": seconds, "busiest": seconds, "wait": busiest - balanced}`` at the bf16 peak times the best
        matrix product's efficiency (:data:`course.hardware.HARDWARE`).
    """
    from course.hardware import HARDWARE

    hw = HARDWARE[hardware]
    balanced = tokens * top_k * 6 * h * inner / (hw.peak_flops["bf16"] * hw.matmul_efficiency)
    busiest = balanced * (1 + max_violation)
    return {"balanced": balanced, "busiest": busiest, "wait": busiest - balanced}


def check_capacity(answer) -> bool:
    """Exercise 1: Switch Transformer layer, E = 64 experts, top-1, capacity factor 1.25, 2048 tokens on
    the rank: how many tokens can each expert take?"""
    return _report("capacity", answer, math.ceil(1.25 * 2048 * 1 / 64),
                   "an even share is tokens x k / E; multiply by the factor and round up (Switch Transformer, Sec. 2.2)")


def check_mlp_parameters(total, active) -> bool:
    """Exercise 2: the tiny GPT-2 (4 blocks, h = 128, MLP width 512, biases) with MoE MLPs in blocks 1 and 3,
    E = 8 experts, top-2. How many MLP parameters (all four blocks, routers left out) does the model hold,
    and how many does one token's forward pass use?"""
    h, f = 128, 512
    mlp = h * f + f + f * h + h
    ok_total = _report("MLP parameters held", total, 2 * mlp + 2 * 8 * mlp,
                       "two dense MLPs plus two MoE layers of 8 MLPs each; one MLP is h*f + f + f*h + h")
    ok_active = _report("MLP parameters a token uses", active, 2 * mlp + 2 * 2 * mlp,
                        "a token runs through the two dense MLPs and k = 2 experts in each MoE layer")
    return ok_total and ok_active


def check_dispatch_bytes(answer) -> bool:
    """Exercise 3: ep = 4 ranks, E = 8 experts (2 per rank), top-2, dropless; each rank routes 512 tokens of
    h = 128 float32 values and the router spreads the choices evenly over the experts. How many bytes does
    one rank send to *other* ranks in one layer's forward dispatch?"""
    return _report("dispatch bytes to other ranks", answer, 512 * 2 * (3 / 4) * 128 * 4,
                   "tokens x k rows leave the permutation; an even spread keeps 1/ep of them on the rank; "
                   "each row is h floats of 4 bytes")


def check_collapsed_aux_loss(answer) -> bool:
    """Exercise 4: E = 4 experts, top-1; the router sends every token to expert 0 with probability 1. What is
    the load-balancing loss ``E * sum_i f_i P_i``? (An even router gives 1.)"""
    return _report("load-balancing loss of a collapsed router", answer, 4.0,
                   "f = (1, 0, 0, 0) and P = (1, 0, 0, 0): only expert 0's term is left")


def check_topk_bytes_factor(answer) -> bool:
    """Exercise 5: rerun section 4 with top-2 instead of top-1 (dropless, everything else the same): by what factor do
    the all-to-all bytes per step grow (section 6's formula)?"""
    return _report("all-to-all bytes, top-2 over top-1", answer, 2.0,
                   "every (token, choice) pair is one row in each of the four all-to-alls: the rows are T x k")


def check_straggler(balanced_ms, busiest_ms) -> bool:
    """Exercise 6: the DeepSeek-V3-shaped layer of section 8's worked problem (:data:`DEEPSEEK_V3_LAYER`) with MaxVio
    = 1 (the busiest expert gets twice the mean load): milliseconds of the routed experts' forward pass on a GPU
    with the mean load, and on the busiest GPU that every other one waits for (:func:`expert_layer_seconds`)?"""
    t = expert_layer_seconds(**DEEPSEEK_V3_LAYER, max_violation=1.0)
    ok_b = _report_model("balanced expert time (ms)", balanced_ms, 1e3 * t["balanced"],
                         "tokens x k rows x 6 h inner FLOPs, at 989 TFLOP/s x 0.803")
    ok_s = _report_model("busiest GPU's expert time (ms)", busiest_ms, 1e3 * t["busiest"],
                         "the busiest GPU computes (1 + MaxVio) times the mean rows")
    return ok_b and ok_s
