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
