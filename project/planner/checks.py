"""Answer checks for the exercises of notebooks/09_plan_a_large_run.ipynb.

Each ``check_*`` compares a learner's answer with the value worked out here from the formulas (not from the
planner or the fake mesh), prints whether it is right and, if not, a hint, and returns True or False.
"""
from __future__ import annotations

from functools import partial

from course.exercise_checks import report

_report = partial(report, rel=1e-3, abs_tol=1e-12)  # course.exercise_checks: the one answer check


def check_zero3_state_bytes(answer) -> bool:
    """Exercise 1: a 7-billion-parameter model in mixed precision with Adam (2 + 2 + 12 bytes per parameter) under
    ZeRO-3 over N_d = 64 data-parallel ranks, no tensor or pipeline parallelism: bytes of model state per GPU?"""
    return _report("ZeRO-3 model state per GPU (bytes)", answer, (2 + 2 + 12) * 7e9 / 64,
                   "ZeRO-3 shards all three: (2 + 2 + K) Psi / N_d with K = 12 (Rajbhandari et al. 2020, Table 1)")


def check_rank_coordinates(answer) -> bool:
    """Exercise 2: in dp 32 x pp 4 x tp 8 (ranks ordered pp, dp, tp; tp fastest), rank 700's
    ``(stage, dp index, tp index)``?"""
    rank, dp, tp = 700, 32, 8
    expected = (rank // (dp * tp), rank // tp % dp, rank % tp)
    return _report("rank 700's (stage, dp, tp)", tuple(answer) if isinstance(answer, (list, tuple)) else answer,
                   expected, "tp varies fastest (rank % 8), then dp ((rank // 8) % 32), then pp (rank // 256)")


def check_bubble(answer) -> bool:
    """Exercise 3: the 1F1B bubble fraction of p = 4 stages and m = 16 micro-batches (idle time over the step)?"""
    p, m = 4, 16
    return _report("1F1B bubble fraction", answer, (p - 1) / (m + p - 1),
                   "(p - 1) / (m + p - 1): p - 1 slots of idle time per stage beside m slots of work "
                   "(Narayanan et al. 2021, Sec. 2.2)")


def check_micro_batches_for_bubble(answer) -> bool:
    """Exercise 4: with p = 8 stages, the fewest micro-batches m that bring the 1F1B bubble fraction to 10 % or
    less?"""
    p, m = 8, 1
    while (p - 1) / (m + p - 1) > 0.10 + 1e-12:
        m += 1
    return _report("fewest micro-batches for a 10 % bubble at p = 8", answer, m,
                   "solve (p - 1) / (m + p - 1) <= 0.1 for the smallest whole m")


def check_recomputed_activation_bytes(answer) -> bool:
    """Exercise 5: with every block recomputed, a stage keeps each block's input per micro-batch in flight
    (Korthikanti et al. 2022, Sec. 4.3). 8 blocks of width h = 4096, s = 4096 tokens, b = 1, bf16 (2 bytes), no
    sequence parallelism, 4 micro-batches in flight: bytes kept?"""
    return _report("checkpointed activations (bytes)", answer, 2 * 4096 * 1 * 4096 * 8 * 4,
                   "2 s b h bytes per block and micro-batch (the block's bf16 input), times blocks, times in flight")


def check_zero3_gathers_per_micro_batch(answer) -> bool:
    """Exercise 6: llama-7b (32 blocks) in dp 32 x pp 4 x tp 8 under ZeRO-3, each block a sharding unit: how many
    all-gathers does one rank's dp group make per micro-batch (the blocks of one stage)?"""
    blocks_per_stage = 32 // 4
    return _report("ZeRO-3 all-gathers per micro-batch on one stage", answer, 2 * blocks_per_stage,
                   "each block's weights are gathered before its forward pass and, freed in between, again before "
                   "its backward pass (Rajbhandari et al. 2020, Sec. 5.3): twice per block of the stage")
