"""The alpha-beta cost of an all-reduce per algorithm, fitted to measured times; nccl-tests' bandwidths; links.

**The model** (Hockney 1994; Thakur, Rabenseifner & Gropp 2005, Sec. 2): one message of m bytes takes
``alpha + beta * m`` — alpha the latency of a step (seconds), beta the inverse bandwidth of the link
(seconds per byte). An all-reduce algorithm of n bytes on p ranks is a chain of ``steps(p)`` messages
that carry ``factor(p) * n`` bytes one after another, so

    T(n) = alpha * steps(p) + beta * factor(p) * n

* **ring** (reduce-scatter then all-gather; Patarasuk & Yuan 2009): ``2 (p - 1)`` steps of ``n / p``
  bytes: ``steps = 2 (p - 1)``, ``factor = 2 (p - 1) / p``;
* **recursive doubling** (Thakur et al. 2005, Sec. 4; :func:`communication.ring.tree_all_reduce`):
  ``log2 q`` exchanges of the whole tensor (q the largest power of two <= p), plus, when p is not a power
  of two, one message to fold the extra ranks in and one to send them the result:
  ``steps = factor = log2 q (+ 2)``.

Fewer steps (recursive doubling) win for small messages, fewer bytes (the ring) for large ones; the two
cost lines cross at :func:`predicted_crossover`.

**Fits, verdicts, replays** (the measurement protocol of :mod:`course.benchmarking`): every fit carries its
quality (:func:`course.benchmarking.fit_quality`; a coefficient that came out negative means it failed), and
nothing is predicted from a failed fit (:func:`crossover_prediction`); the measured crossover comes from
computed verdicts per size (:func:`communication.alpha_beta.measured_crossover`), and
:func:`crossover_agreement` says whether the two agree. A world size the machine cannot run without more
busy ranks than cores is replayed (:func:`replay_allreduce`) from the link fitted at a smaller one.

**Bandwidths as nccl-tests reports them** (NVIDIA/nccl-tests, doc/PERFORMANCE.md): the *algorithm
bandwidth* ``algbw = S / t`` (S the message size in bytes, t the time), and the *bus bandwidth*
``busbw = algbw * factor``, with factor ``2 (p - 1) / p`` for all-reduce, ``(p - 1) / p`` for
reduce-scatter, all-gather and all-to-all, 1 for broadcast and reduce: the speed each rank's link ran at,
comparable with the hardware's peak whatever p is.

**Links** (:data:`LINKS`): published per-direction bandwidths and NCCL's own per-step latencies, each with
its source, for predicting what a gradient all-reduce costs on a GPU cluster
(:func:`gpt2_parameter_count`).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from communication.alpha_beta import fit_alpha_beta, measured_crossover, readable_bytes

ALGORITHMS = ("ring", "recursive_doubling")
BUS_FACTORS = {"all_reduce": lambda p: 2 * (p - 1) / p, "reduce_scatter": lambda p: (p - 1) / p,
               "all_gather": lambda p: (p - 1) / p, "all_to_all": lambda p: (p - 1) / p,
               "broadcast": lambda p: 1.0, "reduce": lambda p: 1.0}


def _check(algorithm: str, p: int) -> None:
    if algorithm not in ALGORITHMS:
        raise ValueError(f"algorithm must be one of {ALGORITHMS}, not {algorithm!r}")
    if int(p) != p or p < 2:
        raise ValueError(f"an all-reduce needs p >= 2 ranks (an integer), not {p!r}")


def allreduce_steps(algorithm: str, p: int) -> int:
    """Messages one after another on the critical path of an all-reduce on ``p`` ranks (see the module).

    Raises:
        ValueError: unknown ``algorithm`` (:data:`ALGORITHMS`) or ``p < 2``.
    """
    _check(algorithm, p)
    if algorithm == "ring":
        return 2 * (p - 1)
    q = 1 << (p.bit_length() - 1)
    return int(math.log2(q)) + (2 if q != p else 0)


def allreduce_bytes_factor(algorithm: str, p: int) -> float:
    """Bytes sent one after another on the critical path, per byte of the message (see the module).

    Raises:
        ValueError: as :func:`allreduce_steps`.
    """
    _check(algorithm, p)
    if algorithm == "ring":
        return 2 * (p - 1) / p
    return float(allreduce_steps(algorithm, p))  # every step carries the whole tensor


def allreduce_schedule(algorithm: str, p: int, size_bytes: float) -> list[float]:
    """The messages on the critical path of an all-reduce of ``size_bytes`` on ``p`` ranks, in order: bytes per
    step (``len`` = :func:`allreduce_steps`, ``sum`` = :func:`allreduce_bytes_factor` times the size). The ring
    sends ``n / p`` in each of its ``2 (p - 1)`` steps; recursive doubling the whole tensor in each exchange,
    with a fold-in message before and a result message after when p is not a power of two (see the module).

    Raises:
        ValueError: as :func:`allreduce_steps`.
    """
    steps = allreduce_steps(algorithm, p)
    if algorithm == "ring":
        return [size_bytes / p] * steps
    return [float(size_bytes)] * steps


def predict_allreduce(algorithm: str, size_bytes: float, p: int, alpha: float, beta: float) -> float:
    """Seconds of an all-reduce of ``size_bytes`` on ``p`` ranks: ``alpha * steps + beta * factor * size``.

    Args:
        alpha: seconds per step. beta: seconds per byte (1 / bandwidth of one direction of a link).

    Raises:
        ValueError: as :func:`allreduce_steps`.
    """
    return alpha * allreduce_steps(algorithm, p) + beta * allreduce_bytes_factor(algorithm, p) * size_bytes


def fit_allreduce_model(algorithm: str, p: int, sizes_bytes: list[float], seconds: list[float]) -> dict:
    """Least-squares fit of ``T(n) = alpha * steps(p) + beta * factor(p) * n`` to measured times, with its
    quality (:func:`course.benchmarking.fit_quality`).

    The line ``a + b n`` is fitted in relative error (:func:`communication.alpha_beta.fit_alpha_beta`:
    the small messages count as much as the large ones), then ``alpha = a / steps`` (seconds per *step*:
    the line's intercept ``a`` is the latency of a whole all-reduce, ``steps`` of them) and
    ``beta = b / factor``. A coefficient that comes out negative (noise can make one: a flat or falling set
    of times) means the model does not describe these points: the fit is ``failed``. The model's line is
    then drawn with that coefficient set to 0 and the other refitted alone (``clamped`` names it), but
    nothing derived from it — a bandwidth, a crossover — is a prediction (:func:`crossover_prediction`).

    Args:
        sizes_bytes: message sizes (bytes), at least two distinct. seconds: one time per size (a median).

    Returns:
        ``{"alpha": s per step, "beta": s per byte, "bandwidth": 1 / beta (bytes/s; None when beta is 0),
        "intercept": a (s per all-reduce), "steps", "factor", "alpha_arithmetic": the division written out,
        "unconstrained": {"alpha", "beta"} as the least-squares solve gave them, "predicted": [s per size],
        "ratio": [measured / predicted per size], "clamped": None | "alpha" | "beta", "quality":
        fit_quality(...) ({"quality": good | poor | failed, "reason", "residuals", "worst_factor"})}``.

    Raises:
        ValueError: as :func:`allreduce_steps`, or as ``fit_alpha_beta`` (fewer than two sizes, lengths differ),
        or a time that is not positive.
    """
    from course.benchmarking import fit_quality

    steps, factor = allreduce_steps(algorithm, p), allreduce_bytes_factor(algorithm, p)
    if any(not t > 0 for t in seconds):
        raise ValueError(f"measured times must be > 0 seconds, got {seconds}")
    a, b = fit_alpha_beta(list(sizes_bytes), list(seconds))
    unconstrained = {"alpha": a / steps, "beta": b / factor}
    clamped = None
    if b < 0:  # only a latency: the a minimising sum (a / t - 1)^2
        a, b, clamped = sum(1 / t for t in seconds) / sum(1 / t**2 for t in seconds), 0.0, "beta"
    elif a < 0:  # only a bandwidth term: the b minimising sum (b n / t - 1)^2
        a, b, clamped = 0.0, sum(n / t for n, t in zip(sizes_bytes, seconds)) / sum(
            (n / t) ** 2 for n, t in zip(sizes_bytes, seconds)), "alpha"
    alpha, beta = a / steps, b / factor
    predicted = [predict_allreduce(algorithm, n, p, alpha, beta) for n in sizes_bytes]
    quality = fit_quality(list(seconds), predicted, {"alpha": alpha, "beta": beta},
                          clamped=(clamped,) if clamped else ())
    return {"alpha": alpha, "beta": beta, "bandwidth": 1 / beta if beta > 0 else None, "intercept": a,
            "steps": steps, "factor": factor,
            "alpha_arithmetic": f"alpha per step = intercept / steps = {a * 1e6:.1f} us / {steps} = "
                                f"{alpha * 1e6:.1f} us",
            "unconstrained": unconstrained, "predicted": predicted,
            "ratio": [t / m if m > 0 else math.inf for t, m in zip(seconds, predicted)], "clamped": clamped,
            "quality": quality}


def predicted_crossover(p: int, alpha: float, beta: float) -> float | None:
    """Message size (bytes) above which the ring is faster than recursive doubling on ``p`` ranks, for a
    link of latency ``alpha`` (s per step) and inverse bandwidth ``beta`` (s per byte): where
    ``alpha * steps_ring + beta * factor_ring * n = alpha * steps_rd + beta * factor_rd * n``.

    None when the lines do not cross at a positive size: e.g. p = 2 (both send n bytes, recursive doubling in
    one step instead of two, so it is never slower in the model), or ``beta = 0``. For (alpha, beta) that come
    from a fit, use :func:`crossover_prediction`, which predicts nothing from a failed fit and says why.

    Raises:
        ValueError: ``p < 2``, or a negative ``alpha`` or ``beta``.
    """
    if alpha < 0 or beta < 0:
        raise ValueError(f"alpha and beta must be >= 0, got alpha={alpha}, beta={beta}")
    extra_steps = allreduce_steps("ring", p) - allreduce_steps("recursive_doubling", p)
    saved_bytes = allreduce_bytes_factor("recursive_doubling", p) - allreduce_bytes_factor("ring", p)
    if beta == 0 or saved_bytes <= 0 or extra_steps <= 0:
        return None
    return alpha * extra_steps / (beta * saved_bytes)


def crossover_prediction(p: int, fit: dict) -> dict:
    """The model's ring/recursive-doubling crossover on ``p`` ranks from a fit (:func:`fit_allreduce_model`),
    as a value and a sentence that agree: ``{"bytes": float | None, "failed": bool, "sentence"}``. From a fit that is
    not good the sentence gives its figures to one significant digit and says why (an order of magnitude only).

    ``bytes`` is None, with the reason in ``sentence``, when the fit failed (a coefficient came out negative:
    nothing is predicted from it) or when the model's lines do not cross (:func:`predicted_crossover`: p = 2,
    where recursive doubling sends the same bytes in fewer steps).

    Raises:
        ValueError: ``p < 2``.
    """
    if fit["quality"]["quality"] == "failed":
        return {"bytes": None, "failed": True, "sentence": f"no crossover predicted: {fit['quality']['reason']}"}
    x = predicted_crossover(p, fit["alpha"], fit["beta"])
    if x is None:
        if allreduce_bytes_factor("recursive_doubling", p) <= allreduce_bytes_factor("ring", p):
            why = (f"at p = {p} recursive doubling sends no more bytes than the ring, in "
                   f"{allreduce_steps('recursive_doubling', p)} step(s) to its {allreduce_steps('ring', p)}, so the "
                   f"ring is never faster in the model")
        else:
            why = "beta is 0: the model has no bandwidth term for the ring to save"
        return {"bytes": None, "failed": False, "sentence": f"the model predicts no crossover: {why}"}
    digits = 3 if fit["quality"]["quality"] == "good" else 1  # a poor fit: an order of magnitude only
    caveat = "" if digits == 3 else ", to one digit: from a poor fit only an order of magnitude"
    sig = lambda v: f"{float(f'{v:.{digits}g}'):g}"  # noqa: E731
    return {"bytes": x, "failed": False,
            "sentence": f"the model predicts the ring faster than recursive doubling above "
                        f"{readable_bytes(x, digits)} (alpha = {sig(fit['alpha'] * 1e6)} us per step, "
                        f"1/beta = {sig(fit['bandwidth'] / 1e9)} GB/s; {fit['quality']['reason']}{caveat})"}


def crossover_agreement(model: dict, measured: dict | None, sizes_bytes: list[float],
                        conditions: str | None = None) -> dict:
    """Does the model predict the measured crossover? ``model``: :func:`crossover_prediction`;
    ``measured``: :func:`communication.alpha_beta.measured_crossover` of the ring against recursive doubling
    (None: not measured, e.g. a replayed world size); ``sizes_bytes``: the measured sizes.

    The answer is ``agrees`` when the prediction falls in the size grid's interval the measurement points to
    (above the size before the measured crossover and at most it; beyond the largest size when the ring was
    never faster; at most the smallest when it always was; no crossover when the ring was never faster),
    ``disagrees`` otherwise, and ``cannot say`` when nothing was predicted from a failed fit, nothing was
    measured, or the measurement's ``conditions`` (:func:`course.benchmarking.conditions`) were
    ``oversubscribed`` (more busy ranks than cores: the times hold the scheduler's delays, not the link's), or
    the ring was never faster only because the largest size's verdict is ``indistinguishable`` (an agreement
    would rest on no evidence); a ``loaded`` measurement's answer says so in its sentence.

    Returns:
        ``{"answer": "agrees" | "disagrees" | "cannot say", "sentence"}``.
    """
    if measured is None:
        return {"answer": "cannot say", "sentence": "cannot say whether the model predicts the crossover: "
                                                    "it was not measured here"}
    if conditions == "oversubscribed":
        return {"answer": "cannot say", "sentence": "cannot say whether the model predicts the crossover: the "
                                                    "times were measured with more busy ranks than cores"}
    if model["failed"]:
        return {"answer": "cannot say", "sentence": "cannot say whether the model predicts the crossover: "
                                                    + model["sentence"]}
    sizes, x, kind = sorted(sizes_bytes), model["bytes"], measured["kind"]
    last = (measured.get("verdicts") or [{}])[-1].get("verdict")
    if kind == "never" and last == "indistinguishable":
        return {"answer": "cannot say", "sentence": "cannot say whether the model predicts the crossover: at the "
                                                    f"largest size, {readable_bytes(sizes[-1])}, the two were "
                                                    "indistinguishable, so the measurement neither shows the ring "
                                                    "slower there nor a crossover"}
    if x is None:
        ok = kind == "never"
    elif kind == "never":
        ok = x > sizes[-1]
    elif kind == "always":
        ok = x <= sizes[0]
    else:
        below = max(s for s in sizes if s < measured["bytes"])
        ok = below < x <= measured["bytes"]
    want = "none" if x is None else readable_bytes(x)
    got = {"never": f"none up to {readable_bytes(sizes[-1])}", "always": f"at or below {readable_bytes(sizes[0])}",
           "crossover": f"at {readable_bytes(measured.get('bytes'))}"}[kind]
    answer = "agrees" if ok else "disagrees"
    caveat = "; measured on a loaded machine: a quiet one may give other verdicts" if conditions == "loaded" else ""
    return {"answer": answer, "sentence": f"the model {answer} with the measurement within the size grid "
                                          f"(predicted {want}, measured {got}{caveat})"}


# ---- bandwidths as nccl-tests reports them -----------------------------------------------------------

def algorithm_bandwidth(size_bytes: float, seconds: float) -> float:
    """``algbw = S / t`` in bytes/s (nccl-tests, doc/PERFORMANCE.md, "Algorithm bandwidth").

    Raises:
        ValueError: ``seconds <= 0``.
    """
    if not seconds > 0:
        raise ValueError(f"a time must be > 0 seconds, not {seconds}")
    return size_bytes / seconds


def bus_bandwidth_factor(collective: str, p: int) -> float:
    """nccl-tests' correction from algorithm to bus bandwidth (doc/PERFORMANCE.md, "Summary"):
    all_reduce ``2 (p - 1) / p``; reduce_scatter, all_gather, all_to_all ``(p - 1) / p``; broadcast, reduce 1.

    Raises:
        ValueError: unknown collective, or ``p < 1``.
    """
    if collective not in BUS_FACTORS:
        raise ValueError(f"collective must be one of {sorted(BUS_FACTORS)}, not {collective!r}")
    if p < 1:
        raise ValueError(f"p must be >= 1 rank, not {p}")
    return BUS_FACTORS[collective](p)


def nccl_bus_bandwidth(size_bytes: float, seconds: float, p: int, collective: str = "all_reduce") -> float:
    """``busbw = algbw * factor`` in bytes/s (nccl-tests, doc/PERFORMANCE.md, "Bus bandwidth"). For an
    all-reduce this is :func:`communication.alpha_beta.bus_bandwidth`.

    Raises:
        ValueError: as :func:`algorithm_bandwidth` and :func:`bus_bandwidth_factor`.
    """
    return algorithm_bandwidth(size_bytes, seconds) * bus_bandwidth_factor(collective, p)


# ---- links between GPUs -------------------------------------------------------------------------------

@dataclass(frozen=True)
class Link:
    """One kind of link between ranks: ``bandwidth`` bytes/s in one direction per GPU, ``alpha`` seconds per
    step of a ring all-reduce, and where each figure comes from."""

    name: str
    bandwidth: float
    alpha: float
    bandwidth_source: str
    alpha_source: str

    @property
    def beta(self) -> float:
        """Seconds per byte: 1 / bandwidth."""
        return 1 / self.bandwidth


NCCL_TUNING = ("NCCL's own cost model, src/graph/tuning.cc (hwLat table, ring algorithm, Simple protocol, "
               "the protocol of large messages; recent releases; the LL protocol of small messages has 0.6 / 1.0 / "
               "2.7 us)")
LINKS = {
    "NVLink 4 (H100 SXM)": Link(
        "NVLink 4 (H100 SXM)", 900e9 / 2, 3.4e-6,
        "NVIDIA H100 Tensor Core GPU datasheet: NVLink 900 GB/s per GPU, both directions together (450 GB/s each way)",
        NCCL_TUNING + ": 3.4 us per step over NVLink"),
    "PCIe Gen5 x16": Link(
        "PCIe Gen5 x16", 16 * 32e9 * 128 / 130 / 8, 5.7e-6,
        "PCI-SIG, PCI Express Base Specification 5.0: 32 GT/s per lane, 128b/130b encoding; 16 lanes = 63 GB/s "
        "each way",
        NCCL_TUNING + ": 5.7 us per step over PCI"),
    "InfiniBand NDR (1 NIC per GPU)": Link(
        "InfiniBand NDR (1 NIC per GPU)", 400e9 / 8, 14.0e-6,
        "NVIDIA ConnectX-7 datasheet: InfiniBand NDR 400 Gb/s per port (50 GB/s each way); DGX H100 has one "
        "such port per GPU",
        NCCL_TUNING + ": 14 us per step over the network"),
}


def gpt2_parameter_count(vocab_size: int = 50257, n_positions: int = 1024, n_embd: int = 768,
                         n_layer: int = 12) -> int:
    """Parameters of GPT-2 (Radford et al. 2019; the embedding tied to the output layer), by the layer shapes:
    token and position embeddings, per block two LayerNorms (weight, bias), the attention's fused QKV
    (h x 3h) and output (h x h) projections and the MLP (h x 4h, 4h x h), all with biases; a final LayerNorm.
    The defaults are GPT-2 small, "124M": 124,439,808."""
    h = n_embd
    block = 2 * 2 * h + (h * 3 * h + 3 * h) + (h * h + h) + (h * 4 * h + 4 * h) + (4 * h * h + h)
    return vocab_size * h + n_positions * h + n_layer * block + 2 * h


# ---- the model against a benchmark run ----------------------------------------------------------------

BENCHMARK_NAMES = {"ring": "ring", "recursive_doubling": "tree"}  # project/tools/benchmark.py's names


def fit_benchmark(allreduce_report: dict, p: int) -> dict:
    """Fit the model to the ring's median times of one world size of ``project/tools/benchmark.py``'s report
    (``["allreduce"][str(p)]``), predict both algorithms from that one (alpha, beta), and compare the two
    algorithms size by size (:func:`course.benchmarking.compare` of their side-by-side repeats).

    Returns:
        ``{"p", "replayed": False, "sizes": [bytes], "machine": the world size's machine record (or None),
        "fit": fit_allreduce_model(ring), "prediction_quality": fit_quality of recursive doubling's measured
        medians against the model's prediction for it (nothing fitted to them),
        "algorithms": {name: {"median", "min", "max", "all", "model", "ratio"}},
        "crossover_model": crossover_prediction(p, fit), "crossover_measured": measured_crossover(ring, recursive
        doubling), "crossover_agreement": crossover_agreement(...)}``, times in seconds. ``ratio`` is measured /
        model.

    Raises:
        KeyError: the report lacks the ring or the tree, or their per-repeat times (``"all"``).
    """
    from course.benchmarking import fit_quality

    algos = allreduce_report["algorithms"]
    sizes = sorted(int(s) for s in algos["ring"]["points"])
    out = {"p": p, "replayed": False, "sizes": sizes, "machine": allreduce_report.get("machine"), "algorithms": {}}
    for name, bench_name in BENCHMARK_NAMES.items():
        pts = [algos[bench_name]["points"][str(s)] for s in sizes]
        out["algorithms"][name] = {k: [pt[k] for pt in pts] for k in ("median", "min", "max", "all")}
    ring = out["algorithms"]["ring"]["median"]
    out["fit"] = fit = fit_allreduce_model("ring", p, sizes, ring)
    for name, per in out["algorithms"].items():
        per["model"] = [predict_allreduce(name, n, p, fit["alpha"], fit["beta"]) for n in sizes]
        per["ratio"] = [t / m if m > 0 else math.inf for t, m in zip(per["median"], per["model"])]
    rd = out["algorithms"]["recursive_doubling"]
    out["prediction_quality"] = fit_quality(rd["median"], rd["model"], {"alpha": fit["alpha"], "beta": fit["beta"]},
                                            clamped=(fit["clamped"],) if fit["clamped"] else ())
    out["crossover_model"] = crossover_prediction(p, fit)
    out["crossover_measured"] = measured_crossover(sizes, out["algorithms"]["ring"]["all"], rd["all"],
                                                   ("ring", "recursive doubling"), out["machine"])
    out["crossover_agreement"] = crossover_agreement(out["crossover_model"], out["crossover_measured"], sizes,
                                                     (out["machine"] or {}).get("conditions"))
    return out


def replay_allreduce(fit: dict, p: int, sizes_bytes: list[float], source_p: int) -> dict:
    """Seconds of both algorithms on ``p`` ranks *replayed* from a link measured at ``source_p`` ranks: each
    algorithm's schedule (:func:`allreduce_schedule`) walked message by message, every message costing
    ``alpha + beta * m`` with the per-step (alpha, beta) of ``fit`` (:func:`fit_allreduce_model` at
    ``source_p``, e.g. 2 ranks on 2 quiet cores). For a world size the machine cannot run without
    oversubscribing its cores, this is what the model predicts on a machine with a core (or a GPU) per rank;
    nothing here is measured at ``p``.

    Returns:
        ``{"p", "replayed": True, "source_p", "sizes", "fit": fit, "algorithms": {name: {"median": [s per size],
        "model": [s per size]}} ({} when the source fit failed), "crossover_model": crossover_prediction(p, fit),
        "crossover_measured": None, "crossover_agreement": crossover_agreement(..., None, ...), "sentence"}``.

    Raises:
        ValueError: as :func:`allreduce_steps`.
    """
    sizes = sorted(sizes_bytes)
    out = {"p": p, "replayed": True, "source_p": source_p, "sizes": sizes, "fit": fit, "algorithms": {},
           "crossover_model": crossover_prediction(p, fit), "crossover_measured": None}
    out["crossover_agreement"] = crossover_agreement(out["crossover_model"], None, sizes)
    if fit["quality"]["quality"] == "failed":
        out["sentence"] = (f"p = {p} not replayed: the fit at p = {source_p} it would replay failed "
                           f"({fit['quality']['reason']})")
        return out
    for name in ALGORITHMS:
        times = [sum(fit["alpha"] + fit["beta"] * m for m in allreduce_schedule(name, p, n)) for n in sizes]
        out["algorithms"][name] = {"median": times, "model": times}
    out["sentence"] = (f"p = {p} replayed (not measured): {allreduce_steps('ring', p)} ring steps of n/{p} bytes and "
                       f"{allreduce_steps('recursive_doubling', p)} recursive-doubling steps of n bytes, each costing "
                       f"alpha + beta m with the link fitted at p = {source_p} ({fit['quality']['reason']})")
    return out
