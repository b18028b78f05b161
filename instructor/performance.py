"""Performance keys: optional points for speed, measured as side-by-side ratios, reported apart from correctness.

    python instructor/performance.py                          # this tree (yours, or the reference)
    python instructor/performance.py --submission ../alice    # Alice's copy of the course
    python instructor/performance.py --keys perf_bubble --json perf.json

Absolute times mean nothing across machines, so every performance key is a **ratio** of the submission's code
against a well-kept library's, both run in the same launch on the same machine, side by side (docs/grading.md,
"Performance keys"):

* ``perf_dp_overlap`` — the bucketed all-reduce overlapped with the backward pass (the code of ``a5_4_2``,
  :class:`communication.buckets.BucketedReducer`) against ``torch.nn.parallel.DistributedDataParallel`` with the
  same bucket size: training tokens/s at dp = 2, ratio student / DDP, at least ``0.95``;
* ``perf_1f1b`` — the 1F1B schedule and stage runner (the code of ``a5_2_4``) against
  ``torch.distributed.pipelining.Schedule1F1B`` on the same GPT-2 stages and micro-batches: step seconds at p = 2,
  ratio student / torch, at most ``1.10``;
* ``perf_bubble`` — the bubble of the submission's 1F1B action lists (``a5_2_4``) replayed with equal stage costs
  (:func:`pipeline.metrics.replay_by_kind`, F = 1, B = 2) against the theory ``(p - 1) / (m + p - 1)``
  (Narayanan et al. 2021, Sec. 2.2.1): at most ``1.05`` in every configuration. A replay, not a timing: the same
  code gives the same number on every machine.

**The protocol** (:mod:`course.benchmarking`; docs/architecture.md, "The benchmark harness"): warm-up steps of both variants, then
``repeats`` (>= 3) rounds in which the two take turns (:func:`course.benchmarking.interleaved`), so a change of load
touches both; the verdict comes from :func:`course.benchmarking.compare` — the median per-repeat ratio and its 95 %
bootstrap interval. The machine record (:func:`course.benchmarking.machine` before the ranks start,
:func:`course.benchmarking.finish` after) classes the run ``quiet``, ``loaded`` or ``oversubscribed``.

**Verdicts** (:func:`judge`): ``pass`` when the ratio's bootstrap interval reaches the bound (the threshold widened
by the key's margin: a fail needs evidence — every plausible median of the ratio beyond the bound); ``fail`` when
the whole interval lies beyond it; ``not measurable here`` when a timed key's machine was ``loaded`` or
``oversubscribed`` (no points are given or taken: it is not a zero). A key whose code could not be taken from the
submission, broke the block policy or did not run is ``fail`` with the reason. Every timed key also checks
**parity** (the submission's losses equal the library's within the correctness tolerance): speed bought by
computing something else is a ``fail``.

The submission's code runs as the grader runs it (:func:`instructor.submission.grading_tree`: only the key's blocks
are taken, the block policy is checked, every key the key does not depend on is a stub), in a subprocess with a
time limit (``python -m project.tools.performance``, which holds the ranks' work and writes raw numbers); nothing of the
student's runs in this process, which judges the numbers.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if __name__ == "__main__":  # run as a file: import the packages of the tree this script sits in
    sys.path.insert(0, str(ROOT))

from instructor.session import run_in_session  # noqa: E402

PASS, FAIL, NOT_MEASURABLE = "pass", "fail", "not measurable here"
VERDICTS = (PASS, FAIL, NOT_MEASURABLE)
DEFAULT_TIMEOUT = 300.0  # seconds per key's measurement subprocess (each takes a few seconds on an idle 2-core machine)


@dataclass(frozen=True)
class PerfKey:
    """One performance key. Its name holds no correctness key's string (``pytest -k a5_4_2`` must select exactly
    that key's tests), so it names its correctness key in ``code_of``."""

    name: str
    topic: str
    code_of: str           # the correctness key whose blocks are measured (its grading copy runs them)
    measure: str           # "ratio of tokens/s", "ratio of step seconds", "replayed bubble / theory"
    threshold: float       # the stated goal
    margin: float          # the noise allowance on top of it (docs/grading.md: how it was chosen)
    at_least: bool         # True: ratio >= threshold - margin; False: ratio <= threshold + margin
    timed: bool            # a wall-clock measurement (False: a replay, the same on any machine)
    points: int = 2

    @property
    def bound(self) -> float:
        """The threshold widened by the margin: the ratio the verdict compares with."""
        return self.threshold - self.margin if self.at_least else self.threshold + self.margin

    def goal(self) -> str:
        sign = ">=" if self.at_least else "<="
        return f"{self.measure} {sign} {self.threshold:g} (margin {self.margin:g}: bound {self.bound:g})"


