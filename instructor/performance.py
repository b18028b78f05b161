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

**The protocol** (:mod:`course.benchmarking`, COURSE_DESIGN.md section 7): warm-up steps of both variants, then
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
time limit; nothing of the student's runs in this process.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if __name__ == "__main__":  # run as a file: import the packages of the tree this script sits in
    sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

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
        c = compare(list(mine), list(theirs), ("yours", "library"), lower_is_better=not key.at_least)
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
                   reason=f"the machine was {conditions} during the measurement, so a wall-clock ratio says more "
                          f"about the machine than about the code; not graded (not a zero). Run again on a quiet "
                          f"machine.")
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


def failed(key: PerfKey, reason: str) -> dict:
    """The verdict of a key whose code could not be measured (not taken, refused by the policy, crashed)."""
    return {"key": key.name, "verdict": FAIL, "reason": reason, "ratio": None, "interval": None, "spread": None,
            "bound": key.bound, "threshold": key.threshold, "margin": key.margin, "at_least": key.at_least,
            "conditions": None}


def points(key: PerfKey, verdict: dict) -> float | None:
    """Points of a verdict: all on ``pass``, none on ``fail``, None (not graded) when not measurable."""
    return {PASS: float(key.points), FAIL: 0.0}.get(verdict["verdict"])


# ---- what the ranks run (in the submission's grading copy) ----------------------------------------------

DP_CONFIG = dict(preset="tiny", vocab_size=2048, seq=64, per_rank_batch=8, steps=2, bucket_mb=0.5, warmup=1,
                 repeats=5, parity_steps=3, learning_rate=0.05)
PP_CONFIG = dict(n_layer=4, vocab=2048, seq=64, micro_batch_size=4, micro_batches=8, warmup=1, repeats=5)
BUBBLE_CONFIGS = ((2, 4), (2, 8), (4, 8), (4, 16))  # (p, m) replayed
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


def _batch(seed: int, rows: int, seq: int, vocab: int) -> dict:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, vocab, (rows, seq), generator=g)
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids.clone()}


def dp_worker(rank: int, world_size: int, cfg: dict) -> dict:
    """Rank of the ``perf_dp_overlap`` measurement: the submission's :class:`communication.buckets.BucketedReducer`
    (overlap on) and ``DistributedDataParallel`` with the same ``bucket_mb``, each on its own copy of the same tiny
    GPT-2 and the same batches (rank r its own rows). First ``parity_steps`` SGD steps of both (losses recorded),
    then ``warmup`` untimed and ``repeats`` timed rounds of ``steps`` steps, the two variants taking turns
    (:func:`course.benchmarking.interleaved`, the slowest rank's seconds).

    Returns: ``{"seconds": {"yours": [...], "library": [...]}, "tokens_per_round", "losses": {...}, "n_buckets"}``
    (every rank the same; the caller reads rank 0's)."""
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    from communication.buckets import BucketedReducer
    from course.benchmarking import interleaved
    from course.launch import context
    from course.loss import model_loss
    from course.model import build_gpt2
    from course.task import worker_env_quiet

    worker_env_quiet()
    device = context().device
    batches = [{k: v.to(device) for k, v in _batch(1000 * i + rank, cfg["per_rank_batch"], cfg["seq"],
                                                   cfg["vocab_size"]).items()}
               for i in range(max(cfg["steps"], cfg["parity_steps"]))]

    def build(name: str):
        model = build_gpt2(cfg["preset"], cfg["vocab_size"], n_positions=cfg["seq"], dropout=0.0, seed=0).to(device)
        opt = torch.optim.SGD(model.parameters(), lr=cfg["learning_rate"])
        if name == "library":
            return model, DistributedDataParallel(model, bucket_cap_mb=cfg["bucket_mb"]), opt, None
        return model, model, opt, BucketedReducer(model, group=None, bucket_mb=cfg["bucket_mb"], overlap=True)

    launched_in_backward = []

    def step(state, batch) -> float:
        model, forward, opt, reducer = state
        opt.zero_grad(set_to_none=True)
        if reducer is not None:
            reducer.events.clear()
            reducer.before_backward()
        loss = model_loss(forward, batch)
        loss.backward()
        if reducer is not None:
            if reducer.record:  # the reducer's own "launch" events (outside the assignment's blocks), in order
                launched_in_backward.append(sum(kind == "launch" for _, kind, _ in reducer.events))
            reducer.finish()
        opt.step()
        return float(loss.detach())

    states = {name: build(name) for name in ("yours", "library")}
    states["yours"][3].record = True  # the parity steps record when each bucket's all-reduce started
    losses = {name: [step(states[name], batches[i]) for i in range(cfg["parity_steps"])] for name in states}
    states["yours"][3].record = False
    gathered = [None] * world_size
    dist.all_gather_object(gathered, losses, group=None)
    seconds = interleaved({name: (lambda s=s: [step(s, b) for b in batches[:cfg["steps"]]]) for name, s in states.items()},
                          cfg["repeats"], cfg["warmup"], device, None)
    return {"seconds": seconds, "tokens_per_round": cfg["per_rank_batch"] * cfg["seq"] * cfg["steps"] * world_size,
            "losses": {name: [[g[name][i] for g in gathered] for i in range(cfg["parity_steps"])] for name in states},
            "n_buckets": len(states["yours"][3].buckets), "launched_in_backward": launched_in_backward}


