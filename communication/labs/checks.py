"""Answer checks for the exercises of notebooks/04_communication.ipynb.

Each ``check_*`` compares a learner's number with the value worked out here from the formulas (nccl-tests'
doc/PERFORMANCE.md, the alpha-beta model of :mod:`communication.cost_model`), prints whether it is right
and, if not, a hint, and returns True or False. Answers within 1 % count as right.
"""
from __future__ import annotations

import math
import re
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



# ---- notebooks/10_debugging_hangs.ipynb: the watchdog, the recorder's buffer, DETAIL, a straggler, a divergence ----

def check_watchdog_abort(answer_s) -> bool:
    """Exercise 2 of notebook 10: a process group made with ``timeout=timedelta(minutes=5)``; the ranks post an
    all-reduce 3 s after 12:00:00, one rank never does. NCCL's watchdog aborts a collective that has not completed
    within the group's timeout (``TORCH_NCCL_ASYNC_ERROR_HANDLING``'s default tears the process down). How many seconds
    after 12:00:00 do the waiting ranks abort?"""
    return report("seconds after 12:00:00 at which the watchdog aborts", answer_s, 3 + 5 * 60,
                  "the timeout counts from when the collective was posted, not from the start", rel=0)


def check_flight_recorder_buffer(answer) -> bool:
    """Exercise 3 of notebook 10: a run posts 150 operations per step (collectives and point-to-point together, over
    all its groups). What is the smallest ``TORCH_FR_BUFFER_SIZE`` that keeps the last 20 steps in every dump?"""
    return report("TORCH_FR_BUFFER_SIZE", answer, 150 * 20,
                  "one ring buffer per process keeps the newest N operations of all its groups together", rel=0)


DETAIL_CHOICES = {"a": "the same collective called on tensors of different shapes", "b": "one rank skips a collective",
                  "c": "two ranks each receive before sending", "d": "a parameter left out of the gradient averaging"}


def check_debug_detail(answer) -> bool:
    """Exercise 4 of notebook 10: ``TORCH_DISTRIBUTED_DEBUG=DETAIL`` makes every rank exchange a fingerprint of each
    collective (the operation, the tensors' shapes and dtypes) with the other ranks of the group before running it,
    and raises when the fingerprints differ. Which of :data:`DETAIL_CHOICES` do the ranks reach with *different*
    fingerprints (a letter)?"""
    letter = re.search(r"[a-z]", str(answer).lower()) if answer is not None else None
    given = None if answer is None else (letter.group(0) if letter else str(answer),)
    return report("the bug DETAIL's fingerprints tell apart", given, ("a",),
                  f"one of {sorted(DETAIL_CHOICES)}: ask of each whether every rank reaches the check, and whether "
                  f"what each brings to it differs")


def straggler_step(compute_ms: list[float], all_reduce_ms: float) -> dict:
    """A data-parallel step whose ranks compute ``compute_ms`` each, then all-reduce for ``all_reduce_ms`` once every
    rank has arrived: ``{"step_ms", "wait_ms": per rank, "waiting_share"}`` (the share of all ranks' time spent
    waiting for the slowest)."""
    slowest = max(compute_ms)
    step = slowest + all_reduce_ms
    wait = [slowest - c for c in compute_ms]
    return {"step_ms": step, "wait_ms": wait, "waiting_share": sum(wait) / (len(compute_ms) * step)}


def check_straggler_step(step_ms, rank0_wait_ms, waiting_share) -> bool:
    """Exercise 5 of notebook 10: 4 data-parallel ranks compute 100, 100, 100 and 160 ms per step, then all-reduce for
    5 ms. The step time, rank 0's wait in the all-reduce before it can start, and the share of the 4 ranks' time spent
    waiting (:func:`straggler_step`)?"""
    t = straggler_step([100, 100, 100, 160], 5)
    ok = [report("step time (ms)", step_ms, t["step_ms"], "the all-reduce starts when the slowest rank arrives", rel=0),
          report("rank 0's wait (ms)", rank0_wait_ms, t["wait_ms"][0], "the slowest rank's compute less rank 0's", rel=0),
          report("share of all ranks' time spent waiting", waiting_share, t["waiting_share"],
                 "the waits summed over the ranks, over 4 x the step time", rel=0.01)]
    return all(ok)


def check_silent_divergence(parameter, first_step) -> bool:
    """Exercise 6 of notebook 10: ``communication.hang_workers.silent_divergence`` — which parameter's replicas
    differ between the ranks, and after which step (counted from 1) do they first differ?"""
    name = None if parameter is None else (str(parameter).strip().lower(),)
    ok_p = report("the parameter that diverged", name, ("bias",),
                  "'weight' or 'bias': the one whose largest difference between the ranks is not 0")
    ok_s = report("the first step after which the replicas differ", first_step, 1,
                  "the first optimizer step applies each rank's own, unaveraged gradient", rel=0)
    return ok_p and ok_s
