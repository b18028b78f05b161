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
    """Exercise of notebooks/10_debugging_hangs.ipynb: ``communication.hang_workers.mystery_metrics`` hangs on 2
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


def check_recursive_doubling_three(steps, bytes_factor) -> bool:
    """Exercise 5: recursive doubling on p = 3 ranks (not a power of two: the third rank folds its tensor into a
    partner first and gets the result back last). How many messages on the critical path, and how many times the
    tensor's bytes (:func:`communication.cost_model.allreduce_steps`, ``allreduce_bytes_factor``)?"""
    from communication.cost_model import allreduce_bytes_factor, allreduce_steps

    ok_s = report("recursive doubling steps at p = 3", steps, allreduce_steps("recursive_doubling", 3),
                  "one exchange between the two ranks of the power of two below 3, plus a fold-in before and the "
                  "result after", rel=0)
    ok_b = report("bytes per byte of the message at p = 3", bytes_factor,
                  allreduce_bytes_factor("recursive_doubling", 3), "every message carries the whole tensor", rel=0)
    return ok_s and ok_b


LL_ALPHA = {"NVLink 4 (H100 SXM)": 0.6e-6, "PCIe Gen5 x16": 1.0e-6, "InfiniBand NDR (1 NIC per GPU)": 2.7e-6}


def small_message_choice(size_bytes: float = 2 ** 20, p: int = 8) -> tuple[str, ...]:
    """For each link of :data:`communication.cost_model.LINKS` in order, with NCCL's LL-protocol latency per step
    (:data:`LL_ALPHA`, ``tuning.cc``), the algorithm the alpha-beta model finds faster for an all-reduce of
    ``size_bytes`` on ``p`` ranks: ``"ring"`` or ``"recursive doubling"``."""
    from communication.cost_model import LINKS, predict_allreduce

    out = []
    for name, link in LINKS.items():
        ring = predict_allreduce("ring", size_bytes, p, LL_ALPHA[name], link.beta)
        rd = predict_allreduce("recursive_doubling", size_bytes, p, LL_ALPHA[name], link.beta)
        out.append("ring" if ring < rd else "recursive doubling")
    return tuple(out)


def check_small_message_choice(answer) -> bool:
    """Exercise 6: an all-reduce of one 1 MiB bucket on 8 GPUs, with NCCL's LL-protocol latencies (0.6, 1.0, 2.7 us per
    step over NVLink, PCIe, InfiniBand) and section 5's bandwidths: which algorithm does the model choose on each
    link, in that order (a tuple of "ring" or "recursive doubling")?"""
    given = tuple(str(a).strip().lower() for a in answer) if isinstance(answer, (tuple, list)) else answer
    return report("the faster algorithm per link (NVLink, PCIe, InfiniBand)", given, small_message_choice(),
                  "compare 2(p-1) alpha + 2(p-1)/p n beta with log2(p) (alpha + n beta) on each link")
