"""Loss parity: every parallel configuration trains the model one process trains, on the same batches.

    python project/tools/parity.py                        # every configuration, 20 steps, table + plot
    python project/tools/parity.py --steps 5 --cases "DP 2" "1F1B, pp 2" "TP 2 + SP"
    python project/tools/parity.py --out results/parity.json --plot parity.png

Each configuration of :data:`project.tools.parity_cases.CASES` (data parallelism, its bucketed and compressed
variants, ZeRO-1/2/3, the four pipeline schedules, tensor and sequence parallelism, expert
parallelism, 3D) and the one-process references of :data:`project.tools.parity_cases.REFERENCES` train the
same GPT-2 (``--preset``, dropout 0, the same seed, AdamW) on the same ``--steps`` global batches of
``--batch_size`` training pairs (the first ``--max_train_examples`` Multi30k pairs in a seeded order,
:func:`course.task.prepare_data`). At every step the harness records

* the loss of the global batch: the mean of the losses the ranks computed (a pipeline's last stage;
  every dp rank its shard's);
* the norm of the gradient the optimizer applies, over the whole model: each rank's optimizer
  gradients as the optimizer's pre-step hook sees them (averaged, reduced, decompressed, a ZeRO shard),
  a tensor held identically by several ranks (dp replicas, a tensor replicated over tp, the tied
  embedding's two copies) counted once — identical bytes are one tensor.

It prints, per configuration, the largest difference from its reference over the steps (loss in
nats/token; gradient norm relative), the tolerance with its reason, and whether it holds. The ranks of
one world size run every configuration of that size in one launch (:func:`course.launch.launch`; in
the test suite the pooled ranks of :mod:`course.launch_pool`).

Library use (notebook 06): :func:`run_parity` returns the report, :func:`parity_table` its rows,
:func:`check_parity` raises if a tolerance is broken, :func:`course.plots.plot_parity` draws it.
"""
from __future__ import annotations

import argparse
import dataclasses
import hashlib
import importlib
import json
import math
import sys
from pathlib import Path

if __name__ == "__main__":  # run as a file: import the packages of the tree this script sits in
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from course import benchmarking  # noqa: E402
from project.tools.parity_cases import CASES, REFERENCES, ParityCase, builder  # noqa: E402

DEFAULTS = {"preset": "tiny", "max_train_examples": 256, "batch_size": 8, "learning_rate": 1e-3, "seed": 11,
            "dropout": 0.0, "n_bleu": 0, "quiet": True}


def case_config(case: ParityCase, settings: dict):
    """The case's script configuration: ``Class.for_test(**settings, **case.options)``."""
    module, name = case.config.split(":")
    cls = getattr(importlib.import_module(module), name)
    return cls.for_test(**{**settings, **case.options})


def global_batches(data, steps: int, batch_size: int, seed: int) -> list[dict]:
    """The ``steps`` global batches every configuration trains on: the training pairs in the order of
    ``torch.randperm(len(train))`` seeded with ``seed``, ``batch_size`` at a time, collated
    (``input_ids``, ``attention_mask``, ``labels``: (batch_size, seq)).

    Raises:
        ValueError: fewer than ``steps * batch_size`` training pairs.
    """
    import torch

    if steps * batch_size > len(data.train):
        raise ValueError(f"{steps} steps of {batch_size} pairs need {steps * batch_size} training pairs, the data has "
                         f"{len(data.train)}: raise --max_train_examples or lower --steps")
    order = torch.randperm(len(data.train), generator=torch.Generator().manual_seed(seed), device="cpu").tolist()
    return [data.collate([data.train[i] for i in order[s * batch_size:(s + 1) * batch_size]]) for s in range(steps)]


def _digest(t) -> str:
    import torch

    return hashlib.sha1(t.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()).hexdigest()


class AppliedGradients:
    """Records, at each ``optimizer.step``, every gradient the optimizer holds: ``(digest, sum of squares)``."""

    def __init__(self, optimizer):
        self.steps: list[list[tuple[str, float]]] = []
        optimizer.register_step_pre_hook(self._record)

    def _record(self, optimizer, args, kwargs) -> None:
        self.steps.append([(_digest(p.grad), float(p.grad.detach().double().pow(2).sum()))
                           for group in optimizer.param_groups for p in group["params"] if p.grad is not None])


def global_norm(per_rank: list[list[tuple[str, float]]]) -> float:
    """The 2-norm over the union of every rank's gradients, each distinct tensor (by digest) counted once."""
    squares = {}
    for entries in per_rank:
        squares.update(entries)
    return math.sqrt(sum(squares.values()))


