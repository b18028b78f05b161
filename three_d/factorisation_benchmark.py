"""Benchmark (not a test): which factorisation ``dp x pp x tp`` of the same ranks trains fastest here.

    python -m three_d.factorisation_benchmark                 # 8 ranks, every valid factorisation
    python -m three_d.factorisation_benchmark --world_size 4 --out results/factorisation_benchmark.json

One launch of ``--world_size`` processes (gloo on the CPU) builds the mesh of every
factorisation that the model allows (:class:`course.mesh.ParallelDims`: pp at most the number of
blocks, tp dividing the heads and the MLP width) and trains the same global batch with each:
``--batch`` rows of ``--seq`` random tokens, cut into micro-batches of ``--micro_batch``
rows, so a dp rank pipelines ``batch / (dp x micro_batch)`` of them. A step is the 3D step
(:func:`three_d.step.three_d_step`, 1F1B, clipping) plus AdamW. Each repeat runs every
factorisation in turn (``--steps`` timed steps, after ``--warmup`` untimed ones in the first
repeat: memory allocation and first-call costs are paid once), so a change in
the machine's load touches all of them alike; the report gives each factorisation's median
tokens/s over ``--repeats`` repeats with the min-max, its ratio to the fastest, the 1F1B
bubble of its pipeline by the formula, and what it communicated per step, by group (kinds,
messages, bytes — :class:`course.collectives.CommCounter`).

On one machine every byte goes through the loopback and all ranks share the cores, so the
fastest factorisation here is the one with the least communication and the smallest bubble.
On a cluster the tp group sits inside a node (NVLink, hundreds of GB/s) and pp and dp cross
nodes (InfiniBand, tens of GB/s): tp's frequent, large all-reduces are cheap there and costly
across nodes, which is why Megatron-LM keeps tp within a node and scales with pp and dp
across them (Narayanan et al. 2021, Sec. 3, first takeaway).
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch


def factorisations(world_size: int, n_layer: int, n_head: int, n_inner: int) -> list[tuple[int, int, int]]:
    """Every ``(dp, pp, tp)`` with ``dp * pp * tp == world_size`` that the model allows."""
    from course.mesh import ParallelDims

    found = []
    for pp in range(1, world_size + 1):
        for tp in range(1, world_size // pp + 1):
            if world_size % (pp * tp):
                continue
            dims = ParallelDims(dp=world_size // (pp * tp), pp=pp, tp=tp)
            try:
                dims.check(world_size, n_layer=n_layer, n_head=n_head, n_inner=n_inner)
            except ValueError:
                continue
            found.append((dims.dp, pp, tp))
    return found


def benchmark_worker(rank: int, world_size: int, cfg: dict) -> list[dict]:
    """A worker for :func:`course.launch.launch`: per repeat and factorisation, this rank's step times
    and the communication of the last step (rank 0 returns them all; the others ``[]``)."""
    import torch.distributed as dist

    from course.collectives import CommCounter, name_group
    from course.launch import context
    from course.measure import now
    from course.mesh import ParallelDims
    from course.model import build_gpt2
    from course.task import worker_env_quiet
    from three_d.rank_setup import setup_rank
    from three_d.step import three_d_step

    worker_env_quiet()
    device = context().device
    runs = {}
    for dp, pp, tp in cfg["factorisations"]:  # every rank builds every mesh, in the same order
        model = build_gpt2("tiny", cfg["vocab"], n_positions=cfg["seq"], dropout=0.0, seed=0)
        ranked = setup_rank(ParallelDims(dp=dp, pp=pp, tp=tp), model, device)
        mesh, stage, runner = ranked.mesh, ranked.stage, ranked.runner
        rows = cfg["batch"] // dp
        g = torch.Generator().manual_seed(1 + mesh.dp_rank)
        ids = torch.randint(0, cfg["vocab"], (rows, cfg["seq"]), generator=g).to(device)
        runs[(dp, pp, tp)] = (mesh, stage, runner, torch.optim.AdamW(stage.parameters(), lr=1e-4), ids,
                              rows // cfg["micro_batch"])
    world = dist.group.WORLD
    report = []
    for repeat in range(cfg["repeats"]):
        for key, (mesh, stage, runner, optimizer, ids, n_chunk) in runs.items():
            for name in ("dp", "pp", "tp"):  # a dimension spanning every rank is the world group, which
                name_group(mesh.group(name), name)  # each mesh names anew: name it for this run's counts
            name_group(mesh.embedding_group, "embedding")
            times = []
            warmup = cfg["warmup"] if repeat == 0 else 0  # a factorisation warms up once, in the first round
            for step in range(warmup + cfg["steps"]):
                dist.barrier(group=world)
                start = now(device)  # course.measure: the clock after the device's queued work
                with CommCounter(timed=False) as counter:
                    three_d_step(stage, runner, mesh, ids, ids.clone(), n_chunk, "1f1b", 1.0)
                optimizer.step()
                dist.barrier(group=world)
                if step >= warmup:
                    times.append(now(device) - start)
            report.append({"dp": key[0], "pp": key[1], "tp": key[2], "repeat": repeat, "n_chunk": n_chunk,
                           "step_s": statistics.median(times), "comm": counter.by_group()})
    gathered = [None] * world_size
    dist.all_gather_object(gathered, report, group=world)
    if rank != 0:
        return []
    for r, rows in enumerate(gathered):  # communication summed over the ranks; time from rank 0
        if r == 0:
            continue
        for mine, theirs in zip(report, rows):
            for group, kinds in theirs["comm"].items():
                target = mine["comm"].setdefault(group, {})
                for kind, value in kinds.items():
                    slot = target.setdefault(kind, {k: 0 for k in value})
                    for k, v in value.items():
                        slot[k] = slot.get(k, 0) + v
    return report


def summarise(report: list[dict], cfg: dict) -> list[dict]:
    """One row per factorisation: median and min-max tokens/s, ratio to the fastest, bubble, bytes per group."""
    from pipeline import bubble_fraction

    tokens = cfg["batch"] * cfg["seq"]
    rows = []
    for key in dict.fromkeys((r["dp"], r["pp"], r["tp"]) for r in report):
        mine = [r for r in report if (r["dp"], r["pp"], r["tp"]) == key]
        tps = [tokens / r["step_s"] for r in mine]
        comm = mine[-1]["comm"]
        rows.append({"dp": key[0], "pp": key[1], "tp": key[2], "micro_batches": mine[-1]["n_chunk"],
                     "tokens_per_s_median": statistics.median(tps), "tokens_per_s_min": min(tps),
                     "tokens_per_s_max": max(tps),
                     "bubble_theory": bubble_fraction(key[1], mine[-1]["n_chunk"]),
                     "megabytes_per_step": {g: sum(v.get("bytes", 0) for v in kinds.values()) / 1e6
                                            for g, kinds in comm.items()},
                     "messages_per_step": {g: sum(v.get("count", 0) for v in kinds.values())
                                           for g, kinds in comm.items()}})
    best = max(r["tokens_per_s_median"] for r in rows)
    for r in rows:
        r["ratio_to_fastest"] = r["tokens_per_s_median"] / best
    return sorted(rows, key=lambda r: -r["tokens_per_s_median"])


def format_table(rows: list[dict]) -> str:
    lines = [f"{'dp':>2} {'pp':>2} {'tp':>2} {'m':>3} {'tokens/s':>9} {'(min-max)':>15} {'ratio':>5} {'bubble':>6}  "
             f"MB per step (all ranks) by group; messages"]
    for r in rows:
        comm = ", ".join(f"{g} {mb:.1f} MB/{r['messages_per_step'][g]}" for g, mb in
                         sorted(r["megabytes_per_step"].items()) if mb)
        lines.append(f"{r['dp']:>2} {r['pp']:>2} {r['tp']:>2} {r['micro_batches']:>3} {r['tokens_per_s_median']:9.0f} "
                     f"({r['tokens_per_s_min']:6.0f}-{r['tokens_per_s_max']:6.0f}) {r['ratio_to_fastest']:5.2f} "
                     f"{r['bubble_theory']:6.3f}  {comm}")
    return "\n".join(lines)


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--world_size", type=int, default=8)
    parser.add_argument("--batch", type=int, default=32, help="global batch (rows)")
    parser.add_argument("--micro_batch", type=int, default=2, help="rows per micro-batch")
    parser.add_argument("--seq", type=int, default=32, help="tokens per row")
    parser.add_argument("--vocab", type=int, default=5000, help="vocabulary size (the course tokenizer's order)")
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--steps", type=int, default=2, help="timed steps per factorisation and repeat")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--timeout", type=float, default=1200, help="seconds before the run is stopped")
    parser.add_argument("--out", type=Path, default=Path("results/factorisation_benchmark.json"))
    parser.add_argument("--device", default="cpu", choices=["auto", "cpu", "cuda"],
                        help="cuda: one GPU per rank with NCCL (auto: when there are enough)")
    args = parser.parse_args(argv)
    from course.launch import default_world_size, in_torchrun, resolve_device_backend

    if in_torchrun():
        if "--world_size" in (argv if argv is not None else sys.argv) and args.world_size != default_world_size(0):
            parser.error(f"under torchrun --world_size is torchrun's WORLD_SIZE={default_world_size(0)}: leave it out")
        args.world_size = default_world_size(0)
    try:
        args.device, _ = resolve_device_backend(args.device, "auto", args.world_size)
    except ValueError as exc:
        parser.error(str(exc))
    if args.repeats < 3:
        parser.error(f"--repeats {args.repeats}: use at least 3 (median and min-max)")
    if args.world_size < 1 or args.steps < 1 or args.warmup < 0 or args.micro_batch < 1:
        parser.error("--world_size, --steps and --micro_batch must be >= 1, --warmup >= 0")
    from course.model import PRESETS

    shape = PRESETS["tiny"]
    args.factorisations = factorisations(args.world_size, shape["n_layer"], shape["n_head"], 4 * shape["n_embd"])
    bad = [f for f in args.factorisations if args.batch % (f[0] * args.micro_batch)]
    if bad:
        parser.error(f"--batch {args.batch} must be divisible by dp x --micro_batch for every factorisation "
                     f"(dp up to {max(f[0] for f in args.factorisations)}); try --batch "
                     f"{args.world_size * args.micro_batch * 2}")
    return args


def main(argv=None) -> int:
    from course.launch import launch, reports_results
    from course.measure import timer_name

    args = parse_args(argv)
    cfg = {k: getattr(args, k) for k in ("batch", "micro_batch", "seq", "vocab", "warmup", "steps", "repeats")}
    cfg["factorisations"] = args.factorisations
    print(f"{len(args.factorisations)} factorisations of {args.world_size} ranks (dp, pp, tp): {args.factorisations}",
          file=sys.stderr, flush=True)
    started = time.time()
    report = launch(benchmark_worker, args.world_size, cfg, device=args.device, timeout=args.timeout,
                    collective_timeout=600)
    if not reports_results():
        return 0
    report = report[0]  # rank 0 gathers every rank's communication (benchmark_worker)
    rows = summarise(report, cfg)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"config": {**cfg, "world_size": args.world_size,
                                               "cpu_count": __import__("os").cpu_count(),
                                               "torch": torch.__version__, "device": args.device,
                                               "timer": timer_name(args.device)},
                                    "rows": rows, "report": report}, indent=1))
    print(format_table(rows))
    print(f"{time.time() - started:.0f} s; written: {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