PERF_KEYS: dict[str, PerfKey] = {k.name: k for k in [
    PerfKey("perf_dp_overlap", "bucketed all-reduce overlapped with backward vs DistributedDataParallel, dp 2",
            "a5_4_2", "tokens/s ratio (yours / DDP)", 0.95, 0.05, at_least=True, timed=True),
    PerfKey("perf_1f1b", "1F1B at p = 2 vs torch.distributed.pipelining.Schedule1F1B",
            "a5_2_4", "step-time ratio (yours / Schedule1F1B)", 1.10, 0.05, at_least=False, timed=True),
    PerfKey("perf_bubble", "replayed bubble of your 1F1B action lists vs (p - 1) / (m + p - 1)",
            "a5_2_4", "replayed bubble / theory (worst configuration)", 1.05, 0.0, at_least=False, timed=False),
]}


# ---- verdicts (pure: the tests feed them synthetic timings) -------------------------------------------

def judge(key: PerfKey, mine: list[float] | None = None, theirs: list[float] | None = None, *,
          conditions: str = "quiet", ratio: float | None = None, checks: list[dict] = ()) -> dict:
    """The verdict of ``key`` on one measurement.

    Args:
        mine, theirs: per-repeat values of the submission and of the library, measured side by side (repeat k of
            each in the same round): tokens/s when ``key.at_least``, seconds otherwise. >= 3 each.
        conditions: the run's :func:`course.benchmarking.conditions` (``quiet``, ``loaded``, ``oversubscribed``).
        ratio: for an untimed key (a replay): the ratio itself (no interval: it is exact).
        checks: ``[{"name", "passed", "detail"}]`` that hold on any machine and come first: ``parity`` (the
            submission computed what the library computed), ``overlap`` (its buckets' all-reduces started inside
            the backward pass, read from the reducer's recorded event order). A failed check is a ``fail`` on any
            machine, loaded or not.

    Returns:
        ``{"key", "verdict", "ratio" (median), "interval" ([lo, hi], 95 % bootstrap of the median ratio),
        "spread" ([min, max] of the per-repeat ratios), "bound", "threshold", "margin", "conditions", "reason"}``.

    Raises:
        ValueError: a timed key without >= 3 side-by-side repeats; an untimed key without ``ratio``.
    """
    from course.benchmarking import compare

    out = {"key": key.name, "threshold": key.threshold, "margin": key.margin, "bound": key.bound,
           "at_least": key.at_least, "conditions": conditions if key.timed else "replayed"}
    if key.timed:
        if mine is None or theirs is None:
            raise ValueError(f"{key.name} is timed: give the per-repeat values of both variants")
        c = compare(list(mine), list(theirs), ("yours", "library"), lower_is_better=not key.at_least,
                    conditions=conditions)
        r = c["ratio"]
        out.update(ratio=r["median"], interval=list(c["interval"]), spread=[r["min"], r["max"]], repeats=r["n"],
                   sentence=c["sentence"])
        lo, hi = c["interval"]
    else:
        if ratio is None:
            raise ValueError(f"{key.name} is a replay: give its ratio")
        out.update(ratio=float(ratio), interval=[float(ratio), float(ratio)], spread=[float(ratio), float(ratio)],
                   repeats=1)
        lo = hi = float(ratio)
    broken = [c for c in checks if not c.get("passed")]
    if broken:
        out.update(verdict=FAIL, reason="; ".join(f"{c['name']} check failed: {c.get('detail', '')}" for c in broken))
        return out
    if key.timed and conditions != "quiet":
        out.update(verdict=NOT_MEASURABLE,
                   reason=f"the machine was {conditions} during the measurement (other processes' work shared the "
                          f"cores with the ranks), so a wall-clock ratio says more about the machine than about the "
                          f"code; not graded (not a zero). Run again on a quiet machine.")
        return out
    cleared = hi >= key.bound if key.at_least else lo <= key.bound
    sign = ">=" if key.at_least else "<="
    where = (f"median ratio {out['ratio']:.3f}, 95% interval {lo:.3f}-{hi:.3f}" if key.timed
             else f"ratio {out['ratio']:.3f}")
    if cleared:
        out.update(verdict=PASS, reason=f"{where}: reaches {sign} {key.bound:g} (threshold {key.threshold:g}, "
                                        f"margin {key.margin:g})")
    else:
        out.update(verdict=FAIL, reason=f"{where}: the whole interval misses {sign} {key.bound:g} (threshold "
                                        f"{key.threshold:g}, margin {key.margin:g})")
    return out


