"""Communication benchmark: all-reduce latency and bus bandwidth, and data-parallel training tokens/s.

    python project/benchmark.py                               # 2 ranks, 1 KB .. 64 MB, 5 repeats
    python project/benchmark.py --sizes 1KB 1MB 64MB --world_sizes 2 3 --repeats 7 --json out.json
    torchrun --standalone --nproc_per_node=8 project/benchmark.py --device cuda   # 8 GPUs, NCCL

Part 1, for each world size: ``dist.all_reduce`` (the back-end's own: gloo, or NCCL on GPUs),
:func:`communication.ring_all_reduce`
and :func:`communication.tree_all_reduce` (recursive doubling) on float32 tensors of each
size, taking turns in every repeat (interleaved), after a warm-up; the median and min-max
of the slowest rank's time, the bus bandwidth ``2 (p-1)/p N / t``, an alpha-beta line fitted
per algorithm, and the ring-vs-tree crossover size.

Part 2 (``--dp_world_size`` ranks): training tokens/s of GPT-2 (``--preset``, synthetic tokens)
with ``average_gradients``, the bucketed overlapped reducer and torch DDP (same
``--bucket_mb``), interleaved repeats, median and min-max, and the ratio to DDP.

Prints tables and writes everything to ``--json`` (notebooks/04_communication.ipynb reads it), with
the device and the clock it was measured with (``timer``: :mod:`course.measure`; on a GPU every time is
read after the device's queued work has run). Under torchrun the world sizes are torchrun's, and rank 0
prints and writes.
"""
from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
from pathlib import Path

if __name__ == "__main__":  # run as a file: import the packages of the tree this script sits in
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from course.launch import RankFailure, default_world_size, in_torchrun, launch, reports_results  # noqa: E402

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


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--sizes", nargs="+", default=DEFAULT_SIZES, help="message sizes (bytes, or with KB/MB/GB)")
    parser.add_argument("--world_sizes", nargs="+", type=int, default=[default_world_size(2)],
                        help="ranks of the all-reduce benchmark (under torchrun: its WORLD_SIZE)")
    parser.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"],
                        help="auto: one GPU per rank with NCCL when there are enough, else the CPU with gloo")
    parser.add_argument("--repeats", type=int, default=5, help="timed repeats per point (>= 3)")
    parser.add_argument("--warmup", type=int, default=1, help="untimed calls / steps first")
    parser.add_argument("--json", default="workdir/benchmark_communication.json", help="where the results go")
    parser.add_argument("--skip_allreduce", action="store_true", help="skip part 1")
    dp = parser.add_argument_group("data-parallel throughput (part 2)")
    dp.add_argument("--skip_dp", action="store_true", help="skip part 2")
    dp.add_argument("--dp_world_size", type=int, default=default_world_size(2))
    dp.add_argument("--preset", default="tiny", help="GPT-2 preset (course.model.PRESETS)")
    dp.add_argument("--vocab_size", type=int, default=5000)
    dp.add_argument("--seq", type=int, default=64, help="tokens per sequence")
    dp.add_argument("--per_rank_batch", type=int, default=8, help="sequences per rank per step")
    dp.add_argument("--dp_steps", type=int, default=8, help="steps per timed repeat")
    dp.add_argument("--dp_repeats", type=int, default=7, help="timed repeats (interleaved)")
    dp.add_argument("--bucket_mb", type=float, default=1.0, help="bucket size of the bucketed reducer and of DDP (MB)")
    dp.add_argument("--timeout", type=float, default=1800.0, help="wall-clock limit of each launch (seconds)")
    args = parser.parse_args(argv)
    try:
        args.sizes_bytes = sorted({parse_size(s) for s in args.sizes})
    except ValueError as exc:
        parser.error(f"--sizes: {exc}")
    if any(s < 4 for s in args.sizes_bytes):
        parser.error("--sizes: every size must be at least 4 bytes (one float32)")
    if args.repeats < 3 or args.dp_repeats < 3:
        parser.error("--repeats and --dp_repeats must be >= 3 (a median and a spread need three points)")
    if any(w < 2 for w in args.world_sizes) or args.dp_world_size < 2:
        parser.error("--world_sizes and --dp_world_size must be >= 2 (an all-reduce needs two ranks)")
    if args.bucket_mb <= 0:
        parser.error(f"--bucket_mb must be > 0, not {args.bucket_mb}")
    if in_torchrun() and set(args.world_sizes + [args.dp_world_size]) != {default_world_size(0)}:
        parser.error(f"under torchrun every world size is torchrun's WORLD_SIZE={default_world_size(0)}: leave "
                     "--world_sizes and --dp_world_size out, or start torchrun with --nproc_per_node=<that size>")
    from course.launch import resolve_device_backend

    try:
        args.device, _ = resolve_device_backend(args.device, "auto", max(args.world_sizes + [args.dp_world_size]))
    except ValueError as exc:
        parser.error(str(exc))
    from course.model import PRESETS

    if args.preset not in PRESETS:
        parser.error(f"--preset must be one of {sorted(PRESETS)}, not {args.preset!r}")
    if len(args.sizes_bytes) < 2 and not args.skip_allreduce:
        parser.error("--sizes: give at least two sizes (the alpha-beta fit needs two points)")
    return args


