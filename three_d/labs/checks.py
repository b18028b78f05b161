"""Answer checks for the exercises of notebooks/06_3d_parallelism.ipynb.

Each ``check_*`` compares a learner's answer with the value worked out here from the formulas (not from the
assignment code, which may not be written yet), prints whether it is right and, if not, a hint, and returns
True or False.
"""
from __future__ import annotations

import math
from functools import partial

from course.exercise_checks import report


_report = partial(report, rel=1e-3, abs_tol=1e-12)  # course.exercise_checks: the one answer check

# The worked problem at GPU scale (notebook 06, section 4): GPT-3 175B (96 layers; Brown et al. 2020) on 1024 H100s
# in nodes of 8, a global batch of 1536 sequences in micro-batches of one, mixed-precision Adam with ZeRO-1 over dp.
GPT3_3D = dict(n_params=175e9, global_batch=1536, micro_batch=1, devices_per_node=8)
GPT3_LAYOUTS = ((8, 16, 8), (8, 8, 16), (4, 32, 8), (16, 8, 8), (8, 32, 4))  # (tp, pp, dp), 1024 GPUs each


def three_d_layout(tp: int, pp: int, dp: int, n_params: float, global_batch: int, micro_batch: int,
                   devices_per_node: int) -> dict:
    """What one factorisation ``tp x pp x dp`` of a large run costs, from the formulas: the model state per GPU
    (mixed-precision Adam, ZeRO-1: the 2-byte parameters and gradients of the GPU's ``1/(tp pp)`` of the model whole,
    Adam's 12 bytes sharded over dp too; Rajbhandari et al. 2020, Sec. 5), the micro-batches one pipeline runs
    (``global_batch / (dp micro_batch)``) and its 1F1B bubble (:func:`pipeline.bubble_fraction`), and the link the tp
    group's all-reduces cross (NVLink when tp fits a node of ``devices_per_node``, else InfiniBand).

    Returns ``{"state_gb", "micro_batches", "bubble", "tp_link"}``.
    """
    from pipeline import bubble_fraction

    per_gpu = n_params / (tp * pp)
    m = global_batch // (dp * micro_batch)
    return {"state_gb": per_gpu * (2 + 2 + 12 / dp) / 1e9, "micro_batches": m, "bubble": bubble_fraction(pp, m),
            "tp_link": "nvlink" if tp <= devices_per_node else "infiniband"}


def check_factorisation_count(answer) -> bool:
    """Exercise 1: how many ``(dp, pp, tp)`` with ``dp * pp * tp = 16`` does a model of 8 blocks and 4 heads allow
    (pp at most the blocks, tp dividing the heads)?"""
    found = sum(1 for pp in range(1, 17) for tp in range(1, 17)
                if 16 % (pp * tp) == 0 and pp <= 8 and 4 % tp == 0)
    return _report("factorisations of 16", answer, found,
                   "list the ordered triples whose product is 16 (there are 15), then drop pp > 8 and tp not dividing 4")


def check_bubble_choice(answer) -> bool:
    """Exercise 2: 8 ranks, a global batch of 32 rows in micro-batches of 2 rows: give the 1F1B bubble fraction
    ``(p - 1) / (m + p - 1)`` of dp 1 x pp 4 x tp 2 (m = the micro-batches one dp rank pipelines)."""
    m = 32 // (1 * 2)
    return _report("bubble of dp 1 x pp 4 x tp 2", answer, (4 - 1) / (m + 4 - 1),
                   "one dp rank pipelines all 32 rows: m = 32 / 2 = 16 micro-batches over p = 4 stages")


def check_mfu(answer) -> bool:
    """Exercise 3: a 1.3-billion-parameter GPT (count only 6 N FLOPs per token) trains on 64 GPUs at 989 TFLOP/s
    peak each, a step of 1024 sequences of 2048 tokens taking 2.0 s. What is its MFU (a fraction)?"""
    flops = 6 * 1.3e9 * 1024 * 2048
    return _report("MFU", answer, flops / (2.0 * 64 * 989e12),
                   "model FLOPs per step = 6 N x tokens per step; divide by step time x GPUs x peak (PaLM, App. B)")


def check_mfu_from_hfu(answer) -> bool:
    """Exercise 4: a run reports 52% of peak counting full activation recomputation (the blocks' forward twice:
    96 B s l h^2 instead of 72; leave out the attention and vocabulary terms). What MFU is that?"""
    return _report("MFU of a 52% HFU run with full recomputation", answer, 0.52 * 72 / 96,
                   "model FLOPs leave the recomputed forward out: 3 passes' worth (72) of the 4 counted (96)")


def check_gpt3_layout(state_gb, bubble) -> bool:
    """Exercise 5: GPT-3 175B on 1024 H100s as tp 8 x pp 16 x dp 8 (:data:`GPT3_3D`): GB of model state per GPU with
    ZeRO-1, and the 1F1B bubble fraction (:func:`three_d_layout`)?"""
    t = three_d_layout(8, 16, 8, **GPT3_3D)
    ok_s = _report("model state per GPU (GB)", state_gb, t["state_gb"],
                   "the GPU holds 1/(tp pp) of the parameters: 2 + 2 bytes each, plus 12/dp of Adam's state")
    ok_b = _report("1F1B bubble", bubble, t["bubble"],
                   "one pipeline runs 1536 / dp micro-batches of one sequence; (p - 1) / (m + p - 1)")
    return ok_s and ok_b