def grading_conditions(machine: dict) -> str:
    """The conditions a timed key is judged under: the harness's (:func:`course.benchmarking.conditions`), and
    ``loaded`` also when its ``quiet`` still left a core shared — the measurement's ranks and the other processes'
    runnable threads (``others_running`` before and after, the larger) more than the usable cores (with half a thread
    of slack for the sampling). The harness calls a machine loaded when others keep more than half its cores busy;
    here the two ranks fill both cores of the 2-core machine, so one more runnable thread already takes turns with a
    rank, and it slows 1F1B's two busy ranks more than a serialised pipeline's one (a slow reference passed once that
    way, docs/grading.md)."""
    from course.benchmarking import conditions

    found = machine.get("conditions") or conditions(machine)
    if found != "quiet" or not str(machine.get("device", "cpu")).startswith("cpu"):
        return found
    others = [machine[k] for k in ("others_running", "others_running_after") if machine.get(k) is not None]
    cores = int(machine.get("usable_cores") or machine.get("cores") or 1)
    if others and int(machine.get("busy_ranks") or 0) + max(others) > cores + 0.5:
        return "loaded"
    return "quiet"


def failed(key: PerfKey, reason: str) -> dict:
    """The verdict of a key whose code could not be measured (not taken, refused by the policy, crashed)."""
    return {"key": key.name, "verdict": FAIL, "reason": reason, "ratio": None, "interval": None, "spread": None,
            "bound": key.bound, "threshold": key.threshold, "margin": key.margin, "at_least": key.at_least,
            "conditions": None}


def points(key: PerfKey, verdict: dict) -> float | None:
    """Points of a verdict: all on ``pass``, none on ``fail``, None (not graded) when not measurable."""
    return {PASS: float(key.points), FAIL: 0.0}.get(verdict["verdict"])


# ---- checks that hold on any machine (the measurement's raw numbers in, a verdict's check out) -------

# Parity tolerance (relative, on every loss): at dp = 2 both averages are (a + b) / 2 — the sum of two floats is
# commutative and the halving exact — so the SGD steps are the same up to the order DDP's C++ reducer and the
# bucketed reducer copy the same numbers: equal losses. 1e-5 (~80 float32 eps) leaves room for the backward
# kernels' own order (the same in both) over 3 steps, and is far below any wrong average (a missing halving or a
# missed bucket changes the loss after one step of lr 0.05 by > 1e-3).
DP_PARITY_RTOL = 1e-5
# 1F1B parity: the same stage modules and micro-batches, so the forward losses are bit-for-bit the same; the
# gradients differ by where 1/m is applied (torch scales the summed gradient, the runner each micro-batch's
# loss): m = 8 additions of float32 numbers, ~8 eps = 1e-6 relative; 1e-5 of the largest gradient element.
PP_PARITY_RTOL = 1e-5


def dp_overlap(launched_in_backward: list[int], n_buckets: int) -> dict:
    """Whether every bucket's all-reduce started inside the backward pass in every recorded step (the reducer's
    ``"launch"`` events before ``loss.backward()`` returned; every parameter of the model gets a gradient, so a
    correct overlap launches all ``n_buckets``). An event order, not a timing: the same on any machine."""
    passed = bool(launched_in_backward) and all(k == n_buckets for k in launched_in_backward)
    return {"name": "overlap", "passed": passed, "launched_in_backward": launched_in_backward, "buckets": n_buckets,
            "detail": f"all-reduces started during the backward pass: {launched_in_backward} of {n_buckets} buckets "
                      f"per recorded step (all of them expected: a bucket waits only for its own gradients)"}


def dp_parity(losses: dict) -> dict:
    """Whether the submission's first SGD steps' losses (every rank) equal DDP's within :data:`DP_PARITY_RTOL`."""
    worst = max((abs(a - b) / max(abs(b), 1e-12) for mine, theirs in zip(losses["yours"], losses["library"])
                 for a, b in zip(mine, theirs)), default=math.inf)
    passed = math.isfinite(worst) and worst <= DP_PARITY_RTOL
    return {"name": "parity", "passed": passed, "worst_relative": worst, "tolerance": DP_PARITY_RTOL, "losses": losses,
            "detail": f"first {len(losses['yours'])} SGD steps' losses on every rank within {worst:.2g} relative of "
                      f"DDP's (tolerance {DP_PARITY_RTOL:g})"}


