"""Benchmark (not a test): which factorisation ``dp x pp x tp`` of the same ranks trains fastest here.

    python -m three_d.labs.factorisation_benchmark                 # 8 ranks, every valid factorisation
    python -m three_d.labs.factorisation_benchmark --world_size 4 --out results/factorisation_benchmark.json

One launch of ``--world_size`` processes (gloo on the CPU) builds the mesh of every
factorisation that the model allows (:class:`course.mesh.ParallelDims`: pp at most the number of
blocks, tp dividing the heads and the MLP width) and trains the same global batch with each:
``--batch_size`` rows of ``--seq_len`` random tokens, cut into micro-batches of ``--micro_batch_size``
rows, so a dp rank pipelines ``batch_size / (dp x micro_batch_size)`` of them. A step is the 3D step
(:func:`three_d.step.three_d_step`, 1F1B, clipping) plus AdamW. The one benchmark harness
(:mod:`course.benchmarking`) times it: ``--warmup`` untimed steps of each factorisation, then
``--repeats`` rounds in which every factorisation takes ``--steps`` timed steps in turn (the slowest
rank's time), so a change in the machine's load touches all of them alike; the report gives each
factorisation's median tokens/s with the min-max, its ratio to the fastest, the 1F1B bubble of its
pipeline by the formula, what it communicated per step, by group (kinds, messages, bytes —
:class:`course.collectives.CommCounter`), and the memory of its fullest rank (bytes of parameters,
gradients and AdamW state held after a step, plus the peak bytes of activations saved for the backward
pass), with the machine it ran on.

On one machine every byte goes through the loopback and all ranks share the cores, so the
fastest factorisation here is the one with the least communication and the smallest bubble.
On a cluster the tp group sits inside a node (NVLink, hundreds of GB/s) and pp and dp cross
nodes (InfiniBand, tens of GB/s): tp's frequent, large all-reduces are cheap there and costly
across nodes, which is why Megatron-LM keeps tp within a node and scales with pp and dp
across them (Narayanan et al. 2021, Sec. 3, first takeaway).

Former option names (``--batch``, ``--micro_batch``, ``--vocab``) still work, with a note.
"""
from __future__ import annotations

import sys
import time

import torch

from course.factorisations import factorisations


def benchmark_worker(rank: int, world_size: int, cfg: dict) -> list[dict]:
    """A worker for :func:`course.launch.launch`: per repeat and factorisation, the seconds per step (the
    slowest rank's, :func:`course.benchmarking.interleaved`), the communication of a step summed over
    the ranks, and every rank's costs of the repeat's last step for a replay (``costs[r]``: ``{"events": CPU seconds
    per action of its schedule, "tail": CPU seconds of the rest of the step}``, :func:`three_d.choosing.replayed_steps`)
    (rank 0 returns them all; the others ``[]``).

    ``cfg``: ``factorisations`` [(dp, pp, tp)], ``batch_size``, ``micro_batch_size``, ``seq_len``, ``vocab_size``,
    ``warmup``, ``steps``, ``repeats``."""
    import copy

    import torch.distributed as dist

    from course.benchmarking import interleaved
    from course.collectives import CommCounter, name_group
    from course.launch import context
    from course.mesh import ParallelDims
    from course.model import build_gpt2
    from course.task import worker_env_quiet
    from three_d.rank_setup import setup_rank
    from three_d.step import three_d_step

    from course.measure import cpu_seconds

    worker_env_quiet()
    device = context().device
    world = dist.group.WORLD
    variants, comm, micro, memory, costs = {}, {}, {}, {}, {}
    for dp, pp, tp in cfg["factorisations"]:  # every rank builds every mesh, in the same order
        model = build_gpt2("tiny", cfg["vocab_size"], n_positions=cfg["seq_len"], dropout=0.0, seed=0)
        ranked = setup_rank(ParallelDims(dp=dp, pp=pp, tp=tp), model, device)
        rows = cfg["batch_size"] // dp
        g = torch.Generator().manual_seed(1 + ranked.mesh.dp_rank)
        ids = torch.randint(0, cfg["vocab_size"], (rows, cfg["seq_len"]), generator=g).to(device)
        key = (dp, pp, tp)
        micro[key] = rows // cfg["micro_batch_size"]

        def step(key=key, ranked=ranked, ids=ids, optimizer=torch.optim.AdamW(ranked.stage.parameters(), lr=1e-4)):
            mesh = ranked.mesh
            for name in ("dp", "pp", "tp"):  # a dimension spanning every rank is the world group, which
                name_group(mesh.group(name), name)  # each mesh names anew: name it for this run's counts
            name_group(mesh.embedding_group, "embedding")
            start = cpu_seconds()
            with CommCounter() as counter:
                out = three_d_step(ranked.stage, ranked.runner, mesh, ids, ids.clone(), micro[key], "1f1b", 1.0)
            optimizer.step()
            events = list(out["result"].event_cpu_s)
            # this rank's costs for a replay: CPU seconds per action of the schedule, and of the rest of the step
            # (the dp and embedding all-reduces' CPU work, clipping, the optimizer): three_d.choosing.replayed_steps
            costs.setdefault(key, []).append({"events": events, "tail": cpu_seconds() - start - sum(events)})
            comm[key] = counter.by_group()
            memory[key] = held_bytes(ranked.stage, optimizer) | {"activations": out["result"].peak_activation_bytes}

        variants[key] = step
    times = interleaved(variants, cfg["repeats"], cfg["warmup"], device, group=world, inner=cfg["steps"])
    last = [cfg["warmup"] + (repeat + 1) * cfg["steps"] - 1 for repeat in range(cfg["repeats"])]  # each repeat's last step
    report = [{"dp": key[0], "pp": key[1], "tp": key[2], "repeat": repeat, "micro_batches": micro[key],
               "step_s": seconds, "comm": copy.deepcopy(comm[key]), "memory": [memory[key]],
               "costs": [costs[key][last[repeat]]]}
              for repeat in range(cfg["repeats"]) for key, per in times.items() for seconds in [per[repeat]]]
    gathered = [None] * world_size
    dist.all_gather_object(gathered, report, group=world)
    if rank != 0:
        return []
    for r, rows in enumerate(gathered):  # communication summed over the ranks; times are the slowest rank's
        if r == 0:
            continue
        for mine, theirs in zip(report, rows):
            mine["memory"] += theirs["memory"]
            mine["costs"] += theirs["costs"]  # rank order: costs[r] is rank r's
            for group, kinds in theirs["comm"].items():
                target = mine["comm"].setdefault(group, {})
                for kind, value in kinds.items():
                    slot = target.setdefault(kind, {k: 0 for k in value})
                    for k, v in value.items():
                        slot[k] = slot.get(k, 0) + v
    return report