def pp_worker(rank: int, world_size: int, cfg: dict) -> dict:
    """Rank of the ``perf_1f1b`` measurement: one stage of a tiny GPT-2 (``n_layer`` blocks, dropout 0) run by the
    submission's :class:`pipeline.stage_runner.StageRunner` with :func:`pipeline.schedules.one_f_one_b_actions`,
    and by ``torch.distributed.pipelining`` (``PipelineStage`` + ``Schedule1F1B``) on the same module and
    micro-batches. First one step of each for parity (the last stage's per-micro-batch losses, every rank's
    gradients), then ``warmup`` untimed and ``repeats`` timed steps, taking turns.

    Returns: ``{"seconds": {"yours": [...], "library": [...]}, "losses": {...}, "grad_diff", "grad_scale"}``."""
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B

    from course.benchmarking import interleaved
    from course.launch import context
    from course.model import build_gpt2
    from course.task import worker_env_quiet
    from pipeline.gpt2_stages import gpt2_stage
    from pipeline.schedules import one_f_one_b_actions
    from pipeline.stage_runner import StageRunner

    worker_env_quiet()
    device = context().device
    m, p = cfg["micro_batches"], world_size
    model = build_gpt2("tiny", cfg["vocab"], n_positions=cfg["seq"], dropout=0.0, seed=0, n_layer=cfg["n_layer"])
    stage, _ = gpt2_stage(model, rank, p)
    stage = stage.to(device)
    g = torch.Generator().manual_seed(1)
    inputs = [torch.randint(0, cfg["vocab"], (cfg["micro_batch_size"], cfg["seq"]), generator=g) for _ in range(m)]
    targets = [torch.randint(0, cfg["vocab"], (cfg["micro_batch_size"], cfg["seq"]), generator=g) for _ in range(m)]
    inputs, targets = [x.to(device) for x in inputs], [t.to(device) for t in targets]
    first, last = rank == 0, rank == p - 1

    def runner_loss(logits, target):
        return F.cross_entropy(logits.flatten(0, 1), target.flatten()) / m

    def torch_loss(logits, target):  # Schedule1F1B scales the gradients by 1/m itself
        return F.cross_entropy(logits.flatten(0, 1), target.flatten())

    runner = StageRunner(stage, device, loss_fn=runner_loss if last else None, group=None)
    actions = one_f_one_b_actions(rank, p, m)
    pipe = PipelineStage(stage, rank, p, device, group=None)
    schedule = Schedule1F1B(pipe, m, loss_fn=torch_loss)
    whole_in, whole_target = torch.cat(inputs), torch.cat(targets)

    def yours():
        stage.zero_grad(set_to_none=True)
        return runner.run(actions, inputs if first else None, targets if last else None).losses

    def library():
        stage.zero_grad(set_to_none=True)
        losses = []
        if first:
            schedule.step(whole_in)
        elif last:
            schedule.step(target=whole_target, losses=losses)
        else:
            schedule.step()
        return {i: float(x.detach()) / m for i, x in enumerate(losses)}

    mine_losses = yours()
    mine_grads = [q.grad.detach().clone() for q in stage.parameters()]
    theirs_losses = library()
    diff = max(float((a - q.grad).abs().max()) for a, q in zip(mine_grads, stage.parameters()))
    scale = max(float(q.grad.abs().max()) for q in stage.parameters())
    seconds = interleaved({"yours": yours, "library": library}, cfg["repeats"], cfg["warmup"], device, None)
    out = {"seconds": seconds, "grad_diff": diff, "grad_scale": scale}
    if last:
        out["losses"] = {"yours": [mine_losses[i] for i in sorted(mine_losses)],
                         "library": [theirs_losses[i] for i in sorted(theirs_losses)]}
    dist.barrier(group=None)
    return out


