"""The one benchmark harness: warm-up, repeats, median and spread, the machine, JSON, the command line.

Every benchmark of the course (``project/tools/benchmark.py``, ``python -m pipeline.labs.schedule_benchmark``,
``python -m three_d.labs.factorisation_benchmark``) and every repeated measurement in the notebooks' workers
measures the same way (docs/architecture.md, "The benchmark harness"):

* **warm-up, then repeats** — :func:`interleaved` runs each variant ``warmup`` times untimed (memory
  allocation, first calls), then ``repeats`` rounds in which the variants take turns, so a change in the
  machine's load touches all of them alike; :func:`timed` times one call on the slowest rank of a group
  (a barrier first, then :func:`course.measure.now`: on a GPU after the device's queued work);
* **median and spread** — :func:`summarise` (``median``, ``min``, ``max``, ``n``, ``all``) of at least
  :data:`MIN_REPEATS` repeats; a comparison is a ratio taken per repeat, side by side (:func:`ratios`);
* **the machine** — :func:`machine`: cores, CPU model, device, torch and Python versions, the load
  average when the benchmark started and the ranks it keeps busy; :func:`finish` adds the load average after
  and the run's conditions (:func:`conditions`: ``quiet`` only when the busy ranks and the other processes'
  runnable threads fit the cores at the start and at the end; else ``loaded`` or ``oversubscribed``);
* **verdicts** — :func:`compare` turns two variants' side-by-side repeats into a computed verdict from
  their **paired** per-repeat ratios (``faster`` or ``slower`` when an exact sign test of the ratios against 1
  rejects at the stated confidence, else ``indistinguishable``; two ranges that overlap decide nothing by
  themselves) and a ``verdict:`` line that says it with its numbers and the run's conditions
  (``project/tools/check_notebooks.py`` reads those lines back); :func:`fit_quality` says whether a fit held
  (residuals; a coefficient that came out negative or was clamped means it failed). Prose and plot titles
  print these, never a winner of their own;
* **rates** — :func:`machine_peak_flops` measures the matrix-product rate this machine reaches, and
  :func:`check_rate` refuses a compute rate above it (a rate measured per rank, times the ranks that ran at
  once, cannot exceed what the whole machine does);
* **JSON** — :func:`write_report` writes ``{"machine", "config", ...results}`` atomically;
* **the command line** — :func:`parser` gives every benchmark the same options for the same thing
  (``--device``, ``--repeats``, ``--warmup``, ``--out``, ``--timeout``, ``--steps``); the options a run also has
  (mesh sizes, ``--micro_batches``, ``--seq_len``, ``--vocab_size``, ...) come from the run configuration's one
  table (:func:`option`, :class:`course.config.RunConfig`), and :func:`check` validates before any process
  starts.
"""
from __future__ import annotations

import argparse
import math
import os
import platform
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Callable

import torch

from course.measure import now, timer_name

MIN_REPEATS = 3  # a median and a spread need three points
CONFIDENCE = 0.95  # of every verdict: an exact two-sided sign test at 1 - CONFIDENCE
# others_running is the mean of five readings of the kernel's runnable count: below half a thread, most readings
# saw no other runnable thread. A busy rank and a thread of another process on the same core share it.
SAMPLING_SLACK = 0.5


# ---- statistics -----------------------------------------------------------------------------------

def summarise(values: list[float]) -> dict:
    """``{"median", "min", "max", "n", "all"}`` of ``values`` (seconds, tokens/s, ...).

    Raises:
        ValueError: no values.
    """
    values = [float(v) for v in values]
    if not values:
        raise ValueError("nothing to summarise: no repeat was measured")
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "n": len(values),
            "all": values}


def ratios(numerators: list[float], denominators: list[float]) -> dict:
    """:func:`summarise` of the per-repeat ratios ``a / b`` of two variants measured side by side (repeat k
    of each ran in the same round of :func:`interleaved`).

    Raises:
        ValueError: the lists differ in length.
    """
    if len(numerators) != len(denominators):
        raise ValueError(f"ratios of {len(numerators)} and {len(denominators)} repeats: measure both side by side")
    return summarise([a / b for a, b in zip(numerators, denominators)])


def apart(a: dict, b: dict) -> bool:
    """Whether two :func:`summarise` results' ranges do not overlap (every repeat of one beat every repeat
    of the other)."""
    return a["min"] > b["max"] or b["min"] > a["max"]