def pp_parity(losses: dict, grad_diff: float, grad_scale: float) -> dict:
    """Whether the submission's 1F1B step gave Schedule1F1B's micro-batch losses and gradients within
    :data:`PP_PARITY_RTOL` (gradients: of the largest gradient element, every rank)."""
    worst = max((abs(a - b) / max(abs(b), 1e-12) for a, b in zip(losses["yours"], losses["library"])),
                default=math.inf)
    if len(losses["yours"]) != len(losses["library"]):
        worst = math.inf
    grad = grad_diff / max(grad_scale, 1e-12)
    passed = math.isfinite(worst) and worst <= PP_PARITY_RTOL and grad <= PP_PARITY_RTOL
    return {"name": "parity", "passed": passed, "worst_relative": worst, "gradient_relative": grad,
            "tolerance": PP_PARITY_RTOL,
            "losses": losses,
            "detail": f"first step's micro-batch losses within {worst:.2g} and gradients within {grad:.2g} relative of "
                      f"Schedule1F1B's (tolerance {PP_PARITY_RTOL:g})"}


def checks_of(measured: dict) -> list[dict]:
    """The checks that hold on any machine, from a measurement's raw numbers: parity (both keys) and, for
    ``perf_dp_overlap``, the overlap's launch order."""
    if measured["key"] == "perf_dp_overlap":
        return [dp_parity(measured["losses"]), dp_overlap(measured["launched_in_backward"], measured["n_buckets"])]
    return [pp_parity(measured["losses"], measured["grad_diff"], measured["grad_scale"])]


def verdict_of(measured: dict) -> dict:
    """:func:`judge` of one measurement (``project/tools/performance.py``'s raw numbers); the machine record and the raw
    numbers kept beside it."""
    key = PERF_KEYS[measured["key"]]
    if key.timed:
        checks = checks_of(measured)
        v = judge(key, measured["yours"], measured["library"], conditions=grading_conditions(measured["machine"]),
                  checks=checks)
        v.update(unit=measured["unit"], yours=measured["yours"], library=measured["library"], checks=checks)
    else:
        v = judge(key, ratio=measured["ratio"])
        v["rows"] = measured["rows"]
    v["machine"] = measured["machine"]
    return v


# ---- the grader's step: the submission's code in its grading copy, in a subprocess ---------------------------

@dataclass
class PerfResult:
    key: str
    topic: str
    verdict: str
    points: float | None       # None: not graded (not measurable here)
    max_points: int
    seconds: float
    output: str
    detail: dict = field(default_factory=dict)


