"""Communication benchmark: all-reduce latency and bus bandwidth, and data-parallel training tokens/s.

    python project/benchmark.py                               # 2 ranks, 1 KB .. 64 MB, 5 repeats
    python project/benchmark.py --sizes 1KB 1MB 64MB --world_sizes 2 3 --repeats 7 --out out.json
    torchrun --standalone --nproc_per_node=8 project/benchmark.py --device cuda   # 8 GPUs, NCCL

Part 1, for each world size: ``dist.all_reduce`` (the back-end's own: gloo, or NCCL on GPUs),
:func:`communication.ring_all_reduce`
and :func:`communication.tree_all_reduce` (recursive doubling) on float32 tensors of each
size, taking turns in every repeat (interleaved), after a warm-up; the median and min-max
of the slowest rank's time, the bus bandwidth ``2 (p-1)/p N / t``, an alpha-beta line fitted
per algorithm, and the ring-vs-tree crossover size.

Part 2 (``--dp`` ranks): training tokens/s of GPT-2 (``--preset``, synthetic tokens)
with ``average_gradients``, the bucketed overlapped reducer and torch DDP (same
``--bucket_mb``), interleaved repeats, median and min-max, and the ratio to DDP
(:func:`communication.experiments.dp_throughput_worker`).

The measuring — warm-up, interleaved repeats, median and min-max, the machine it ran on, the JSON,
the shared options — is the course's one benchmark harness (:mod:`course.benchmarking`). Prints tables
and writes everything to ``--out`` (notebooks/04_communication.ipynb reads it), with the device and the
clock it was measured with (``timer``: :mod:`course.measure`; on a GPU every time is read after the
device's queued work has run). Under torchrun the world sizes are torchrun's, and rank 0 prints and
writes. Former option names (``--json``, ``--dp_world_size``) still work, with a note.
"""
from __future__ import annotations

import re
import sys
from pathlib import Path

if __name__ == "__main__":  # run as a file: import the packages of the tree this script sits in
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from course.launch import RankFailure, default_world_size, launch, reports_results  # noqa: E402

DEFAULT_SIZES = ["1KB", "4KB", "16KB", "64KB", "256KB", "1MB", "4MB", "16MB", "64MB"]
UNITS = {"": 1, "B": 1, "KB": 1024, "MB": 1024**2, "GB": 1024**3}