# ---- timing -----------------------------------------------------------------------------------------

def slowest(seconds: float, group=None) -> float:
    """The largest of every rank's ``seconds`` in ``group`` (a host tensor over gloo: a timing the host
    holds); ``seconds`` itself without a process group."""
    import torch.distributed as dist

    if not dist.is_initialized():
        return seconds
    t = torch.tensor([seconds], dtype=torch.float64, device="cpu")
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group)
    return float(t)


def timed(fn: Callable[[], object], device=None, group=None) -> float:
    """Seconds of ``fn()`` on the slowest rank of ``group``: a barrier in ``group``, then the clock of
    :func:`course.measure.now` around the call (on a GPU, its work to completion). Without a process group:
    this process's seconds. Collective over ``group``."""
    import torch.distributed as dist

    if dist.is_initialized():
        dist.barrier(group=group)
    start = now(device)
    fn()
    return slowest(now(device) - start, group)


def interleaved(variants: dict[str, Callable[[], object]], repeats: int, warmup: int = 1, device=None, group=None,
                inner: int = 1) -> dict[str, list[float]]:
    """Seconds per call of each variant: ``warmup`` untimed calls of each, then ``repeats`` rounds in which
    every variant is timed in turn over ``inner`` calls (:func:`timed`, slowest rank of ``group``).

    Returns:
        ``{name: [seconds per call, one per repeat]}``.
    """
    for fn in variants.values():
        for _ in range(warmup):
            fn()
    out: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(repeats):
        for name, fn in variants.items():
            out[name].append(timed(lambda: [fn() for _ in range(inner)], device, group) / inner)
    return out


# ---- the machine ------------------------------------------------------------------------------------

def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine(device=None, busy_ranks: int | None = None) -> dict:
    """What the numbers were measured on: ``cores`` (``os.cpu_count``), ``usable_cores`` (this process's
    CPU affinity), ``cpu_model``, ``device`` and ``gpu`` (name and count on CUDA), ``torch``, ``python``,
    ``platform``, ``load_average`` (1, 5, 15 minutes, when this was called — call it before the ranks start,
    so that it is the load of *other* processes), ``timer`` (:func:`course.measure.timer_name`), and, when
    given, ``busy_ranks`` (processes the measurement keeps busy at once) and ``ranks_per_core``.
    Call :func:`finish` on it when the measurement is over."""
    device = None if device is None else torch.device(device)
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    out = {"cores": os.cpu_count(), "usable_cores": usable,
           "cpu_model": _cpu_model(), "device": str(device) if device is not None else "cpu",
           "torch": torch.__version__, "python": platform.python_version(), "platform": platform.platform(),
           "load_average": _load(), "others_running": others_running(), "timer": timer_name(device)}
    if busy_ranks is not None:
        out["busy_ranks"] = int(busy_ranks)
        out["ranks_per_core"] = round(int(busy_ranks) / max(1, usable), 3)
    if device is not None and device.type == "cuda":
        out["gpu"] = {"name": torch.cuda.get_device_name(device), "count": torch.cuda.device_count()}
    return out


def _load() -> list[float] | None:
    return list(os.getloadavg()) if hasattr(os, "getloadavg") else None


def _running_threads_of_this_process() -> int:
    """Threads of this process the kernel counts as runnable now (state ``R`` in ``/proc/self/task/*/stat``):
    the caller, and an OpenMP pool still spinning after a parallel region."""
    count = 0
    for stat in Path("/proc/self/task").glob("*/stat"):
        try:
            count += stat.read_text().rsplit(")", 1)[1].split()[0] == "R"
        except (OSError, IndexError):
            pass
    return max(1, count)


def others_running(samples: int = 5, interval_s: float = 0.02) -> float | None:
    """Threads of *other* processes runnable right now, the mean of ``samples`` readings ``interval_s`` apart:
    ``/proc/loadavg``'s count of runnable threads less this process's own. Unlike the load average, which
    averages the last minute, it holds none of this process's earlier work (a notebook's previous cells, the
    ranks of the previous measurement), so it says whether *other* work shares the cores now. None where
    ``/proc`` is missing (not Linux)."""
    readings = []
    try:
        for i in range(samples):
            running = int(Path("/proc/loadavg").read_text().split()[3].split("/")[0])
            readings.append(max(0, running - _running_threads_of_this_process()))
            if i + 1 < samples:
                time.sleep(interval_s)
    except (OSError, ValueError, IndexError):
        return None
    return sum(readings) / len(readings)


