"""The alpha-beta (latency-bandwidth) model of a message and the bus bandwidth of an all-reduce.

A message of N bytes takes ``t = alpha + beta * N``: alpha is the latency (seconds; start-up,
synchronisation, the software stack), beta the inverse bandwidth (seconds per byte)
(Hockney 1994; Thakur et al. 2005, Sec. 2). An all-reduce of N bytes over p ranks moves
``2 (p - 1) / p * N`` bytes per rank at best, so its *bus bandwidth*
``busbw = 2 (p - 1) / p * N / t`` (the figure nccl-tests reports) can be compared across
algorithms and group sizes against the link speed.
"""
from __future__ import annotations

import math


def bus_bandwidth(size_bytes: float, seconds: float, world_size: int) -> float:
    """Bus bandwidth of an all-reduce, bytes/s: ``size * 2 (p - 1) / p / seconds`` (0 for p = 1)."""
    return size_bytes * 2 * (world_size - 1) / world_size / seconds


def fit_alpha_beta(sizes_bytes: list[float], seconds: list[float]) -> tuple[float, float]:
    """Least-squares fit of ``t = alpha + beta * N`` to (size, time) points, in *relative* error.

    Each point is weighted by 1 / t (the residual is ``(alpha + beta N - t) / t``), so that
    the microsecond messages count as much as the 64 MB ones; an unweighted fit is decided by
    the largest messages alone and its alpha can even come out negative.

    Returns:
        ``(alpha, beta)``: seconds, seconds per byte.

    Raises:
        ValueError: fewer than two distinct sizes, or lengths differ.
    """
    if len(sizes_bytes) != len(seconds) or len(set(sizes_bytes)) < 2:
        raise ValueError("fit_alpha_beta needs at least two distinct message sizes and one time per size")
    # normal equations of min sum ((alpha + beta n) / t - 1)^2
    a11 = sum(1 / t**2 for t in seconds)
    a12 = sum(n / t**2 for n, t in zip(sizes_bytes, seconds))
    a22 = sum(n * n / t**2 for n, t in zip(sizes_bytes, seconds))
    b1 = sum(1 / t for t in seconds)
    b2 = sum(n / t for n, t in zip(sizes_bytes, seconds))
    det = a11 * a22 - a12 * a12
    return (b1 * a22 - b2 * a12) / det, (a11 * b2 - a12 * b1) / det


def crossover(fit_a: tuple[float, float], fit_b: tuple[float, float]) -> float | None:
    """Message size (bytes) where two fitted lines meet: below it the one with the smaller alpha is
    faster, above it the one with the smaller beta. None if they do not cross at a positive size."""
    (alpha_a, beta_a), (alpha_b, beta_b) = fit_a, fit_b
    if beta_a == beta_b:
        return None
    n = (alpha_b - alpha_a) / (beta_a - beta_b)
    return n if n > 0 and math.isfinite(n) else None


def measured_crossover(sizes_bytes: list[float], seconds_a: list[float], seconds_b: list[float]) -> float | None:
    """The smallest measured size from which ``a`` is at least as fast as ``b`` at every larger size
    (None if ``a`` is slower at the largest size)."""
    best = None
    for n, ta, tb in sorted(zip(sizes_bytes, seconds_a, seconds_b), reverse=True):
        if ta > tb:
            break
        best = n
    return best


def collective_seconds(kind: str, nbytes: float, p: int, alpha: float, beta: float, base: float = 0.0) -> float:
    """Seconds of one ``kind`` call about ``nbytes`` over ``p`` ranks with the ring algorithm on a link of
    ``alpha`` seconds per step and ``beta`` seconds per byte: ``base + steps * alpha + traffic * beta``,
    with ``steps`` (all-reduce ``2 (p - 1)``, all-gather / reduce-scatter / all-to-all ``p - 1``, send 1) and
    ``traffic`` (the bytes one rank sends, :func:`course.collectives.ring_traffic_bytes`) — Thakur et al.
    2005, Sec. 4; a ring all-reduce is ``2 (p - 1) (alpha + beta N / p)``. 0 for ``p = 1`` (no call).

    Raises:
        ValueError: an unknown kind.
    """
    from course.collectives import RING_STEPS, ring_traffic_bytes

    if kind not in RING_STEPS:
        raise ValueError(f"unknown communication kind {kind!r}; one of {tuple(RING_STEPS)}")
    if p <= 1 and kind not in ("send", "recv"):
        return 0.0
    return base + RING_STEPS[kind](p) * alpha + ring_traffic_bytes(kind, nbytes, p) * beta


def per_step_alpha_beta(alpha_fit: float, beta_fit: float, p: int) -> tuple[float, float]:
    """The per-step ``(alpha, beta)`` of a link from an all-reduce line ``t = alpha_fit + beta_fit N``
    fitted at ``p`` ranks (:func:`fit_alpha_beta`), such that :func:`collective_seconds` of an all-reduce
    of N bytes over ``p`` ranks is exactly ``alpha_fit + beta_fit N``:
    ``alpha = alpha_fit / (2 (p - 1))``, ``beta = beta_fit p / (2 (p - 1))``.

    Raises:
        ValueError: ``p`` < 2 (one rank all-reduces nothing).
    """
    if p < 2:
        raise ValueError(f"an all-reduce line needs p >= 2 ranks, not {p}")
    steps = 2 * (p - 1)
    return alpha_fit / steps, beta_fit * p / steps