def held_bytes(module, optimizer) -> dict:
    """Bytes this rank holds: ``params`` and ``grads`` of ``module`` and the tensors of ``optimizer``'s state
    (AdamW: two moments per parameter and a step counter per tensor)."""
    params = list(module.parameters())
    state = [t for s in optimizer.state.values() for t in s.values() if torch.is_tensor(t)]
    return {"params": sum(p.numel() * p.element_size() for p in params),
            "grads": sum(p.grad.numel() * p.grad.element_size() for p in params if p.grad is not None),
            "optimizer": sum(t.numel() * t.element_size() for t in state)}


def summarise(report: list[dict], cfg: dict) -> list[dict]:
    """One row per factorisation: median and min-max tokens/s (:func:`course.benchmarking.summarise`), ratio to
    the fastest, bubble, bytes per group, ``memory_bytes`` (the fullest rank: held bytes and peak
    activations) and ``memory`` (that rank's bytes by category)."""
    from course.benchmarking import summarise as stats
    from pipeline import bubble_fraction

    tokens = cfg["batch_size"] * cfg["seq_len"]
    rows = []
    for key in dict.fromkeys((r["dp"], r["pp"], r["tp"]) for r in report):
        mine = [r for r in report if (r["dp"], r["pp"], r["tp"]) == key]
        tps = stats([tokens / r["step_s"] for r in mine])
        comm = mine[-1]["comm"]
        fullest = max(mine[-1].get("memory", [{}]), key=lambda m: sum(m.values()))
        rows.append({"dp": key[0], "pp": key[1], "tp": key[2], "micro_batches": mine[-1]["micro_batches"],
                     "tokens_per_s_median": tps["median"], "tokens_per_s_min": tps["min"],
                     "tokens_per_s_max": tps["max"], "repeats": tps["n"],
                     "bubble_theory": bubble_fraction(key[1], mine[-1]["micro_batches"]),
                     "megabytes_per_step": {g: sum(v.get("bytes", 0) for v in kinds.values()) / 1e6
                                            for g, kinds in comm.items()},
                     "messages_per_step": {g: sum(v.get("count", 0) for v in kinds.values())
                                           for g, kinds in comm.items()},
                     "memory_bytes": sum(fullest.values()), "memory": fullest})
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


def make_parser():
    """The command line (:func:`course.benchmarking.parser` and this benchmark's own options)."""
    from course import benchmarking

    parser = benchmarking.parser(__doc__.split("\n\n")[0], out="results/factorisation_benchmark.json", device="cpu",
                                 timeout=1200, steps=2)
    parser.add_argument("--world_size", type=int, default=8, help="ranks to factorise as dp x pp x tp")
    benchmarking.option(parser, "batch_size", default=32)
    parser.add_argument("--micro_batch_size", type=int, default=2, help="rows per micro-batch")
    benchmarking.option(parser, "seq_len", default=32, note="a benchmark: random tokens")
    benchmarking.option(parser, "vocab_size")
    return parser


def parse_args(argv=None):
    from course import benchmarking
    from course.model import PRESETS

    parser = make_parser()
    args = parser.parse_args(argv)
    args.world_size = benchmarking.torchrun_size(parser, args.world_size, "--world_size", argv) or args.world_size
    if args.world_size < 1 or args.steps < 1 or args.micro_batch_size < 1:
        parser.error("--world_size, --steps and --micro_batch_size must be >= 1")
    benchmarking.check(parser, args, args.world_size)
    shape = PRESETS["tiny"]
    args.factorisations = factorisations(args.world_size, shape["n_layer"], shape["n_head"], 4 * shape["n_embd"])
    bad = [f for f in args.factorisations if args.batch_size % (f[0] * args.micro_batch_size)]
    if bad:
        parser.error(f"--batch_size {args.batch_size} must be divisible by dp x --micro_batch_size for every "
                     f"factorisation (dp up to {max(f[0] for f in args.factorisations)}); try --batch_size "
                     f"{args.world_size * args.micro_batch_size * 2}")
    return args


def main(argv=None) -> int:
    from course.benchmarking import describe, machine, write_report
    from course.launch import launch, reports_results

    args = parse_args(argv)
    info = machine(args.device)  # the load average before the ranks start
    cfg = {k: getattr(args, k) for k in ("batch_size", "micro_batch_size", "seq_len", "vocab_size", "warmup", "steps",
                                         "repeats")}
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
    write_report(args.out, {"machine": info, "config": {**cfg, "world_size": args.world_size, "device": args.device},
                            "rows": rows, "report": report})
    print(describe(info))
    print(format_table(rows))
    print(f"{time.time() - started:.0f} s; written: {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