def finish(info: dict) -> dict:
    """Complete a :func:`machine` record once the measurement is over: ``load_average_after`` and
    ``conditions`` (:func:`conditions`). Returns ``info`` (changed in place)."""
    info["load_average_after"] = _load()
    info["others_running_after"] = others_running()
    info["conditions"] = conditions(info)
    return info


def conditions(info: dict) -> str:
    """How far the numbers measured on ``info``'s machine can be trusted as wall-clock comparisons:

    * ``oversubscribed`` — more busy ranks than usable cores (``busy_ranks > usable_cores``): ranks take turns
      on the cores, so every wait, bubble and overlap includes the others' compute;
    * ``loaded`` — the run's busy ranks and the other processes' runnable threads did not fit the cores at the
      start or at the end: ``busy_ranks + others > usable_cores`` for ``others_running`` (before the ranks
      started) or ``others_running_after`` (:func:`others_running`, a mean of five readings; half a thread of
      slack, :data:`SAMPLING_SLACK`, for a reading that caught a passing thread). Records without those readings
      fall back on the 1-minute load average before the measurement, or after it less the measurement's own
      ``busy_ranks`` — which lags, so it also holds the caller's own work of the last minute;
    * ``quiet`` — neither: every busy rank had a core of its own, at the start and at the end.

    Devices other than the CPU (a GPU per rank) are not shared by the ranks, so their ranks take no core and
    only other load counts there.
    """
    cores = max(1, int(info.get("usable_cores") or info.get("cores") or 1))
    busy = int(info.get("busy_ranks") or 0)
    on_cpu = str(info.get("device", "cpu")).startswith("cpu")
    if on_cpu and busy > cores:
        return "oversubscribed"
    need = busy if on_cpu else 0
    others = others_readings(info)
    if not others:
        if info.get("load_average"):
            others.append(info["load_average"][0])
        if info.get("load_average_after"):
            # The 1-minute average lags: after a run of a few seconds it holds part of the run's own load.
            others.append(info["load_average_after"][0] - need)
    if others and need + max(others) > cores + SAMPLING_SLACK:
        return "loaded"
    return "quiet"


def others_readings(info: dict) -> list[float]:
    """The other processes' runnable threads recorded in ``info``: ``others_running`` (at the start) and
    ``others_running_after`` (at the end), those present."""
    return [float(info[k]) for k in ("others_running", "others_running_after") if info.get(k) is not None]


def conditions_clause(info: dict) -> str:
    """``"conditions: quiet (2 busy ranks + 0.0 other runnable threads at the start, 0.2 at the end, on 2 cores)"``:
    the conditions with the numbers they were decided from — the form every machine line and every verdict
    prints, and ``project/tools/check_notebooks.py`` reads back to check that the word follows from the numbers."""
    found = info.get("conditions") or conditions(info)
    cores = int(info.get("usable_cores") or info.get("cores") or 1)
    on_cpu = str(info.get("device", "cpu")).startswith("cpu")
    busy = int(info.get("busy_ranks") or 0) if on_cpu else 0
    start, end = info.get("others_running"), info.get("others_running_after")
    if start is None and end is None:
        return f"conditions: {found}"
    when = ", ".join(f"{v:.1f}{' other runnable threads' if i == 0 else ''} at the {w}" for i, (v, w) in
                     enumerate((v, w) for v, w in ((start, "start"), (end, "end")) if v is not None))
    return f"conditions: {found} ({busy} busy ranks + {when}, on {cores} cores)"


def describe(info: dict) -> str:
    """One line for a printed table: cores, CPU, device, load, busy ranks and the conditions
    (:func:`conditions_clause`)."""
    load = info.get("load_average")
    loaded = f"; load average {load[0]:.1f} at the start" if load else ""
    after = info.get("load_average_after")
    loaded += f", {after[0]:.1f} after" if after else ""
    busy = f"; {info['busy_ranks']} busy ranks ({info['ranks_per_core']:g} per core)" if "busy_ranks" in info else ""
    gpu = f" ({info['gpu']['count']} x {info['gpu']['name']})" if info.get("gpu") else ""
    return (f"{info['cores']} cores ({info['cpu_model']}), device {info['device']}{gpu}, torch {info['torch']}, "
            f"timer {info['timer']}{loaded}{busy}; {conditions_clause(info)}")