def parse_size(text: str) -> int:
    """``"64MB"`` -> 67108864 (KB, MB, GB are powers of 1024; plain numbers are bytes)."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMG]?B?)\s*", text.upper())
    if not m:
        raise ValueError(f"cannot read the size {text!r}: write e.g. 1024, 1KB, 4MB")
    return int(float(m.group(1)) * UNITS[m.group(2)])


def human(n: float) -> str:
    for unit in ("GB", "MB", "KB"):
        if n >= UNITS[unit]:
            return f"{n / UNITS[unit]:g}{unit}"
    return f"{int(n)}B"


def make_parser():
    """The command line (:func:`course.benchmarking.parser` and this benchmark's own options)."""
    from course import benchmarking

    parser = benchmarking.parser(__doc__.split("\n\n")[0], out="workdir/benchmark_communication.json", repeats=5,
                                 timeout=1800.0)
    parser.add_argument("--sizes", nargs="+", default=DEFAULT_SIZES, help="message sizes (bytes, or with KB/MB/GB)")
    parser.add_argument("--world_sizes", nargs="+", type=int, default=[default_world_size(2)],
                        help="ranks of the all-reduce benchmark (under torchrun: its WORLD_SIZE)")
    parser.add_argument("--skip_allreduce", action="store_true", help="skip part 1")
    dp = parser.add_argument_group("data-parallel throughput (part 2)")
    dp.add_argument("--skip_dp", action="store_true", help="skip part 2")
    dp.add_argument("--dp", type=int, default=default_world_size(2), help="data-parallel ranks")
    dp.add_argument("--preset", default="tiny", help="GPT-2 preset (course.model.PRESETS)")
    dp.add_argument("--vocab_size", type=int, default=5000)
    dp.add_argument("--seq", type=int, default=64, help="tokens per sequence")
    dp.add_argument("--per_rank_batch", type=int, default=8, help="sequences per rank per step")
    dp.add_argument("--dp_steps", type=int, default=8, help="steps per timed repeat")
    dp.add_argument("--dp_repeats", type=int, default=7, help="timed repeats (interleaved)")
    dp.add_argument("--bucket_mb", type=float, default=1.0, help="bucket size of the bucketed reducer and of DDP (MB)")
    benchmarking.old_name(parser, "--json", "--out")
    benchmarking.old_name(parser, "--dp_world_size", "--dp")
    return parser


def parse_args(argv=None):
    from course import benchmarking
    from course.model import PRESETS

    parser = make_parser()
    args = parser.parse_args(argv)
    try:
        args.sizes_bytes = sorted({parse_size(s) for s in args.sizes})
    except ValueError as exc:
        parser.error(f"--sizes: {exc}")
    if any(s < 4 for s in args.sizes_bytes):
        parser.error("--sizes: every size must be at least 4 bytes (one float32)")
    if args.dp_repeats < benchmarking.MIN_REPEATS:
        parser.error(f"--dp_repeats must be >= {benchmarking.MIN_REPEATS} (a median and a spread need three points)")
    if any(w < 2 for w in args.world_sizes) or args.dp < 2:
        parser.error("--world_sizes and --dp must be >= 2 (an all-reduce needs two ranks)")
    if args.bucket_mb <= 0:
        parser.error(f"--bucket_mb must be > 0, not {args.bucket_mb}")
    size = benchmarking.torchrun_size(parser, args.world_sizes, "--world_sizes", argv)
    if size is not None:
        benchmarking.torchrun_size(parser, args.dp, "--dp", argv)
        args.world_sizes, args.dp = [size], size
    benchmarking.check(parser, args, max(args.world_sizes + [args.dp]))
    if args.preset not in PRESETS:
        parser.error(f"--preset must be one of {sorted(PRESETS)}, not {args.preset!r}")
    if len(args.sizes_bytes) < 2 and not args.skip_allreduce:
        parser.error("--sizes: give at least two sizes (the alpha-beta fit needs two points)")
    return args


def _one(per_rank: dict):
    """The value of one rank (the workers return the slowest rank's times, the same on every rank)."""
    return per_rank[min(per_rank)]


def allreduce_part(args) -> dict:
    from communication.alpha_beta import bus_bandwidth, crossover, fit_alpha_beta, measured_crossover
    from communication.experiments import ALGORITHMS, allreduce_bench_worker
    from course.benchmarking import summarise
    from course.measure import timer_name

    report = {}
    for p in args.world_sizes:
        raw = _one(launch(allreduce_bench_worker, p, args.sizes_bytes, args.repeats, args.warmup, device=args.device,
                          timeout=args.timeout, collective_timeout=300))
        per = {}
        for name in ALGORITHMS:
            points = {size: summarise(raw[name][size]) for size in args.sizes_bytes}
            for size, s in points.items():
                s["busbw"] = bus_bandwidth(size, s["median"], p)
            alpha, beta = fit_alpha_beta(args.sizes_bytes, [points[s]["median"] for s in args.sizes_bytes])
            per[name] = {"points": {str(k): v for k, v in points.items()}, "alpha": alpha, "beta": beta}
        med = {n: [per[n]["points"][str(s)]["median"] for s in args.sizes_bytes] for n in ALGORITHMS}
        report[str(p)] = {"algorithms": per, "inner": {str(k): v for k, v in raw["inner"].items()},
                          "crossover_ring_tree_fit": crossover((per["ring"]["alpha"], per["ring"]["beta"]),
                                                               (per["tree"]["alpha"], per["tree"]["beta"])),
                          "crossover_ring_tree_measured": measured_crossover(args.sizes_bytes, med["ring"], med["tree"])}
        if not reports_results():
            continue
        print(f"\nall-reduce, {p} ranks on {args.device} (float32; median [min-max] of {args.repeats} repeats; "
              f"busbw = 2(p-1)/p N / t; timer {timer_name(args.device)})")
        print(f"{'size':>7} " + " ".join(f"{n + ' us':>28} {'GB/s':>6}" for n in ALGORITHMS))
        for size in args.sizes_bytes:
            cells = []
            for n in ALGORITHMS:
                s = per[n]["points"][str(size)]
                cells.append(f"{s['median'] * 1e6:10.1f} [{s['min'] * 1e6:7.1f}-{s['max'] * 1e6:8.1f}] "
                             f"{s['busbw'] / 1e9:6.3f}")
            print(f"{human(size):>7} " + " ".join(cells))
        for n in ALGORITHMS:
            bw = 1 / per[n]["beta"] / 1e9 if per[n]["beta"] > 0 else float("inf")
            print(f"  fit {n:>16}: alpha = {per[n]['alpha'] * 1e6:8.1f} us, beta = {per[n]['beta'] * 1e9:.4f} ns/B "
                  f"(1/beta = {bw:.2f} GB/s)")
        fit_x, meas_x = report[str(p)]["crossover_ring_tree_fit"], report[str(p)]["crossover_ring_tree_measured"]
        print(f"  ring vs tree crossover: fitted lines {human(fit_x) if fit_x else 'none'}, measured "
              f"{human(meas_x) if meas_x else 'none (the tree is faster at the largest size)'}")
    return report


def dp_part(args) -> dict:
    from communication.experiments import DP_VARIANTS, dp_throughput_worker
    from course.benchmarking import ratios, summarise

    cfg = {"preset": args.preset, "vocab_size": args.vocab_size, "seq": args.seq, "per_rank_batch": args.per_rank_batch,
           "steps": args.dp_steps, "repeats": args.dp_repeats, "warmup": max(1, args.warmup), "bucket_mb": args.bucket_mb,
           "variants": list(DP_VARIANTS), "world_sizes": [args.dp]}
    out = _one(launch(dp_throughput_worker, args.dp, cfg, device=args.device, timeout=args.timeout,
                      collective_timeout=300))
    if not reports_results():
        return {}
    runs = {name: [r["tokens_per_sec"] for r in sorted(out["rows"], key=lambda r: r["repeat"]) if r["variant"] == name]
            for name in DP_VARIANTS}
    per = {name: summarise(v) for name, v in runs.items()}
    ddp = per["ddp"]["median"]
    ratio = {name: ratios(runs[name], runs["ddp"]) for name in runs}  # per repeat (side by side), then the median
    print(f"\ndata-parallel training, {args.dp} ranks on {args.device}, GPT-2 {args.preset}, "
          f"{args.per_rank_batch}x{args.seq} tokens per rank per step, buckets of {args.bucket_mb} MB "
          f"({out['n_buckets']} buckets); tokens/s of all ranks, median [min-max] of {args.dp_repeats} interleaved repeats")
    for name, s in per.items():
        print(f"  {name:>18}: {s['median']:9.0f} [{s['min']:.0f}-{s['max']:.0f}]   / ddp = "
              f"{ratio[name]['median']:.3f} [{ratio[name]['min']:.3f}-{ratio[name]['max']:.3f}]")
    return {"config": cfg, "world_size": args.dp, "tokens_per_sec": per, "ratio_to_ddp": ratio,
            "ratio_of_medians_to_ddp": {n: per[n]["median"] / ddp for n in per}, "n_buckets": out["n_buckets"]}


def main(argv=None) -> int:
    from course.benchmarking import describe, machine, write_report
    from course.measure import timer_name

    args = parse_args(argv)
    info = machine(args.device)  # the load average before the ranks start
    result = {"machine": info, "config": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
              "sizes_bytes": args.sizes_bytes, "repeats": args.repeats, "device": args.device,
              "timer": timer_name(args.device)}
    if reports_results():
        print(describe(info))
    try:
        if not args.skip_allreduce:
            result["allreduce"] = allreduce_part(args)
        if not args.skip_dp:
            result["data_parallel"] = dp_part(args)
    except RankFailure as exc:
        print(f"benchmark failed: {exc}", file=sys.stderr)
        return 1
    if not reports_results():
        return 0
    write_report(args.out, result)
    print(f"\nresults: {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
