"""The measurements behind the performance keys (``instructor/performance.py``): raw numbers, no verdicts.

    python -m project.tools.performance --key perf_dp_overlap --out dp.json     # what the grader runs in a copy

The grader runs this module in the submission's grading copy (the key's blocks spliced in, the block policy
checked), in a subprocess, and judges what it writes (:mod:`instructor.performance`: the ratios, the parity and
overlap checks, the verdicts). Here live the ranks' work, which runs the parts' code:

* ``perf_dp_overlap`` — :func:`dp_worker`: the submission's :class:`communication.buckets.BucketedReducer` and
  ``DistributedDataParallel`` side by side, dp = 2;
* ``perf_1f1b`` — :func:`pp_worker`: the submission's 1F1B (:func:`pipeline.schedules.one_f_one_b_actions`,
  :class:`pipeline.stage_runner.StageRunner`) and ``torch.distributed.pipelining.Schedule1F1B``, p = 2;
* ``perf_bubble`` — :func:`bubble_ratios`: the submission's 1F1B action lists replayed with equal stage costs.

The measurement protocol is the harness's (:mod:`course.benchmarking`): warm-up, interleaved repeats, the slowest
rank's seconds, the machine record before the ranks start and after they end.
"""
from __future__ import annotations

import argparse
import sys

import torch

TIMED = ("perf_dp_overlap", "perf_1f1b")
UNTIMED = ("perf_bubble",)
TIMEOUT = 300.0  # seconds one launch may take (a few seconds on an idle 2-core machine)

DP_CONFIG = dict(preset="tiny", vocab_size=2048, seq=64, per_rank_batch=8, steps=2, bucket_mb=0.5, warmup=1,
                 repeats=5, parity_steps=3, learning_rate=0.05)
PP_CONFIG = dict(n_layer=4, vocab=2048, seq=64, micro_batch_size=4, micro_batches=8, warmup=1, repeats=5,
                 runner_timed=False)  # untimed actions, as Schedule1F1B runs them (no clock read per action)
BUBBLE_CONFIGS = ((2, 4), (2, 8), (4, 8), (4, 16))  # (p, m) replayed


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

    runner = StageRunner(stage, device, loss_fn=runner_loss if last else None, group=None,
                         timed=cfg.get("runner_timed", False))
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


def measure(name: str, dp_config: dict | None = None, pp_config: dict | None = None) -> dict:
    """Measure one performance key with the code of this tree: the raw numbers and the machine record
    (:func:`course.benchmarking.machine` before the ranks start, :func:`~course.benchmarking.finish` after).
    Launches 2 ranks on the CPU (gloo) for a timed key.

    Returns: ``{"key", "machine", "rows", "ratio"}`` for ``perf_bubble``; ``{"key", "machine", "config", "unit",
    "yours", "library" (per-repeat values, side by side), "losses", ...}`` for a timed key (``perf_dp_overlap``
    adds ``launched_in_backward`` and ``n_buckets``; ``perf_1f1b`` adds ``grad_diff`` and ``grad_scale``).

    Raises:
        ValueError: an unknown key.
    """
    from course.benchmarking import finish, machine
    from course.launch import launch_all

    if name in UNTIMED:
        rows = bubble_ratios()
        return {"key": name, "machine": finish(machine(busy_ranks=1)), "rows": rows,
                "ratio": max(r["ratio"] for r in rows)}
    if name not in TIMED:
        raise ValueError(f"unknown performance key {name!r}; choose one of {TIMED + UNTIMED}")
    world = 2
    info = machine("cpu", busy_ranks=world)  # before the ranks start: the load of other processes
    if name == "perf_dp_overlap":
        cfg = {**DP_CONFIG, **(dp_config or {})}
        out = launch_all(dp_worker, world, cfg, device="cpu", timeout=TIMEOUT)[0]
        finish(info)
        tokens = out["tokens_per_round"]
        return {"key": name, "machine": info, "config": cfg, "unit": "tokens/s",
                "yours": [tokens / s for s in out["seconds"]["yours"]],
                "library": [tokens / s for s in out["seconds"]["library"]], "losses": out["losses"],
                "launched_in_backward": out["launched_in_backward"], "n_buckets": out["n_buckets"]}
    cfg = {**PP_CONFIG, **(pp_config or {})}
    per_rank = launch_all(pp_worker, world, cfg, device="cpu", timeout=TIMEOUT)
    finish(info)
    seconds = per_rank[0]["seconds"]
    return {"key": name, "machine": info, "config": cfg, "unit": "s", "yours": seconds["yours"],
            "library": seconds["library"], "losses": per_rank[world - 1]["losses"],
            "grad_diff": max(r["grad_diff"] for r in per_rank.values()),
            "grad_scale": max(r["grad_scale"] for r in per_rank.values())}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description="Measure one performance key with this tree's code and write the "
                                                 "raw numbers (instructor/performance.py judges them).")
    parser.add_argument("--key", required=True, choices=TIMED + UNTIMED, help="the performance key to measure")
    from course.benchmarking import out_option
    from course.results import write_json

    out_option(parser, required=True)
    args = parser.parse_args(argv)
    from course.output_paths import require_writable_output

    require_writable_output(parser, args.out, "--out")  # before anything is measured

    write_json(args.out, measure(args.key))
    return 0


if __name__ == "__main__":
    sys.exit(main())