# ---- rates ----------------------------------------------------------------------------------------------

RATE_SLACK = 1.10  # a rate may exceed the measured peak by this factor before it is refused (timer noise)
_PEAKS: dict = {}


def peak_flops(threads: int | None = None, n: int = 512, repeats: int = 5, clock: str = "wall") -> float:
    """The fp32 matrix-product rate (FLOP/s) this process reaches with ``threads`` intra-op threads (None: all
    of torch's): the best of ``repeats`` timings of ``(n, n) x (n, n)`` products, each timing at least 0.1 s.
    With every usable core's thread it is this machine's peak: no set of processes on it computes faster
    together. ``clock``: ``"wall"`` (the wall clock: what the product takes here and now, other work included) or
    ``"cpu"`` (this process's CPU seconds, :func:`course.measure.cpu_seconds`: with one thread, the rate of a core
    while it runs the product, whatever else waits for it — the peak of a replay made of CPU seconds). Measured once
    per process, thread count and clock.

    Raises:
        ValueError: an unknown clock.
    """
    if clock not in ("wall", "cpu"):
        raise ValueError(f"clock must be 'wall' or 'cpu', not {clock!r}")
    key = (threads, n, clock)
    if key in _PEAKS:
        return _PEAKS[key]
    from course.measure import cpu_seconds

    read = time.perf_counter if clock == "wall" else cpu_seconds
    before = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        a, b = torch.randn(n, n, device="cpu"), torch.randn(n, n, device="cpu")  # the CPU's peak
        a @ b  # warm-up
        calls, best = 1, 0.0
        for _ in range(repeats):
            start = read()
            for _ in range(calls):
                a @ b
            seconds = read() - start
            if seconds < 0.1:
                calls *= max(2, int(0.1 / max(seconds, 1e-6)))
                continue
            best = max(best, 2.0 * n ** 3 * calls / seconds)
        if best == 0.0:
            best = 2.0 * n ** 3 * calls / max(seconds, 1e-9)
    finally:
        torch.set_num_threads(before)
    _PEAKS[key] = best
    return best


def machine_peak_flops() -> float:
    """This machine's fp32 matrix-product peak (FLOP/s): the larger of one process with every thread
    (:func:`peak_flops`) and the usable cores times one thread's rate — what the cores reach each running a
    product of their own (the measure that holds when other work makes a multi-threaded product wait for its
    slowest thread)."""
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(peak_flops(None), usable * peak_flops(1))


def check_rate(rate: float, peak: float, what: str, ranks: int = 1) -> float:
    """Refuse a compute rate the machine cannot reach: ``ranks`` processes that ran at once, each at ``rate``
    FLOP/s, against the machine's measured ``peak`` (:func:`machine_peak_flops`). Returns ``rate``.

    Raises:
        ValueError: ``ranks * rate`` above ``peak`` times :data:`RATE_SLACK`, naming ``what`` was measured: a
            rate timed on a rank that had the cores to itself while the others waited (their turns on the
            cores) is not a rate of ``ranks`` ranks at once.
    """
    if ranks * rate > peak * RATE_SLACK:
        raise ValueError(f"{what}: {ranks} ranks x {rate / 1e9:.3g} GFLOP/s = {ranks * rate / 1e9:.3g} GFLOP/s, above "
                         f"this machine's measured peak of {peak / 1e9:.3g} GFLOP/s: the rate was timed while the "
                         f"other ranks were not running (time the slowest rank of all of them at once)")
    return rate


# ---- verdicts -----------------------------------------------------------------------------------------

def _bootstrap_median_interval(values: list[float], confidence: float, resamples: int, seed: int) -> tuple[float, float]:
    """Percentile bootstrap interval of the median of ``values`` (a seeded generator: the same numbers give
    the same interval)."""
    rng = random.Random(seed)
    n = len(values)
    medians = sorted(statistics.median(rng.choices(values, k=n)) for _ in range(resamples))
    lo = medians[int(math.floor((1 - confidence) / 2 * (resamples - 1)))]
    hi = medians[int(math.ceil((1 + confidence) / 2 * (resamples - 1)))]
    return lo, hi


