"""Communication benchmark: all-reduce latency and bus bandwidth, and data-parallel training tokens/s.

    python project/tools/benchmark.py                               # 2 ranks, 1 KiB .. 64 MiB, 5 repeats
    python project/tools/benchmark.py --sizes 1KiB 1MiB 64MiB --world_sizes 2 3 --repeats 7 --out out.json
    torchrun --standalone --nproc_per_node=8 project/tools/benchmark.py --device cuda   # 8 GPUs, NCCL

Part 1, for each world size: ``dist.all_reduce`` (the back-end's own: gloo, or NCCL on GPUs),
:func:`communication.ring_all_reduce`
and :func:`communication.tree_all_reduce` (recursive doubling) on float32 tensors of each
size, taking turns in every repeat (interleaved), after a warm-up; the median and min-max
of the slowest rank's time, the bus bandwidth ``2 (p-1)/p N / t``, a computed verdict per size
(ring vs tree, dist.all_reduce vs ring), the alpha-beta model fitted per algorithm with its quality
(alpha per step, one definition: the line's intercept over the algorithm's steps; gloo's own algorithm
gets the line of a whole call), the model's and the measured ring-vs-tree crossover and whether they
agree. A world size with more ranks than cores is also replayed from the largest one measured without
(:func:`communication.cost_model.replay_allreduce`), labelled as replayed.

Part 2 (``--dp`` ranks): training tokens/s of GPT-2 (``--preset``, synthetic tokens)
with ``average_gradients``, the bucketed overlapped reducer and torch DDP (same
``--bucket_mb``), interleaved repeats, median and min-max, the ratio to DDP and computed verdicts
(:func:`communication.labs.experiments.dp_throughput_worker`).

The measuring — warm-up, interleaved repeats, median and min-max, the machine it ran on (per part: its
busy ranks, the load before and after, the conditions), verdicts, fit quality, the JSON,
the shared options — is the course's one benchmark harness (:mod:`course.benchmarking`). Prints tables
and writes everything to ``--out`` (notebooks/04_communication.ipynb reads it), with the device and the
clock it was measured with (``timer``: :mod:`course.measure`; on a GPU every time is read after the
device's queued work has run). Under torchrun the world sizes are torchrun's, and rank 0 prints and
writes.
"""
from __future__ import annotations

import re
import sys
from pathlib import Path

if __name__ == "__main__":  # run as a file: import the packages of the tree this script sits in
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from course.launch import RankFailure, default_world_size, launch, reports_results  # noqa: E402

DEFAULT_SIZES = ["1KiB", "4KiB", "16KiB", "64KiB", "256KiB", "1MiB", "4MiB", "16MiB", "64MiB"]
UNITS = {"": 1, "B": 1, "KB": 1024, "MB": 1024**2, "GB": 1024**3, "KIB": 1024, "MIB": 1024**2, "GIB": 1024**3}


