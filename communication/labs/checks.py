"""Answer checks for the exercises of notebooks/04_communication.ipynb.

Each ``check_*`` compares a learner's number with the value worked out here from the formulas (nccl-tests'
doc/PERFORMANCE.md, the alpha-beta model of :mod:`communication.cost_model`), prints whether it is right
and, if not, a hint, and returns True or False. Answers within 1 % count as right.
"""
from __future__ import annotations

import math
from functools import partial

from course.exercise_checks import report


_report = partial(report, rel=0.01, abs_tol=0.0)  # course.exercise_checks: the one answer check


def check_bus_bandwidth(algbw_gb_s, busbw_gb_s) -> bool:
    """Exercise 1: nccl-tests reports an all-reduce of S = 512 MB (512e6 bytes) on p = 8 GPUs taking
    t = 2.0 ms. What are its algorithm bandwidth and its bus bandwidth, in GB/s (1e9 bytes/s)?"""
    algbw = 512e6 / 2.0e-3 / 1e9
    ok_alg = _report("algbw (GB/s)", algbw_gb_s, algbw, "algbw = S / t: bytes of the message over the time")
    ok_bus = _report("busbw (GB/s)", busbw_gb_s, algbw * 2 * 7 / 8,
                     "busbw = algbw x 2(p-1)/p for an all-reduce (nccl-tests, doc/PERFORMANCE.md), not (p-1)/p "
                     "(that is reduce-scatter or all-gather)")
    return ok_alg and ok_bus


def check_crossover(answer_bytes) -> bool:
    """Exercise 2: a link with alpha = 10 us per step and 1/beta = 25 GB/s (25e9 bytes/s), p = 8 ranks. Above
    what message size (bytes) is the ring all-reduce faster than recursive doubling, in the alpha-beta model?"""
    alpha, beta, p = 10e-6, 1 / 25e9, 8
    ring_steps, ring_factor = 2 * (p - 1), 2 * (p - 1) / p
    rd_steps = rd_factor = math.log2(p)
    expected = alpha * (ring_steps - rd_steps) / (beta * (rd_factor - ring_factor))
    return _report("crossover (bytes)", answer_bytes, expected,
                   "set 2(p-1) alpha + 2(p-1)/p n beta equal to log2(p) alpha + log2(p) n beta and solve for n")


def check_gpt2_allreduce(answer_ms) -> bool:
    """Exercise 3: the gradient of GPT-2 small (124,439,808 parameters) in bf16 (2 bytes each), ring all-reduce
    over p = 16 nodes, one InfiniBand NDR port per GPU (50 GB/s each way, alpha = 14 us per step). What time
    does the alpha-beta model predict, in milliseconds?"""
    n, p, alpha, beta = 124_439_808 * 2, 16, 14e-6, 1 / 50e9
    expected = (2 * (p - 1) * alpha + 2 * (p - 1) / p * n * beta) * 1e3
    return _report("GPT-2 gradient all-reduce (ms)", answer_ms, expected,
                   "bytes = parameters x 2; T = 2(p-1) alpha + 2(p-1)/p x bytes x beta; milliseconds = seconds x 1e3")


def check_two_point_fit(alpha_us, bandwidth_gb_s) -> bool:
    """Exercise 4: on p = 4 ranks a ring all-reduce of 1 MB (1e6 bytes) takes 150 us and one of 101 MB
    (101e6 bytes) 3150 us. Fit the alpha-beta model through the two points: alpha (us per step) and 1/beta
    (GB/s)?"""
    p = 4
    slope = (3150e-6 - 150e-6) / 100e6           # seconds per byte of message
    beta = slope / (2 * (p - 1) / p)
    alpha = (150e-6 - slope * 1e6) / (2 * (p - 1))
    ok_a = _report("alpha (us per step)", alpha_us, alpha * 1e6,
                   "the line through the points has intercept a = 2(p-1) alpha: divide by the 6 steps of p = 4")
    ok_b = _report("1/beta (GB/s)", bandwidth_gb_s, 1 / beta / 1e9,
                   "the slope is 2(p-1)/p x beta: divide it by 1.5, then invert")
    return ok_a and ok_b


def check_hidden_hang(rank, seq, op, extra_metric) -> bool:
    """Exercise of notebooks/10_debugging_hangs.ipynb: ``communication.labs.hang_workers.mystery_metrics`` hangs on 2
    ranks. Which rank never posted the collective the other waits in, what is that collective's sequence number
    in the world group and its operation, and which metric's all-reduce is the one too many?

    Worked out from the code: rank 0 averages the metrics ``bleu, loss, tokens`` (sorted), rank 1 only ``loss,
    tokens`` (only rank 0 decodes): rank 0 posts 3 all-reduces, rank 1 two, so collective #3 (rank 0's ``tokens``)
    is never posted by rank 1 — and the all-reduce too many is ``bleu``'s, which shifted every later one by one."""
    def word(x):
        return None if x is None else (str(x).strip().lower().removeprefix("gloo:"),)

    ok_rank = report("the rank that never posted it", rank, 1,
                     "the divergence's 'posted nothing here' rank: the rank with fewer records in the world group")
    ok_seq = report("its sequence number in the world group", seq, 3,
                    "the collective #n of the divergence, counted per group from 1 (not a place in a list)")
    ok_op = report("the operation", word(op), ("all_reduce",), "the divergence's operation, e.g. all_reduce")
    ok_metric = report("the all-reduce too many (metric)", word(extra_metric), ("bleu",),
                       "compare the metric names each rank loops over: which one does only one rank have?")
    return ok_rank and ok_seq and ok_op and ok_metric
