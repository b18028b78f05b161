"""Answer checks for the exercises of notebooks/11_training_through_failures.ipynb.

Each ``check_*`` compares a learner's number with the value worked out from the formulas of
:mod:`fault_tolerance.failures` and :mod:`fault_tolerance.labs.diloco_lab` (not from the assignment code), prints
whether it is right and, if not, a hint (:func:`course.exercise_checks.report`), and returns True or False.
"""
from __future__ import annotations

from course.exercise_checks import report
from fault_tolerance.failures import mttf_seconds, per_gpu_rate, young_interval
from fault_tolerance.labs.diloco_lab import ring_bytes_per_token


def check_mttf_hours(answer, gpus: int = 100_000) -> bool:
    """Exercise 1: the MTTF in hours of a job on ``gpus`` GPUs at Llama 3's unexpected-interruption rate."""
    expected = mttf_seconds(gpus, per_gpu_rate()) / 3600
    return report("MTTF (hours)", answer, expected, "MTTF = 1 / (N x r): r = 419 / (16,384 x 54) per GPU-day; "
                                                    "convert days to hours", rel=0.02)


def check_young_minutes(answer, checkpoint_seconds: float = 60.0, gpus: int = 100_000) -> bool:
    """Exercise 2: Young's checkpoint interval in minutes for that job and a checkpoint of ``checkpoint_seconds``."""
    expected = young_interval(checkpoint_seconds, mttf_seconds(gpus, per_gpu_rate())) / 60
    return report("checkpoint interval (minutes)", answer, expected, "tau* = sqrt(2 x C x MTTF), C and MTTF in "
                                                                     "seconds", rel=0.02)


def check_diloco_bytes_per_token(answer, parameter_bytes: float = 4 * 124e6, groups: int = 4,
                                 tokens_per_step: float = 4 * 512 * 1024, h: int = 100) -> bool:
    """Exercise 3: bytes one group sends across the groups per token with DiLoCo (ring all-reduce every H steps)."""
    expected = ring_bytes_per_token(parameter_bytes, groups, tokens_per_step, h)
    return report("DiLoCo bytes per token", answer, expected, "2 (p - 1) / p x the weights' bytes per sync, divided "
                                                              "by the tokens of H steps", rel=0.02)