def parse_size(text: str) -> int:
    """``"64MiB"`` -> 67108864 (KiB, MiB, GiB — and KB, MB, GB, read the same — are powers of 1024; plain
    numbers are bytes)."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*((?:[KMG]I?)?B?)\s*", text.upper())
    if not m or m.group(2).endswith("I"):
        raise ValueError(f"cannot read the size {text!r}: write e.g. 1024, 1KiB, 4MiB")
    return int(float(m.group(1)) * UNITS[m.group(2)])


def make_parser():
    """The command line (:func:`course.benchmarking.parser` and this benchmark's own options)."""
    from course import benchmarking

    parser = benchmarking.parser(__doc__.split("\n\n")[0], out="workdir/benchmark_communication.json", repeats=5,
                                 timeout=1800.0, steps=8)
    parser.add_argument("--sizes", nargs="+", default=DEFAULT_SIZES, help="message sizes (bytes, or with KiB/MiB/GiB)")
    parser.add_argument("--world_sizes", nargs="+", type=int, default=[default_world_size(2)],
                        help="ranks of the all-reduce benchmark (under torchrun: its WORLD_SIZE)")
    parser.add_argument("--skip_allreduce", action="store_true", help="skip part 1")
    dp = parser.add_argument_group("data-parallel throughput (part 2)")
    dp.add_argument("--skip_dp", action="store_true", help="skip part 2")
    benchmarking.option(dp, "dp", default=default_world_size(2))
    benchmarking.gpt2_step_options(dp)
    dp.add_argument("--dp_repeats", type=int, default=7, help="timed repeats of part 2 (interleaved)")
    benchmarking.option(dp, "bucket_mb", default=1.0, note="part 2: the bucketed reducer's and DDP's, in MiB")
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
    from communication.alpha_beta import bus_bandwidth, fit_line, readable_bytes
    from communication.cost_model import BENCHMARK_NAMES, fit_allreduce_model, fit_benchmark, replay_allreduce
    from communication.labs.experiments import ALGORITHMS, allreduce_bench_worker
    from course.benchmarking import compare, describe, finish, machine, summarise
    from course.measure import timer_name

    report = {}
    for p in args.world_sizes:
        info = machine(args.device, busy_ranks=p)  # the load of other processes, before the ranks start
        raw = _one(launch(allreduce_bench_worker, p, args.sizes_bytes, args.repeats, args.warmup, device=args.device,
                          timeout=args.timeout, collective_timeout=300))
        finish(info)
        per = {}
        for name in ALGORITHMS:
            points = {size: summarise(raw[name][size]) for size in args.sizes_bytes}
            for size, s in points.items():
                s["busbw"] = bus_bandwidth(size, s["median"], p)
            medians = [points[s]["median"] for s in args.sizes_bytes]
            model = {v: k for k, v in BENCHMARK_NAMES.items()}.get(name)
            # alpha is always per step (the line's intercept divided by the algorithm's steps); gloo's own
            # algorithm is not modelled, so dist.all_reduce gets the line of a whole call, labelled as such
            if model:
                fit = fit_allreduce_model(model, p, args.sizes_bytes, medians)
            else:
                fit = fit_line(args.sizes_bytes, medians)
            per[name] = {"points": {str(k): v for k, v in points.items()}, "fit": fit}
        entry = {"machine": info, "algorithms": per, "inner": {str(k): v for k, v in raw["inner"].items()}}
        analysis = fit_benchmark(entry, p)
        entry["crossover"] = {k: analysis[k] for k in ("crossover_model", "crossover_measured", "crossover_agreement")}
        entry["prediction_quality"] = analysis["prediction_quality"]
        pairs = (("ring", "tree"), ("dist.all_reduce", "ring"))
        entry["verdicts"] = {str(size): {f"{a} vs {b}": compare(raw[a][size], raw[b][size], (a, b), conditions=info)
                                         for a, b in pairs}
                             for size in args.sizes_bytes}
        report[str(p)] = entry
        if not reports_results():
            continue
        print(f"\nall-reduce, {p} ranks on {args.device} (float32; median [min-max] of {args.repeats} repeats; "
              f"busbw = 2(p-1)/p N / t; timer {timer_name(args.device)})")
        print(f"  machine: {describe(info)}")
        if info["conditions"] == "oversubscribed":
            print(f"  {p} busy ranks on {info['usable_cores']} cores: the ranks take turns on the cores, so these "
                  f"times hold the scheduler's delays, not the link's; see the replay below")
        print(f"{'size':>7} " + " ".join(f"{n + ' us':>28} {'GB/s':>6}" for n in ALGORITHMS))
        for size in args.sizes_bytes:
            cells = []
            for n in ALGORITHMS:
                s = per[n]["points"][str(size)]
                cells.append(f"{s['median'] * 1e6:10.1f} [{s['min'] * 1e6:7.1f}-{s['max'] * 1e6:8.1f}] "
                             f"{s['busbw'] / 1e9:6.3f}")
            print(f"{readable_bytes(size):>7} " + " ".join(cells))
        print("  verdicts (course.benchmarking.compare of the side-by-side repeats):")
        for size in args.sizes_bytes:
            v = entry["verdicts"][str(size)]
            print(f"  {readable_bytes(size):>7}: {v['ring vs tree']['sentence']}")
            print(f"  {'':>7}  {v['dist.all_reduce vs ring']['sentence']}")
        for n in ALGORITHMS:
            print(f"  fit {n:>16}: {_fit_line(per[n]['fit'])}")
        for k in ("crossover_model", "crossover_measured", "crossover_agreement"):
            print(f"  {analysis[k]['sentence']}")
    _replays(args, report, replay_allreduce, fit_benchmark)
    return report


def _fit_line(fit: dict) -> str:
    """One printed line of a fit: alpha per step with its arithmetic (or a whole call's intercept), 1/beta, quality."""
    if "alpha" in fit:
        bw = f"{fit['bandwidth'] / 1e9:.3g} GB/s" if fit["bandwidth"] else "none (beta is 0)"
        return (f"{fit['alpha_arithmetic']}, beta = {fit['beta'] * 1e9:.4g} ns/B, 1/beta = {bw}; "
                f"{fit['quality']['reason']}")
    return (f"intercept {fit['intercept'] * 1e6:.1f} us per call (gloo's algorithm: steps not modelled, so no "
            f"alpha per step), slope {fit['slope'] * 1e9:.4g} ns/B; {fit['quality']['reason']}")


def _replays(args, report: dict, replay_allreduce, fit_benchmark) -> None:
    """A world size measured with more busy ranks than cores is also replayed from the largest world size
    measured without (:func:`communication.cost_model.replay_allreduce`), when that one's fit held."""
    from communication.alpha_beta import readable_bytes

    sources = [int(p) for p, e in report.items() if e["machine"]["conditions"] != "oversubscribed"]
    for p, entry in report.items():
        if entry["machine"]["conditions"] != "oversubscribed":
            continue
        if not sources:
            entry["replay"] = None
            if reports_results():
                print(f"\np = {p}: no world size was measured without oversubscription to replay it from")
            continue
        source = max(sources)
        fit = fit_benchmark(report[str(source)], source)["fit"]
        replay = replay_allreduce(fit, int(p), args.sizes_bytes, source)
        entry["replay"] = {k: v for k, v in replay.items() if k != "fit"}
        if not reports_results():
            continue
        print(f"\n{replay['sentence']}")
        for i, size in enumerate(replay["sizes"]):
            if replay["algorithms"]:
                print(f"  {readable_bytes(size):>7}: ring {replay['algorithms']['ring']['median'][i] * 1e6:10.1f} us, "
                      f"recursive doubling {replay['algorithms']['recursive_doubling']['median'][i] * 1e6:10.1f} us "
                      f"(replayed)")
        print(f"  {replay['crossover_model']['sentence']}")


def dp_part(args) -> dict:
    from communication.labs.experiments import DP_VARIANTS, dp_throughput_worker
    from course.benchmarking import compare, describe, finish, machine, ratios, summarise

    cfg = {"preset": args.preset, "vocab_size": args.vocab_size, "seq_len": args.seq_len,
           "per_rank_batch": args.per_rank_batch, "steps": args.steps, "repeats": args.dp_repeats,
           "warmup": max(1, args.warmup), "bucket_mb": args.bucket_mb,
           "variants": list(DP_VARIANTS), "world_sizes": [args.dp]}
    info = machine(args.device, busy_ranks=args.dp)
    out = _one(launch(dp_throughput_worker, args.dp, cfg, device=args.device, timeout=args.timeout,
                      collective_timeout=300))
    finish(info)
    if not reports_results():
        return {}
    runs = {name: [r["tokens_per_sec"] for r in sorted(out["rows"], key=lambda r: r["repeat"]) if r["variant"] == name]
            for name in DP_VARIANTS}
    per = {name: summarise(v) for name, v in runs.items()}
    ddp = per["ddp"]["median"]
    ratio = {name: ratios(runs[name], runs["ddp"]) for name in runs}  # per repeat (side by side), then the median
    verdicts = {f"{a} vs {b}": compare(runs[a], runs[b], (a, b), lower_is_better=False, unit="tokens/s",
                                       conditions=info)
                for a, b in (("bucketed", "ddp"), ("average_gradients", "ddp"), ("bucketed", "average_gradients"))}
    print(f"\ndata-parallel training, {args.dp} ranks on {args.device}, GPT-2 {args.preset}, "
          f"{args.per_rank_batch}x{args.seq_len} tokens per rank per step, buckets of {args.bucket_mb} MiB "
          f"({out['n_buckets']} buckets); tokens/s of all ranks, median [min-max] of {args.dp_repeats} interleaved repeats")
    print(f"  machine: {describe(info)}")
    for name, s in per.items():
        print(f"  {name:>18}: {s['median']:9.0f} [{s['min']:.0f}-{s['max']:.0f}]   / ddp = "
              f"{ratio[name]['median']:.3f} [{ratio[name]['min']:.3f}-{ratio[name]['max']:.3f}]")
    print("  verdicts (tokens/s, higher is better; course.benchmarking.compare):")
    for v in verdicts.values():
        print(f"    {v['sentence']}")
    return {"config": cfg, "world_size": args.dp, "machine": info, "tokens_per_sec": per, "ratio_to_ddp": ratio,
            "ratio_of_medians_to_ddp": {n: per[n]["median"] / ddp for n in per}, "verdicts": verdicts,
            "n_buckets": out["n_buckets"]}


def main(argv=None) -> int:
    from course.benchmarking import describe, finish, machine, write_report
    from course.measure import timer_name

    args = parse_args(argv)
    busy = max(([] if args.skip_allreduce else args.world_sizes) + ([] if args.skip_dp else [args.dp]) + [1])
    info = machine(args.device, busy_ranks=busy)  # the load average before the ranks start; each part has its own
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
    finish(info)
    if not reports_results():
        return 0
    print(f"\nthe whole benchmark: {describe(info)}")
    write_report(args.out, result)
    print(f"\nresults: {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
