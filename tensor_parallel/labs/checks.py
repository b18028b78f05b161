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
