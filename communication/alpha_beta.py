"""The alpha-beta (latency-bandwidth) model of a message and the bus bandwidth of an all-reduce.

A message of N bytes takes ``t = alpha + beta * N``: alpha is the latency (seconds; start-up,
synchronisation, the software stack), beta the inverse bandwidth (seconds per byte)
(Hockney 1994; Thakur et al. 2005, Sec. 2). An all-reduce of N bytes over p ranks moves
``2 (p - 1) / p * N`` bytes per rank at best, so its *bus bandwidth*
``busbw = 2 (p - 1) / p * N / t`` (the figure nccl-tests reports) can be compared across
algorithms and group sizes against the link speed.
"""
from __future__ import annotations


def bus_bandwidth(size_bytes: float, seconds: float, world_size: int) -> float:
    """Bus bandwidth of an all-reduce, bytes/s: ``size * 2 (p - 1) / p / seconds`` (0 for p = 1)."""
    return size_bytes * 2 * (world_size - 1) / world_size / seconds


def fit_alpha_beta(sizes_bytes: list[float], seconds: list[float]) -> tuple[float, float]:
    """Least-squares fit of ``t = alpha + beta * N`` to (size, time) points, in *relative* error: the bare
    solve, coefficients as they came out (possibly negative). :func:`fit_line` adds the fit's quality, and
    :func:`communication.cost_model.fit_allreduce_model` turns the line into alpha and beta per step.

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


def fit_line(sizes_bytes: list[float], seconds: list[float]) -> dict:
    """:func:`fit_alpha_beta` with its quality (:func:`course.benchmarking.fit_quality`): the line
    ``t = intercept + slope * N`` of one whole call (an all-reduce of an algorithm whose steps are not
    modelled, such as ``dist.all_reduce``). ``intercept`` is seconds per *call*, not the alpha per step of
    :func:`communication.cost_model.fit_allreduce_model` (which divides it by the algorithm's steps).

    Nothing is clamped: a negative coefficient is reported as it came out, and the quality is ``failed``.

    Returns:
        ``{"intercept": s, "slope": s per byte, "predicted": [s per size], "quality": fit_quality(...)}``.

    Raises:
        ValueError: as :func:`fit_alpha_beta`, or a time that is not positive.
    """
    from course.benchmarking import fit_quality

    if any(not t > 0 for t in seconds):
        raise ValueError(f"measured times must be > 0 seconds, got {seconds}")
    a, b = fit_alpha_beta(list(sizes_bytes), list(seconds))
    predicted = [a + b * n for n in sizes_bytes]
    return {"intercept": a, "slope": b, "predicted": predicted,
            "quality": fit_quality(list(seconds), predicted, {"intercept": a, "slope": b})}


def readable_bytes(n: float | None, digits: int = 3) -> str:
    """``4194304`` -> ``"4 MiB"``, ``538412`` -> ``"526 KiB"`` (powers of 1024, named so: the benchmark's
    ``--sizes`` are binary; ``digits`` significant digits); ``None`` -> ``"none"``."""
    if n is None:
        return "none"
    for unit, size in (("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024)):
        if abs(n) >= size:
            return f"{float(f'{n / size:.{digits}g}'):g} {unit}"
    return f"{int(round(n))} B"


def measured_crossover(sizes_bytes: list[float], seconds_a: list[list[float]], seconds_b: list[list[float]],
                       names: tuple[str, str] = ("a", "b"), conditions=None) -> dict:
    """Where ``a`` starts to beat ``b``, from computed verdicts (:func:`course.benchmarking.compare`) of their
    side-by-side repeats at each measured size — never from medians alone.

    Args:
        sizes_bytes: the message sizes. seconds_a, seconds_b: per size, the per-repeat seconds of each
        (repeat k of both in the same round; at least three, seven for a verdict that can separate them).
        conditions: the measurement's machine record or conditions word, printed in every verdict.

    Returns:
        ``{"bytes", "kind", "verdicts": [compare(a, b) per size, ascending], "sentence"}``: ``kind`` is
        ``"crossover"`` (``bytes`` = the smallest size from which ``a`` is faster at every larger size, with a
        size below it where it is not), ``"never"`` (``a`` is not faster at the largest size; ``bytes`` None) or
        ``"always"`` (``a`` is faster at every size; ``bytes`` None: no crossover within the sizes measured);
        ``sentence`` says which, with the verdict that decides it.

    Raises:
        ValueError: lengths differ, or as ``compare`` (fewer than three repeats).
    """
    from course.benchmarking import compare

    if not len(sizes_bytes) == len(seconds_a) == len(seconds_b) or not sizes_bytes:
        raise ValueError("measured_crossover needs per-repeat times of both at every size")
    order = sorted(range(len(sizes_bytes)), key=lambda i: sizes_bytes[i])
    sizes = [sizes_bytes[i] for i in order]
    verdicts = [compare(list(seconds_a[i]), list(seconds_b[i]), names, conditions=conditions) for i in order]
    k = len(sizes)
    while k > 0 and verdicts[k - 1]["verdict"] == "faster":
        k -= 1
    a, b = names
    if k == len(sizes):
        return {"bytes": None, "kind": "never", "verdicts": verdicts,
                "sentence": f"no measured crossover: at the largest size, {readable_bytes(sizes[-1])}, "
                            f"{verdicts[-1]['sentence']}"}
    if k == 0:
        return {"bytes": None, "kind": "always", "verdicts": verdicts,
                "sentence": f"no crossover within the sizes measured: {a} is faster than {b} at every size, from "
                            f"{readable_bytes(sizes[0])}"}
    return {"bytes": sizes[k], "kind": "crossover", "verdicts": verdicts,
            "sentence": f"measured crossover at {readable_bytes(sizes[k])}: {a} is faster than {b} from there on; "
                        f"at {readable_bytes(sizes[k - 1])}, {verdicts[k - 1]['sentence']}"}


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


def hierarchical_seconds(kind: str, nbytes: float, p: int, members: int, intra, inter) -> float:
    """Seconds of one ``kind`` call about ``nbytes`` over a group of ``p`` ranks laid out ``members`` per node
    on ``p / members`` nodes: ``intra`` and ``inter`` are links (``alpha``, ``beta``, ``base``, as
    :class:`course.hardware.Link`). A group inside one node (``members == p``) uses ``intra`` only, a group
    with one member per node ``inter`` only (flat rings, :func:`collective_seconds`); otherwise the
    collective runs in levels, each level a ring (the hierarchical all-reduce of NCCL's tree/CollNet and of
    Horovod; Thakur et al. 2005, Sec. 4; Sanders et al. 2019, Sec. 13.2), with g = ``members`` and
    n = ``p / members`` nodes:

    * all-reduce: reduce-scatter of N inside the node (g ranks), all-reduce of N / g across the nodes (n
      ranks; the g such rings of a node run at once, each on its GPU's own network port), all-gather of N
      inside the node;
    * reduce-scatter: reduce-scatter of N inside the node, then of N / g across the nodes;
    * all-gather: all-gather of N / g across the nodes, then of N inside the node;
    * all-to-all, send, recv: the network's flat cost (most bytes leave the node).

    Returns 0 for ``p = 1`` (no call), as :func:`collective_seconds`.

    Raises:
        ValueError: an unknown kind, or ``members`` that does not divide ``p``.
    """
    if p <= 1 and kind not in ("send", "recv"):
        return 0.0
    if members < 1 or p % members:
        raise ValueError(f"{members} members per node do not divide a group of {p} ranks")
    nodes = p // members

    def ring(k, n, size, link):
        return collective_seconds(k, n, size, link.alpha, link.beta, link.base)

    if nodes == 1 or inter is None:
        return ring(kind, nbytes, p, intra)
    if members == 1 or kind in ("all_to_all", "send", "recv"):
        return ring(kind, nbytes, p, inter)
    g = members
    if kind == "all_reduce":
        return (ring("reduce_scatter", nbytes, g, intra) + ring("all_reduce", nbytes / g, nodes, inter)
                + ring("all_gather", nbytes, g, intra))
    if kind == "reduce_scatter":
        return ring("reduce_scatter", nbytes, g, intra) + ring("reduce_scatter", nbytes / g, nodes, inter)
    if kind == "all_gather":
        return ring("all_gather", nbytes / g, nodes, inter) + ring("all_gather", nbytes, g, intra)
    return ring(kind, nbytes, p, inter)
