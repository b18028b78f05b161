"""Benchmark (not a test): training time with no checkpoints, synchronous ones, and asynchronous ones.

    python -m data_parallel.labs.async_checkpoint_benchmark                 # 2 ranks, tiny GPT-2, 3 repeats
    python -m data_parallel.labs.async_checkpoint_benchmark --preset small --steps 12 --checkpoint_every 3 --repeats 5
    torchrun --standalone --nproc_per_node=4 -m data_parallel.labs.async_checkpoint_benchmark --preset gpt2

One launch of ``--dp`` data-parallel ranks trains GPT-2 (``--preset``, random tokens, AdamW,
:func:`data_parallel.average_gradients`) for ``--steps`` steps three ways, taking turns in every repeat so a
change in the machine's load touches all three alike:

* ``none``: no checkpoint;
* ``sync``: a checkpoint of model and optimizer every ``--checkpoint_every`` steps with
  :func:`course.checkpoint.save_checkpoint` (``torch.distributed.checkpoint.save``: training waits for the
  files);
* ``async``: the same checkpoints with :func:`course.checkpoint.save_checkpoint_async`
  (``torch.distributed.checkpoint.async_save``: the state is staged in host memory and written by a
  background thread while the next steps run; one save in flight, the last one waited for before the clock
  stops — what ``--async_checkpoint`` does).

The time of a run is the slowest rank's, from the first step to the last checkpoint committed. The report
gives each way's median and min-max over ``--repeats`` repeats (after one untimed warm-up run of each) and the
ratio of its median to ``none``'s. On a CPU the background writer shares the cores with training, and on a
busy machine the spread is wide: read the ratios with their ranges.
"""
from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

from course import benchmarking
from course.launch import default_world_size, launch_all, reports_results

WAYS = ("none", "sync", "async")


def checkpoint_worker(rank: int, world_size: int, cfg: dict) -> list[dict]:
    """Per repeat and way, the slowest rank's seconds from the first step to the last checkpoint committed
    (:func:`course.benchmarking.timed`)."""
    import torch
    import torch.distributed as dist
    from torch.distributed.checkpoint.state_dict import get_state_dict

    from course.checkpoint import checkpoint_group, save_checkpoint, save_checkpoint_async
    from course.launch import context
    from course.measure import timer_name
    from course.model import build_gpt2
    from data_parallel import average_gradients

    device, world = context().device, dist.group.WORLD
    model = build_gpt2(cfg["preset"], cfg["vocab_size"], n_positions=cfg["seq_len"], dropout=0.0,
                       seed=0).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    save_group = checkpoint_group(world)
    g = torch.Generator().manual_seed(rank)
    ids = torch.randint(0, cfg["vocab_size"], (cfg["per_rank_batch"], cfg["seq_len"]), generator=g).to(device)
    times = []
    for repeat in range(cfg["repeats"] + 1):  # repeat 0: warm-up, not reported
        for way in WAYS:
            root = Path(cfg["root"]) / f"{way}{repeat}"

            def run(way=way, root=root):
                pending = None
                for step in range(1, cfg["steps"] + 1):
                    optimizer.zero_grad()
                    model(input_ids=ids, labels=ids).loss.backward()
                    average_gradients(model, world)
                    optimizer.step()
                    if way != "none" and step % cfg["checkpoint_every"] == 0:
                        model_state, optim_state = get_state_dict(model, optimizer)
                        state = {"model": model_state, "optim": optim_state}
                        if way == "sync":
                            save_checkpoint(root, step, state, rank=rank, group=world)
                        else:
                            if pending is not None:
                                pending.wait()  # one save in flight, as the epoch runner does
                            pending = save_checkpoint_async(root, step, state, rank=rank, group=world,
                                                            save_group=save_group)
                if pending is not None:
                    pending.wait()

            seconds = benchmarking.timed(run, device, world)  # the slowest rank's, from a barrier
            if repeat:
                times.append({"way": way, "repeat": repeat, "seconds": seconds, "timer": timer_name(device)})
    return times


def summarise(outputs: dict[int, list[dict]]) -> dict[str, dict]:
    """``{way: {"median", "min", "max", "ratio_to_none", "seconds"}}`` of the slowest rank's times."""
    runs = {}
    for rows in outputs.values():
        for row in rows:
            key = (row["way"], row["repeat"])
            runs[key] = max(runs.get(key, 0.0), row["seconds"])
    table = {}
    for way in WAYS:
        seconds = [s for (w, _), s in sorted(runs.items()) if w == way]
        summary = benchmarking.summarise(seconds)
        table[way] = {"median": summary["median"], "min": summary["min"], "max": summary["max"], "seconds": seconds}
    for way in WAYS:
        table[way]["ratio_to_none"] = table[way]["median"] / table["none"]["median"]
    return table


def parse_args(argv=None):
    parser = benchmarking.parser(__doc__.split("\n\n")[0], out="workdir/benchmark_async_checkpoint.json", repeats=3,
                                 warmup=None, timeout=1800.0, steps=8)
    benchmarking.option(parser, "dp", default=default_world_size(2))
    benchmarking.gpt2_step_options(parser)
    benchmarking.option(parser, "checkpoint_every", default=2)
    parser.add_argument("--root", type=Path, default=Path("workdir/async_checkpoint_benchmark"),
                        help="where the checkpoints go while it runs (a new folder, removed at the end)")
    args = parser.parse_args(argv)
    from course.output_paths import require_writable_output

    require_writable_output(parser, args.out, "--out")  # before anything is measured
    if not 1 <= args.checkpoint_every <= args.steps:
        parser.error(f"--checkpoint_every {args.checkpoint_every} must be between 1 and --steps {args.steps}, or no "
                     "checkpoint is written")
    if args.root.exists() and any(args.root.iterdir()):
        parser.error(f"--root {args.root} already holds files; the benchmark writes and then removes its checkpoints "
                     "there: name a new folder")
    return benchmarking.check(parser, args, args.dp)


def main(argv=None) -> int:
    args = parse_args(argv)
    cfg = {k: getattr(args, k) for k in ("preset", "vocab_size", "seq_len", "per_rank_batch", "steps", "checkpoint_every",
                                         "repeats")}
    outputs = launch_all(checkpoint_worker, args.dp, {**cfg, "root": str(args.root)}, device=args.device,
                         timeout=args.timeout)  # every rank has finished writing when it returns
    if not reports_results():
        return 0
    shutil.rmtree(args.root)
    table = summarise(outputs)
    print(f"{args.dp} ranks, GPT-2 {args.preset}, {args.steps} steps, a checkpoint every {args.checkpoint_every}; "
          f"slowest rank's seconds over {args.repeats} repeats")
    print(f"{'way':>6} {'median s':>9} {'min-max s':>14} {'/ none':>7}")
    for way, row in table.items():
        print(f"{way:>6} {row['median']:9.2f} {row['min']:6.2f}-{row['max']:<6.2f} {row['ratio_to_none']:7.2f}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"config": {**cfg, "dp": args.dp, "device": args.device,
                                               "timer": outputs[0][0]["timer"]}, "ways": table}, indent=1))
    print(f"written: {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