def sign_test_p(below: int, above: int) -> float:
    """Two-sided p-value of the exact sign test: the chance, were each paired ratio as likely below 1 as above
    it, of a split at least as lopsided as ``below`` : ``above`` (ties left out). 1.0 without a ratio."""
    n = below + above
    if n == 0:
        return 1.0
    k = max(below, above)
    tail = sum(math.comb(n, j) for j in range(k, n + 1)) / 2 ** n
    return min(1.0, 2 * tail)


def repeats_for_verdict(confidence: float = CONFIDENCE) -> int:
    """The fewest side-by-side repeats that can give a verdict at ``confidence``: all of them one way must
    reject the sign test (6 at 95 %; the notebooks take 7 or more, so that 7 of 7 one way is significant)."""
    n = 1
    while sign_test_p(n, 0) >= 1 - confidence:
        n += 1
    return n


def compare(a: list[float], b: list[float], names: tuple[str, str] = ("a", "b"), *, lower_is_better: bool = True,
            unit: str = "s", confidence: float = CONFIDENCE, resamples: int = 2000, seed: int = 0,
            conditions: str | None = None, words: tuple[str, str] = ("faster", "slower")) -> dict:
    """The verdict on two variants measured side by side (repeat k of each in the same round of
    :func:`interleaved`, or replayed from the same repeat's costs): is ``a`` faster, slower, or
    indistinguishable from ``b``?

    ``a`` and ``b`` are per-repeat measurements (seconds when ``lower_is_better``; a rate such as tokens/s
    otherwise). The verdict comes from the **paired** ratios ``a_k / b_k`` alone: an exact two-sided sign test
    (:func:`sign_test_p`) of how many lie below 1 and how many above. When it rejects at ``1 - confidence`` the
    verdict is ``faster`` or ``slower`` (of ``a`` against ``b``, by the side most ratios lie on), otherwise
    ``indistinguishable``; with fewer than :func:`repeats_for_verdict` repeats no split can reject, and the
    sentence says so. Whether the two min–max ranges overlap is reported (``overlap``) but decides nothing:
    seven paired ratios all below 1 show ``a`` faster even when a slow round of ``a`` lasted longer than a
    fast round of ``b``. ``interval`` is the ``confidence`` bootstrap interval of the median ratio (its size).

    ``conditions``: the run's (:func:`conditions`, or ``"replayed"`` for times replayed from measured costs),
    printed in the sentence. ``words``: how the sentence says better and worse — ``("faster", "slower")`` for times
    and rates, ``("lower", "higher")`` for a loss (``verdict`` stays ``faster``/``slower``: better/worse).

    Returns:
        ``{"verdict", "ratio" (summarise of a/b per repeat), "sign" ({"below", "above", "ties", "p"}),
        "confidence", "interval" ([lo, hi] bootstrap interval of the median ratio), "overlap" (bool), "a", "b"
        (summarise of each), "names", "unit", "lower_is_better", "conditions", "sentence"}`` — ``sentence`` is
        one ``verdict: ...`` line with its numbers, for prose and plot titles, in the form
        ``project/tools/check_notebooks.py`` reads back.

    Raises:
        ValueError: fewer than :data:`MIN_REPEATS` repeats, or lists of different lengths (not side by side).
    """
    if len(a) != len(b):
        raise ValueError(f"compare {len(a)} and {len(b)} repeats: measure both side by side (interleaved)")
    if len(a) < MIN_REPEATS:
        raise ValueError(f"a verdict needs >= {MIN_REPEATS} side-by-side repeats, not {len(a)}")
    sa, sb = summarise(a), summarise(b)
    r = ratios(a, b)
    below = sum(x < 1.0 for x in r["all"])
    above = sum(x > 1.0 for x in r["all"])
    p = sign_test_p(below, above)
    lo, hi = _bootstrap_median_interval(r["all"], confidence, resamples, seed)
    overlap = not apart(sa, sb)
    alpha = 1 - confidence
    if p < alpha:
        a_better = (below > above) == lower_is_better
        verdict = "faster" if a_better else "slower"
    else:
        verdict = "indistinguishable"
    name_a, name_b = names
    better = "lower" if lower_is_better else "higher"
    test = (f"{below} of {r['n']} repeats below 1, {above} above: sign test p = {p:.2g} "
            f"{'<' if p < alpha else '>='} {alpha:.2g}")
    if r["n"] < repeats_for_verdict(confidence):
        test += f" (too few repeats: {repeats_for_verdict(confidence)} all one way are the fewest that can reject)"
    tail = (f"(median ratio {name_a}/{name_b} {r['median']:.3g}, per repeat {r['min']:.3g}–{r['max']:.3g}; {test}; "
            f"{unit}, {better} is better; " + (conditions_word(conditions) if conditions else "conditions: not given")
            + ")")
    if verdict == "indistinguishable":
        sentence = f"verdict: {name_a} and {name_b} are indistinguishable {tail}"
    else:
        factor = r["median"] if r["median"] >= 1 else 1 / r["median"]
        said = words[0] if verdict == "faster" else words[1]
        sentence = f"verdict: {name_a} is {said} than {name_b}, {factor:.3g}x {tail}"
    return {"verdict": verdict, "ratio": r, "sign": {"below": below, "above": above, "ties": r["n"] - below - above,
                                                     "p": p},
            "confidence": confidence, "interval": [lo, hi], "overlap": overlap, "a": sa, "b": sb,
            "names": list(names), "unit": unit, "lower_is_better": lower_is_better, "conditions": conditions,
            "sentence": sentence}


