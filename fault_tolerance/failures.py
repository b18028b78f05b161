"""Failures at scale: how often a large run is interrupted, and how often to checkpoint against it.

* **Failure rate.** A job of N GPUs stops when any of its parts fails. With independent failures at a rate of
  ``r`` per GPU per day (GPU, memory, host, network, software all counted per GPU), the job fails ``N r`` times a
  day and its mean time to failure is ``MTTF = 1 / (N r)`` — it shrinks linearly with the job's size.
* **The published rate.** Llama 3's pre-training on up to 16,384 H100 GPUs saw 466 job interruptions in a 54-day
  snapshot, 47 planned and 419 unexpected, about 78 % of the unexpected ones confirmed or suspected hardware
  (Dubey et al. 2024, "The Llama 3 Herd of Models", Sec. 3.3.4 and Table 5): 419 / (54 days x 16,384 GPUs) per
  GPU-day, one unexpected interruption every ~3 hours.
* **Checkpoint interval.** Checkpointing every ``τ`` seconds costs ``C`` seconds each time; a failure loses on
  average ``τ / 2`` seconds of work (plus the restart ``R``). The fraction of time wasted is about
  ``C / τ + (τ / 2 + R) / MTTF``, smallest at Young's interval ``τ* = sqrt(2 C MTTF)`` (Young 1974, "A first order
  approximation to the optimum checkpoint interval", CACM 17(9); Daly 2006, FGCS 22(3), Eq. 20 adds
  higher-order terms).
"""
from __future__ import annotations

import math

LLAMA3_GPUS = 16_384                 # Dubey et al. 2024, Sec. 3.3.4 (the job's size)
LLAMA3_DAYS = 54                     # the snapshot's length (same section)
LLAMA3_UNEXPECTED = 419              # unexpected interruptions in it (same section, Table 5)
LLAMA3_INTERRUPTIONS = 466           # all interruptions (47 planned: maintenance and the like)
SECONDS_PER_DAY = 86_400.0


def per_gpu_rate(interruptions: float = LLAMA3_UNEXPECTED, gpus: int = LLAMA3_GPUS,
                 days: float = LLAMA3_DAYS) -> float:
    """Interruptions per GPU per day: ``interruptions / (gpus x days)`` (default: Llama 3's unexpected ones)."""
    if gpus <= 0 or days <= 0:
        raise ValueError(f"gpus and days must be positive, not {gpus}, {days}")
    return interruptions / (gpus * days)


def failures_per_day(gpus: int, rate_per_gpu_day: float) -> float:
    """Expected interruptions per day of a job on ``gpus`` GPUs: ``gpus x rate`` (failures independent)."""
    return gpus * rate_per_gpu_day


def mttf_seconds(gpus: int, rate_per_gpu_day: float) -> float:
    """The job's mean time to failure in seconds: ``1 / (gpus x rate)`` days."""
    return SECONDS_PER_DAY / failures_per_day(gpus, rate_per_gpu_day)


def young_interval(checkpoint_seconds: float, mttf: float) -> float:
    """Young's optimal checkpoint interval ``sqrt(2 C MTTF)`` in seconds (Young 1974).

    Raises:
        ValueError: a cost or MTTF that is not positive.
    """
    if checkpoint_seconds <= 0 or mttf <= 0:
        raise ValueError(f"the checkpoint cost and the MTTF must be positive, not {checkpoint_seconds}, {mttf}")
    return math.sqrt(2 * checkpoint_seconds * mttf)


def wasted_fraction(interval: float, checkpoint_seconds: float, mttf: float, restart_seconds: float = 0.0) -> float:
    """First-order fraction of the run's time lost to checkpoints and failures when checkpointing every
    ``interval`` seconds: ``C / τ + (τ / 2 + R) / MTTF``."""
    return checkpoint_seconds / interval + (interval / 2 + restart_seconds) / mttf


def lost_per_failure(interval: float, restart_seconds: float, groups_stopped: float = 1.0) -> float:
    """GPU-time lost per failure as a fraction of the job (stop-the-world: every group, ``groups_stopped`` = 1)
    times seconds: ``groups_stopped x (τ / 2 + R)``. Per-step fault tolerance stops one group of G
    (``groups_stopped`` = 1 / G) and loses no committed step (``τ`` = 0)."""
    return groups_stopped * (interval / 2 + restart_seconds)