def parity_worker(rank: int, world_size: int, cases: list[ParityCase], settings: dict, steps: int) -> list[dict]:
    """Every case of ``cases`` for ``steps`` steps, one after the other, on this launch's ranks.

    A case of ``world_size`` ranks runs on all of them; a case of fewer ranks (the one-process references)
    runs on the first ``case.world_size`` ranks alone, in a group of their own, while the others go on.

    Returns (rank 0; the others ``[]``) one dict per case: ``name``, ``losses`` and ``grad_norms`` per step,
    ``seconds`` it took (not a benchmark).
    """
    import torch
    import torch.distributed as dist

    from course.launch import context
    from course.measure import now
    from course.task import prepare_data, worker_env_quiet

    worker_env_quiet()
    device = context().device
    # One thread per rank, whatever the world size: every rank (and the one-process references) runs the
    # same CPU kernels, and on a shared machine the references' threads do not spin against the others.
    torch.set_num_threads(1)
    sizes = sorted({c.world_size for c in cases if c.world_size < world_size})
    subgroups = {n: dist.new_group(list(range(n))) for n in sizes}  # collective: every rank makes every group
    data = batches = None
    found = []
    for case in cases:
        if rank >= case.world_size:
            continue
        began = now(device)
        config = case_config(case, settings)
        if data is None:
            data = prepare_data(config)
            batches = global_batches(data, steps, settings["batch_size"], settings["seed"])
        group = subgroups.get(case.world_size, dist.group.WORLD)
        try:
            stepper = builder(case.builder)(rank, config, data, device, group=group)
            applied = AppliedGradients(stepper.optimizer)
            losses = [stepper.step(batch) for batch in batches]
        except Exception as exc:
            raise RuntimeError(f"parity case {case.name!r} failed on rank {rank}: {type(exc).__name__}: {exc}") from exc
        mine = {"losses": losses, "grads": applied.steps}
        everyone = [mine] if case.world_size == 1 else [None] * case.world_size
        if case.world_size > 1:
            dist.all_gather_object(everyone, mine, group=group)
        per_step_losses = [[r["losses"][s] for r in everyone if r["losses"][s] is not None] for s in range(steps)]
        found.append({"name": case.name,
                      "losses": [sum(v) / len(v) for v in per_step_losses],
                      "grad_norms": [global_norm([r["grads"][s] for r in everyone]) for s in range(steps)],
                      "seconds": now(device) - began})
    return found if rank == 0 else []


def _launch(cases: list[ParityCase], settings: dict, steps: int, world_size: int) -> dict[str, dict]:
    from course.launch import launch

    out = launch(parity_worker, world_size, cases, settings, steps, device=settings.get("device", "auto"),
                 timeout=settings.get("timeout", 1800))
    return {r["name"]: r for r in out[0]}


def run_parity(names: list | None = None, steps: int = 20, **settings) -> dict:
    """Train every configuration (or those named) and its references; compare them step by step.

    One launch per world size; the one-process references run on rank 0 of the smallest one.

    Args:
        names: case names of :data:`project.tools.parity_cases.CASES`, or :class:`ParityCase` entries (None: all).
        steps: optimizer steps (global batches).
        **settings: configuration fields common to every case (defaults :data:`DEFAULTS`; ``workdir``
            is where the tokenizer is cached; ``device``; ``timeout`` of each launch in seconds).

    Returns:
        ``{"settings", "steps", "references": {key: {name, losses, grad_norms}}, "cases": [row]}`` with, per
        row, the case's fields, its ``losses`` and ``grad_norms`` per step, ``loss_diff`` and ``grad_diff``
        (the largest |loss difference| and relative gradient-norm difference over the steps) and ``ok``.

    Raises:
        ValueError: an unknown case name; too few training pairs for the steps.
        course.launch.RankFailure: a case failed on a rank (its name in the message).
    """
    settings = {**DEFAULTS, "workdir": "workdir/parity", **settings}
    chosen = CASES if names is None else [_case(n) for n in names]
    wanted = {c.reference for c in chosen} | ({"token"} if any(c.reference == "shards" for c in chosen) else set())
    by_world: dict[int, list[ParityCase]] = {}
    for case in chosen:
        by_world.setdefault(case.world_size, []).append(case)
    smallest = min(by_world, default=1)
    by_world[smallest] = [REFERENCES[k] for k in REFERENCES if k in wanted] + by_world.get(smallest, [])
    runs: dict[str, dict] = {}
    for world_size, cases in sorted(by_world.items()):
        runs.update(_launch(cases, settings, steps, world_size))
    references = {key: runs[REFERENCES[key].name] for key in REFERENCES if REFERENCES[key].name in runs}
    rows = [_compare(REFERENCES["shards"], runs, references)] if "shards" in wanted else []
    rows += [_compare(case, runs, references) for case in chosen]
    return {"settings": settings, "steps": steps, "references": references, "cases": rows}


def _case(name) -> ParityCase:
    if isinstance(name, ParityCase):
        return name
    for case in CASES:
        if case.name == name:
            return case
    raise ValueError(f"unknown parity case {name!r}; choose from {[c.name for c in CASES]}")