def conditions_word(found) -> str:
    """A verdict's conditions: a :func:`machine` record (its :func:`conditions_clause`) or a word (``quiet``,
    ``loaded``, ``oversubscribed``, ``replayed ...``)."""
    if isinstance(found, dict):
        return conditions_clause(found)
    return f"conditions: {found}"


def fit_quality(measured: list[float], predicted: list[float], coefficients: dict[str, float],
                clamped: tuple[str, ...] = (), poor_factor: float = 1.5) -> dict:
    """Whether a fit held, from its residuals and coefficients.

    ``measured`` and ``predicted`` are the fitted points (e.g. seconds per message size); ``coefficients``
    the fitted values by name (e.g. ``{"alpha": ..., "beta": ...}``), of quantities that cannot be negative
    (a latency, an inverse bandwidth); ``clamped`` names those the fit had to clamp (e.g. a negative beta
    set to 0).

    Returns:
        ``{"quality", "reason", "residuals" (measured / predicted per point), "worst_factor"}`` — ``quality``
        is ``failed`` (a coefficient negative or clamped: the model does not describe these points, and
        nothing derived from it, such as a crossover, may be printed as a prediction), ``poor`` (some point
        off by more than ``poor_factor`` times either way) or ``good``.
    """
    if len(measured) != len(predicted):
        raise ValueError(f"{len(measured)} measured and {len(predicted)} predicted points")
    residuals = [m / p if p > 0 else math.inf for m, p in zip(measured, predicted)]
    worst = max((max(r, 1 / r) if 0 < r < math.inf else math.inf for r in residuals), default=1.0)
    bad = sorted(set(clamped) | {k for k, v in coefficients.items() if not (v >= 0)})
    if bad:
        quality, reason = "failed", f"the fit failed: {', '.join(bad)} came out negative or was clamped"
    elif worst > poor_factor:
        quality, reason = "poor", f"a poor fit: a point is {worst:.3g}x off the line"
    else:
        quality, reason = "good", f"a good fit: every point within {worst:.3g}x of the line"
    return {"quality": quality, "reason": reason, "residuals": residuals, "worst_factor": worst}


# ---- JSON --------------------------------------------------------------------------------------------

def write_report(path, report: dict) -> Path:
    """Write ``report`` (it should hold ``machine`` and ``config``) as indented JSON, atomically."""
    from course.results import write_json

    missing = [k for k in ("machine", "config") if k not in report]
    if missing:
        raise ValueError(f"a benchmark report holds {missing} too (course.benchmarking.machine, the options)")
    return write_json(path, report)


# ---- the command line ----------------------------------------------------------------------------