def _one(per_rank: dict):
    """The value of one rank (the workers return the slowest rank's times, the same on every rank)."""
    return per_rank[min(per_rank)]


def summarise(times: list[float]) -> dict:
    return {"median": statistics.median(times), "min": min(times), "max": max(times), "all": times}


def allreduce_part(args) -> dict:
    from course.measure import timer_name
    from communication.alpha_beta import bus_bandwidth, crossover, fit_alpha_beta, measured_crossover
    from communication.experiments import ALGORITHMS, allreduce_bench_worker

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
        report[str(p)] = {"algorithms": per,
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
    from communication.experiments import dp_throughput_worker

    cfg = {"preset": args.preset, "vocab_size": args.vocab_size, "seq": args.seq, "per_rank_batch": args.per_rank_batch,
           "steps": args.dp_steps, "repeats": args.dp_repeats, "warmup": max(1, args.warmup), "bucket_mb": args.bucket_mb}
    out = _one(launch(dp_throughput_worker, args.dp_world_size, cfg, device=args.device, timeout=args.timeout,
                      collective_timeout=300))
    per = {name: summarise(v) for name, v in out["tokens_per_sec"].items()}
    ddp = per["ddp"]["median"]
    ratios = {}
    for name in per:  # ratio per repeat (the variants ran side by side in each repeat), then its median
        r = [a / b for a, b in zip(out["tokens_per_sec"][name], out["tokens_per_sec"]["ddp"])]
        ratios[name] = summarise(r)
    if not reports_results():
        return {}
    print(f"\ndata-parallel training, {args.dp_world_size} ranks on {args.device}, GPT-2 {args.preset}, "
          f"{args.per_rank_batch}x{args.seq} tokens per rank per step, buckets of {args.bucket_mb} MB "
          f"({out['n_buckets']} buckets); tokens/s of all ranks, median [min-max] of {args.dp_repeats} interleaved repeats")
    for name, s in per.items():
        print(f"  {name:>18}: {s['median']:9.0f} [{s['min']:.0f}-{s['max']:.0f}]   / ddp = "
              f"{ratios[name]['median']:.3f} [{ratios[name]['min']:.3f}-{ratios[name]['max']:.3f}]")
    return {"config": cfg, "world_size": args.dp_world_size, "tokens_per_sec": per, "ratio_to_ddp": ratios,
            "ratio_of_medians_to_ddp": {n: per[n]["median"] / ddp for n in per}, "n_buckets": out["n_buckets"]}


def main(argv=None) -> int:
    args = parse_args(argv)
    from course.measure import timer_name

    result = {"sizes_bytes": args.sizes_bytes, "repeats": args.repeats, "device": args.device,
              "timer": timer_name(args.device)}
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
    path = Path(args.json)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=1))
    print(f"\nresults: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