def _compare(case: ParityCase, runs: dict, references: dict) -> dict:
    run, ref = runs[case.name], references[case.reference]
    loss_diff = max(abs(a - b) for a, b in zip(run["losses"], ref["losses"]))
    grad_diff = max(abs(a - b) / max(b, 1e-30) for a, b in zip(run["grad_norms"], ref["grad_norms"]))
    return {**dataclasses.asdict(case), "reference_name": ref["name"], "losses": run["losses"],
            "grad_norms": run["grad_norms"], "loss_diff": loss_diff, "grad_diff": grad_diff,
            "ok": bool(loss_diff <= case.loss_tol and grad_diff <= case.grad_tol)}


def parity_table(report: dict) -> list[dict]:
    """One row per configuration: name, ranks, reference, measured worst differences, tolerances, ok, reason."""
    return [{"configuration": r["name"], "ranks": r["world_size"], "reference": r["reference_name"],
             "max |Δloss|": r["loss_diff"], "loss tolerance": r["loss_tol"],
             "max |Δ‖g‖|/‖g‖": r["grad_diff"], "grad tolerance": r["grad_tol"], "ok": r["ok"], "reason": r["reason"]}
            for r in report["cases"]]


def format_table(report: dict) -> str:
    """The table as text (one line per configuration, the reasons below it)."""
    head = f"{'configuration':36} {'ranks':>5} {'max|Δloss|':>11} {'tol':>8} {'max Δ|g|/|g|':>13} {'tol':>8}  ok"
    lines = [head, "-" * len(head)]
    for r in report["cases"]:
        lines.append(f"{r['name']:36} {r['world_size']:>5} {r['loss_diff']:>11.2e} {r['loss_tol']:>8.0e} "
                     f"{r['grad_diff']:>13.2e} {r['grad_tol']:>8.0e}  {'yes' if r['ok'] else 'NO'}")
    lines.append("")
    lines.append(f"{report['steps']} steps, global batch {report['settings']['batch_size']}, preset "
                 f"{report['settings']['preset']}, dropout 0; references: " +
                 "; ".join(f"{k}: {v['name']}" for k, v in report["references"].items()))
    lines += [f"  {r['name']}: {r['reason']}" for r in report["cases"]]
    return "\n".join(lines)


def check_parity(report: dict) -> None:
    """Raise AssertionError naming every configuration whose difference exceeds its tolerance."""
    bad = [f"{r['name']}: max |Δloss| {r['loss_diff']:.2e} (tolerance {r['loss_tol']:.0e}), max relative Δ|g| "
           f"{r['grad_diff']:.2e} (tolerance {r['grad_tol']:.0e})" for r in report["cases"] if not r["ok"]]
    assert not bad, "configurations that do not train the one-process model:\n  " + "\n  ".join(bad)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    benchmarking.steps_option(parser, 20)
    parser.add_argument("--cases", nargs="+", default=None, metavar="NAME",
                        help=f"configurations to run (default: all): {', '.join(repr(c.name) for c in CASES)}".replace("%", "%%"))  # argparse formats help with %
    for name in ("batch_size", "max_train_examples", "preset"):
        benchmarking.option(parser, name, default=DEFAULTS[name])
    benchmarking.option(parser, "workdir", default="workdir/parity", note="the parity runs: the tokenizer's cache")
    benchmarking.option(parser, "device")
    benchmarking.out_option(parser)
    parser.add_argument("--plot", default=None, help="save the plot of the curves here (PNG, PDF, SVG)")
    args = parser.parse_args(argv)
    from course.output_paths import require_writable_output

    require_writable_output(parser, args.out, "--out")  # before any run
    require_writable_output(parser, args.plot, "--plot")
    if args.steps < 1:
        parser.error(f"--steps must be >= 1, not {args.steps}")
    if args.batch_size % 8:
        parser.error(f"--batch_size must be a multiple of 8 (dp 2 x 4 micro-batches; 3D: dp 2 x 2 micro-batches x 2), "
                     f"not {args.batch_size}")
    known = {c.name for c in CASES}
    for name in args.cases or []:
        if name not in known:
            parser.error(f"unknown case {name!r}; choose from: {', '.join(repr(c.name) for c in CASES)}".replace("%", "%%"))  # argparse formats help with %
    if args.steps * args.batch_size > args.max_train_examples:
        parser.error(f"{args.steps} steps of {args.batch_size} pairs need --max_train_examples >= "
                     f"{args.steps * args.batch_size}")
    from course.launch import RankFailure

    try:
        report = run_parity(args.cases, args.steps, batch_size=args.batch_size, preset=args.preset,
                            max_train_examples=args.max_train_examples, workdir=args.workdir, device=args.device)
    except RankFailure as exc:
        print(f"parity run failed: {exc}", file=sys.stderr)
        return 1
    print(format_table(report))
    if args.out:
        from course.results import write_json

        write_json(Path(args.out), report)
    if args.plot:
        from course.plots import plot_parity

        plot_parity(report).savefig(args.plot, dpi=120, bbox_inches="tight")
    return 0 if all(r["ok"] for r in report["cases"]) else 1


if __name__ == "__main__":
    sys.exit(main())