def parser(description: str, *, out: str, device: str | None = "auto", repeats: int = MIN_REPEATS, warmup: int | None = 1,
           timeout: float | None = None, steps: int | None = None) -> argparse.ArgumentParser:
    """A benchmark's command line with the options every benchmark shares (group "measurement"): ``--device``
    (unless ``device`` is None: the benchmark runs on the CPU only), ``--repeats``, ``--warmup`` (unless ``warmup``
    is None: the benchmark warms up on its own), ``--out`` (:func:`out_option`),
    with ``timeout`` ``--timeout`` and with ``steps`` ``--steps`` (:func:`steps_option`). The benchmark adds its own; an option of the run
    configuration (mesh sizes, micro-batches, sequence length, ...) it takes from the table with :func:`option`."""
    from course.cli import OptionParser

    p = OptionParser(description=description, formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    g = p.add_argument_group("measurement")
    if device is not None:
        option(g, "device", default=device, note="a benchmark: one GPU per rank with NCCL when there are enough, "
                                                "else the CPU with gloo")
    g.add_argument("--repeats", type=int, default=repeats, help=f"timed repeats (>= {MIN_REPEATS}): median and min-max")
    if warmup is not None:
        g.add_argument("--warmup", type=int, default=warmup, help="untimed runs first (allocation, first calls)")
    out_option(g, default=out)
    if timeout is not None:
        option(g, "timeout", default=timeout, note="a benchmark: of each launch")
    if steps is not None:
        steps_option(g, steps)
    return p


def steps_option(parser, default: int | None) -> None:
    """Add ``--steps N`` of the table, the training steps a benchmark or an experiment runs (in each timed repeat),
    to ``parser``."""
    option(parser, "steps", default=default)


def out_option(parser, default: str | None = None, *, required: bool = False) -> None:
    """Add ``--out FILE`` of the table, where a benchmark or a measuring tool writes its JSON report (every results
    file a script writes is its ``--out``), to ``parser``, as a ``pathlib.Path``."""
    option(parser, "out", default=None if default is None else Path(default), required=required, type=Path)


def option(parser, name: str, **override) -> None:
    """Add option ``--name`` of the run configuration's table to a benchmark's ``parser``, as the table declares it
    (:func:`course.config.add_option`: ``default``, ``nargs`` for a sweep, ``note``, ``choices`` may differ)."""
    from course.config import add_option

    add_option(parser, name, **override)


def gpt2_step_options(group, *, preset: str = "tiny", seq_len: int = 64, per_rank_batch: int = 8) -> None:
    """Add the options of a benchmark that trains a GPT-2 of its own on random tokens to ``group`` (a parser or an
    argument group): ``--preset``, ``--vocab_size`` and ``--seq_len`` (the table's) and ``--per_rank_batch``
    (sequences per rank per step)."""
    option(group, "preset", default=preset)
    option(group, "vocab_size")
    option(group, "seq_len", default=seq_len, note="a benchmark: random tokens")
    group.add_argument("--per_rank_batch", type=int, default=per_rank_batch, help="sequences per rank per step")


def check(parser: argparse.ArgumentParser, args: argparse.Namespace, world_size: int, *,
          out_folder: bool = False) -> argparse.Namespace:
    """Check the shared options before any process starts (exits through ``parser.error`` with what to
    change): ``--repeats`` >= :data:`MIN_REPEATS`, ``--warmup`` >= 0, ``--device`` resolved for
    ``world_size`` ranks (:func:`course.launch.resolve_device_backend`), ``--out`` writable (a file; with
    ``out_folder`` a folder: :func:`course.output_paths.require_writable_output`)."""
    from course.launch import resolve_device_backend
    from course.output_paths import require_writable_output

    require_writable_output(parser, getattr(args, "out", None), "--out", folder=out_folder)

    if args.repeats < MIN_REPEATS:
        parser.error(f"--repeats must be >= {MIN_REPEATS} timed repeats (a median and a spread need three points), "
                     f"not {args.repeats}")
    if getattr(args, "warmup", 0) < 0:
        parser.error(f"--warmup must be >= 0, not {args.warmup}")
    if hasattr(args, "device"):
        try:
            args.device, _ = resolve_device_backend(args.device, "auto", world_size)
        except ValueError as exc:
            parser.error(str(exc))
    return args


def torchrun_size(parser: argparse.ArgumentParser, given: list[int] | int | None, option: str, argv=None) -> int | None:
    """Under torchrun a benchmark's number of ranks is torchrun's ``WORLD_SIZE``: returns it (None outside
    torchrun). Exits with a message when ``option`` was given with another value."""
    from course.launch import default_world_size, in_torchrun

    if not in_torchrun():
        return None
    size = default_world_size(0)
    argv = sys.argv if argv is None else argv
    values = given if isinstance(given, list) else [given]
    if option in argv and any(v != size for v in values if v is not None):
        parser.error(f"under torchrun {option} is torchrun's WORLD_SIZE={size}: leave it out, or start torchrun with "
                     f"--nproc_per_node=<that size>")
    return size