def _run_measurement(tree: Path, name: str, timeout: float, out: Path) -> dict:
    """``python -m project.tools.performance --key NAME --out OUT`` in ``tree`` (the grading copy), in a process
    session of its own bounded by ``timeout`` (:func:`instructor.session.run_in_session`: the whole session is
    killed when it ends)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "LLMSYS_GRADE"))}
    env.update(PYTHONPATH=str(tree), PYTHONDONTWRITEBYTECODE="1")
    cmd = [sys.executable, "-m", "project.tools.performance", "--key", name, "--out", str(out)]
    run = run_in_session(cmd, cwd=tree, env=env, timeout=timeout)
    if run.timed_out:
        raise RuntimeError(f"the measurement ran past {timeout:.0f} s (a hung rank?)")
    if run.returncode != 0 or not out.is_file():
        tail = "\n".join(run.output.strip().splitlines()[-15:])
        raise RuntimeError(f"the measurement failed (exit {run.returncode}):\n{tail}")
    return json.loads(out.read_text())


def measure_here(name: str, timeout: float = DEFAULT_TIMEOUT) -> dict:
    """The verdict of ``name`` on this tree's own code, measured in a subprocess (as the grader does, without the
    copy)."""
    with tempfile.TemporaryDirectory(prefix="perf_") as tmp:
        return verdict_of(_run_measurement(ROOT, name, timeout, Path(tmp) / f"{name}.json"))


def grade_performance(names: list[str] | None = None, submission: Path | None = None, root: Path = ROOT,
                      timeout: float = DEFAULT_TIMEOUT, quiet: bool = False) -> list[PerfResult]:
    """Measure and judge each performance key of ``submission`` (None: the tree ``root`` itself) as the grader
    does: the key's code taken into a grading copy (:func:`instructor.submission.grading_tree`, block policy
    checked), measured there in a subprocess, judged here."""
    from instructor.submission import PolicyError, SubmissionError, grading_tree, submission_root

    names = list(names or PERF_KEYS)
    source = submission_root(submission or root, root)
    results = []
    with tempfile.TemporaryDirectory(prefix="perf_") as tmp:
        trees: dict[str, Path | Exception] = {}
        for name in names:
            key = PERF_KEYS[name]
            start = time.monotonic()
            if not quiet:
                print(f"measuring {name} ...", flush=True)
            try:
                if key.code_of not in trees:
                    try:
                        trees[key.code_of] = grading_tree(root, source, key.code_of, Path(tmp) / key.code_of).root
                    except (PolicyError, SubmissionError) as exc:
                        trees[key.code_of] = exc
                tree = trees[key.code_of]
                if isinstance(tree, PolicyError):
                    raise RuntimeError(f"your code for {key.code_of} breaks the block policy, so it was not run:\n{tree}")
                if isinstance(tree, Exception):
                    raise RuntimeError(f"your code for {key.code_of} could not be taken from the submission: {tree}")
                try:
                    measured = _run_measurement(tree, name, timeout, Path(tmp) / f"{name}.json")
                except RuntimeError as first:  # once more: a launch can fail for the machine's sake (a port
                    # another process took between its choice and the bind: EADDRINUSE); the code's own error repeats
                    if not quiet:
                        print(f"  {name}: the measurement failed, trying once more:\n  {str(first)[-300:]}", flush=True)
                    measured = _run_measurement(tree, name, timeout, Path(tmp) / f"{name}.json")
                    measured["retried_after"] = str(first)[-2000:]
                v = verdict_of(measured)
                if "retried_after" in measured:
                    v["retried_after"] = measured["retried_after"]
            except RuntimeError as exc:
                v = failed(key, str(exc))
            results.append(PerfResult(name, key.topic, v["verdict"], points(key, v), key.points,
                                      time.monotonic() - start, describe(key, v), v))
    return results


def describe(key: PerfKey, v: dict) -> str:
    """The verdict in words, for the report and Gradescope."""
    text = f"{v['verdict']}: {v['reason']}\ngoal: {key.goal()}"
    for c in v.get("checks", []):
        text += f"\n{c['name']}: {'ok' if c['passed'] else 'FAILED'} ({c['detail']})"
    if v.get("machine"):
        from course.benchmarking import describe as machine_line

        text += f"\nmachine: {machine_line(v['machine'])}"
    return text


def gradescope_tests(results: list[PerfResult]) -> list[dict]:
    """Gradescope ``tests`` entries of the performance keys: their own ``max_score`` and a ``performance`` tag;
    a key not measurable here scores 0 of a ``max_score`` of 0 (not graded, not a zero)."""
    return [{"name": f"{r.key}: {r.topic}", "score": r.points or 0.0,
             "max_score": r.max_points if r.points is not None else 0,
             "status": {PASS: "passed", FAIL: "failed"}.get(r.verdict, "passed"),
             "tags": ["performance"], "visibility": "visible",
             "output": f"[performance, optional] {r.output}"} for r in results]


def print_table(results: list[PerfResult]) -> None:
    print(f"\nPERFORMANCE (optional, apart from correctness)\n{'key':<16} {'verdict':<20} {'ratio':>8} "
          f"{'95% interval':>15} {'points':>8}")
    for r in results:
        d = r.detail
        ratio = f"{d['ratio']:.3f}" if d.get("ratio") is not None else "-"
        iv = f"{d['interval'][0]:.3f}-{d['interval'][1]:.3f}" if d.get("interval") else "-"
        pts = f"{r.points:g}/{r.max_points}" if r.points is not None else f"-/{r.max_points}"
        print(f"{r.key:<16} {r.verdict:<20} {ratio:>8} {iv:>15} {pts:>8}")
    for r in results:
        print(f"\n{r.key}: {r.output}")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description="Measure the performance keys (optional, graded apart from "
                                                 "correctness): side-by-side ratios against torch's own "
                                                 "implementations, judged under the measurement protocol "
                                                 "(docs/grading.md, 'Performance keys').")
    parser.add_argument("--submission", default=None, help="the copy of the course to measure (default: this tree)")
    parser.add_argument("--keys", nargs="+", default=list(PERF_KEYS), choices=list(PERF_KEYS), metavar="KEY",
                        help=f"performance keys (default: all of {', '.join(PERF_KEYS)})")
    parser.add_argument("--json", default=None, help="write every verdict, ratio, interval and machine record here")
    parser.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT, help="seconds allowed per key")
    args = parser.parse_args(argv)
    from course.output_paths import require_writable_output

    require_writable_output(parser, args.json, "--json")  # before anything is measured
    submission = Path(args.submission).resolve() if args.submission else None
    if submission is not None and not submission.is_dir():
        parser.error(f"--submission {submission} is not a folder")
    results = grade_performance(args.keys, submission, timeout=args.timeout)
    print_table(results)
    if args.json:
        from course.results import write_json

        write_json(args.json, [asdict(r) for r in results])  # its folder made if need be (checked above)
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