def bubble_ratios(configs=BUBBLE_CONFIGS) -> list[dict]:
    """The submission's 1F1B action lists (:func:`pipeline.schedules.one_f_one_b_actions`) replayed with equal
    stage costs F = 1, B = 2 (:func:`pipeline.metrics.replay_by_kind`, hand-overs free, as the theory assumes):
    ``[{"p", "m", "bubble", "theory", "ratio"}]``, one per ``(p, m)`` of ``configs``."""
    from pipeline.metrics import measured_bubble_fraction, replay_by_kind
    from pipeline.schedules import SCHEDULES, one_f_one_b_actions

    rows = []
    for p, m in configs:
        events = replay_by_kind([one_f_one_b_actions(r, p, m) for r in range(p)], {"F": 1.0, "B": 2.0})
        bubble, theory = measured_bubble_fraction(events), SCHEDULES["1f1b"].bubble(p, m, 1)
        rows.append({"p": p, "m": m, "bubble": bubble, "theory": theory, "ratio": bubble / theory})
    return rows


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


def measure(name: str, dp_config: dict | None = None, pp_config: dict | None = None) -> dict:
    """Measure one key in this process's tree (run inside the submission's grading copy): the raw numbers, the
    parity check and the machine record. Launches 2 ranks for a timed key."""
    from course.benchmarking import finish, machine
    from course.launch import launch_all

    key = PERF_KEYS[name]
    if not key.timed:
        rows = bubble_ratios()
        return {"key": name, "machine": finish(machine(busy_ranks=1)), "rows": rows,
                "ratio": max(r["ratio"] for r in rows)}
    world = 2
    info = machine("cpu", busy_ranks=world)  # before the ranks start: the load of other processes
    if name == "perf_dp_overlap":
        cfg = {**DP_CONFIG, **(dp_config or {})}
        out = launch_all(dp_worker, world, cfg, device="cpu", timeout=DEFAULT_TIMEOUT)[0]
        finish(info)
        tokens = out["tokens_per_round"]
        mine = [tokens / s for s in out["seconds"]["yours"]]
        theirs = [tokens / s for s in out["seconds"]["library"]]
        return {"key": name, "machine": info, "config": cfg, "unit": "tokens/s", "yours": mine, "library": theirs,
                "parity": dp_parity(out["losses"]), "overlap": dp_overlap(out["launched_in_backward"], out["n_buckets"])}
    cfg = {**PP_CONFIG, **(pp_config or {})}
    per_rank = launch_all(pp_worker, world, cfg, device="cpu", timeout=DEFAULT_TIMEOUT)
    finish(info)
    seconds = per_rank[0]["seconds"]
    return {"key": name, "machine": info, "config": cfg, "unit": "s", "yours": seconds["yours"],
            "library": seconds["library"],
            "parity": pp_parity(per_rank[world - 1]["losses"], max(r["grad_diff"] for r in per_rank.values()),
                                max(r["grad_scale"] for r in per_rank.values()))}


def verdict_of(measured: dict) -> dict:
    """:func:`judge` of one :func:`measure` result; the machine record and the raw numbers kept beside it."""
    key = PERF_KEYS[measured["key"]]
    if key.timed:
        checks = [measured[c] for c in ("parity", "overlap") if c in measured]
        v = judge(key, measured["yours"], measured["library"], conditions=measured["machine"]["conditions"],
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
    """``python -m instructor.performance --measure NAME --out OUT`` in ``tree`` (the grading copy), bounded by
    ``timeout``, its processes ended (the grader's :func:`instructor.grade.kill_leftovers`)."""
    import secrets

    from instructor.grade import RUN_ID_VAR, kill_leftovers

    run_id = secrets.token_hex(8)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "LLMSYS_GRADE"))}
    env.update(PYTHONPATH=str(tree), PYTHONDONTWRITEBYTECODE="1", **{RUN_ID_VAR: run_id})
    cmd = [sys.executable, "-m", "instructor.performance", "--measure", name, "--out", str(out)]
    proc = subprocess.Popen(cmd, cwd=tree, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
        output, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, 9)
        proc.communicate()
        raise RuntimeError(f"the measurement ran past {timeout:.0f} s (a hung rank?)")
    finally:
        kill_leftovers(run_id)
    if proc.returncode != 0 or not out.is_file():
        tail = "\n".join((output or "").strip().splitlines()[-15:])
        raise RuntimeError(f"the measurement failed (exit {proc.returncode}):\n{tail}")
    return json.loads(out.read_text())


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
                v = verdict_of(_run_measurement(tree, name, timeout, Path(tmp) / f"{name}.json"))
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
    parser.add_argument("--measure", default=None, choices=list(PERF_KEYS), help=argparse.SUPPRESS)
    parser.add_argument("--out", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.measure:  # inside the grading copy: measure one key, write the raw numbers
        from course.results import write_json

        write_json(args.out, measure(args.measure))
        return 0
    submission = Path(args.submission).resolve() if args.submission else None
    if submission is not None and not submission.is_dir():
        parser.error(f"--submission {submission} is not a folder")
    results = grade_performance(args.keys, submission, timeout=args.timeout)
    print_table(results)
    if args.json:
        Path(args.json).write_text(json.dumps([asdict(r) for r in results], indent=2))
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
