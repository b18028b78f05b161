"""Benchmark (not a test): what hybrid sharding trades — model state held against traffic by group.

    python -m memory.labs.hsdp_benchmark                        # 4 ranks: ZeRO-3 over 4, HSDP 2 x 2, 4 replicas
    python -m memory.labs.hsdp_benchmark --dp 8 --preset small --repeats 5

One launch of ``--dp`` gloo ranks trains GPT-2 (``--preset``, random tokens, Adam, each block a unit)
with :class:`memory.hsdp.HybridShardedModel` at every ``replicas x shard`` layout of the ranks: ``replicas = 1``
is ZeRO-3 over all of them, ``shard = 1`` is data parallelism (each rank holds everything, the gradient is
all-reduced). For each layout it reports, per rank:

* the model state held — parameter slices, their gradients and Adam's two moments, counted from the tensors
  themselves (:func:`memory.accounting.storage_bytes`) — and the module docstring's ``16 Ψ / shard``;
* the bytes each step sends, by group (``dp_shard``: all-gathers and reduce-scatters; ``dp_replicate``:
  all-reduces of gradient slices), as ring traffic (:class:`course.collectives.CommCounter`), beside the
  formulas ``(s-1)/s · 4 (3Ψ - Ψ_root)`` and ``2 (r-1)/r · 4Ψ/s`` (Ψ counts the padded units; the root unit
  — embeddings, final LayerNorm — stays gathered from its forward to its backward, so it is all-gathered
  once, not twice: :mod:`memory.fsdp`);
* the step time: median and min-max over ``--repeats`` repeats, the layouts taking turns in each.

On one machine every group shares the same loopback, so the time does not show the point of HSDP: on a
cluster the shard group is one node (NVLink) and only the ``dp_replicate`` bytes cross nodes. The bytes by
group are what carries over to a cluster.
"""
from __future__ import annotations

import json
import sys

from course import benchmarking


def layouts(world_size: int) -> list[tuple[int, int]]:
    """Every ``(replicas, shard)`` with ``replicas * shard == world_size``, ZeRO-3 (one replica) first."""
    return [(r, world_size // r) for r in range(1, world_size + 1) if world_size % r == 0]


def hsdp_benchmark_worker(rank: int, world_size: int, cfg: dict) -> list[dict]:
    """Per repeat and layout: the slowest rank's step time (:func:`course.benchmarking.timed`), this rank's
    model-state bytes and ring traffic by group."""
    import torch
    import torch.distributed as dist

    from course.collectives import CommCounter
    from course.launch import context
    from course.mesh import Mesh
    from course.model import build_gpt2
    from course.saved_tensors import storage_bytes
    from memory.accounting import optimizer_state_tensors
    from memory.hsdp import HybridShardedModel
    from memory.training import model_blocks

    device, world = context().device, dist.group.WORLD
    mesh = Mesh.build(dp=world_size)
    g = torch.Generator().manual_seed(rank)
    ids = torch.randint(0, cfg["vocab_size"], (cfg["per_rank_batch"], cfg["seq_len"]), generator=g).to(device)
    runs = {}
    for replicas, shard in layouts(world_size):  # every rank builds every layout's groups, in the same order
        model = build_gpt2(cfg["preset"], cfg["vocab_size"], n_positions=cfg["seq_len"], dropout=0.0,
                           seed=0).to(device)
        shard_group, replicate_group = mesh.hybrid_shard_groups(replicas)
        hsdp = HybridShardedModel(model, model_blocks(model), shard_group=shard_group, replicate_group=replicate_group)
        runs[(replicas, shard)] = (model, hsdp, torch.optim.Adam(hsdp.shard_parameters(), lr=1e-4))
    report = []
    for repeat in range(cfg["repeats"] + 1):  # repeat 0: warm-up (first calls, Adam's state), not reported
        for (replicas, shard), (model, hsdp, optimizer) in runs.items():
            counter = CommCounter()

            def step(model=model, hsdp=hsdp, optimizer=optimizer, counter=counter):
                with counter:
                    optimizer.zero_grad()
                    model(input_ids=ids, labels=ids).loss.backward()
                    hsdp.finish_backward()
                    optimizer.step()

            seconds = benchmarking.timed(step, device, world)  # the slowest rank's, from a barrier
            if repeat:
                shards = [u.shard for u in hsdp.units]
                report.append({
                    "replicas": replicas, "shard": shard, "repeat": repeat, "seconds": seconds,
                    "n_params": sum(u.padded for u in hsdp.units), "n_root": hsdp.root.padded,
                    "state_bytes": {"parameters": storage_bytes(shards),
                                    "gradients": storage_bytes([s.grad for s in shards if s.grad is not None]),
                                    "optimizer": storage_bytes(optimizer_state_tensors(optimizer))},
                    "traffic_bytes": {group: sum(v["traffic_bytes"] for v in kinds.values())
                                      for group, kinds in counter.by_group().items()}})
    return report


def summarise(outputs: dict[int, list[dict]]) -> list[dict]:
    """One row per layout: rank 0's bytes (every rank holds and sends the same), the slowest rank's step time
    (median, min, max over the repeats), and the formulas' bytes."""
    rows = []
    for replicas, shard in sorted({(r["replicas"], r["shard"]) for r in outputs[0]}, key=lambda k: k[0]):
        mine = [r for r in outputs[0] if (r["replicas"], r["shard"]) == (replicas, shard)]
        seconds = [max(r["seconds"] for rank_rows in outputs.values() for r in rank_rows
                       if (r["replicas"], r["shard"], r["repeat"]) == (replicas, shard, repeat))
                   for repeat in sorted({r["repeat"] for r in mine})]
        n, n_root, summary = mine[0]["n_params"], mine[0]["n_root"], benchmarking.summarise(seconds)
        rows.append({"replicas": replicas, "shard": shard, "state_bytes": mine[0]["state_bytes"],
                     "state_formula_bytes": 16 * n / shard, "traffic_bytes": mine[0]["traffic_bytes"],
                     "traffic_formula_bytes": {"dp_shard": (shard - 1) / shard * 4 * (3 * n - n_root),
                                               "dp_replicate": 2 * (replicas - 1) / replicas * 4 * n / shard},
                     "step_seconds": {k: summary[k] for k in ("median", "min", "max")}})
    return rows


def format_table(rows: list[dict]) -> str:
    mb = 1024 ** 2
    lines = [f"{'layout':>14} {'state MB':>9} {'(formula)':>9} {'dp_shard MB':>12} {'(formula)':>9} "
             f"{'dp_replicate MB':>16} {'(formula)':>9} {'step s median':>14} {'min-max':>12}"]
    for r in rows:
        t, f, s = r["traffic_bytes"], r["traffic_formula_bytes"], r["step_seconds"]
        lines.append(f"{r['replicas']:>3} x {r['shard']:<2} {'':>5} {sum(r['state_bytes'].values()) / mb:9.2f} "
                     f"{r['state_formula_bytes'] / mb:9.2f} {t.get('dp_shard', 0) / mb:12.2f} "
                     f"{f['dp_shard'] / mb:9.2f} {t.get('dp_replicate', 0) / mb:16.2f} {f['dp_replicate'] / mb:9.2f} "
                     f"{s['median']:14.3f} {s['min']:5.3f}-{s['max']:<6.3f}")
    return "\n".join(lines)


def parse_args(argv=None):
    parser = benchmarking.parser(__doc__.split("\n\n")[0], out="workdir/hsdp_benchmark.json", device=None, repeats=5,
                                 warmup=None, timeout=1800.0)
    benchmarking.option(parser, "dp", default=4, note="gloo ranks, laid out as replicas x shard")
    benchmarking.gpt2_step_options(parser, per_rank_batch=4)
    args = parser.parse_args(argv)
    from course.output_paths import require_writable_output

    require_writable_output(parser, args.out, "--out")  # before anything is measured
    if args.repeats < benchmarking.MIN_REPEATS:
        parser.error(f"--repeats {args.repeats}: a median and a spread need at least {benchmarking.MIN_REPEATS}; try "
                     f"--repeats {benchmarking.MIN_REPEATS}")
    if args.dp < 2:
        parser.error(f"--dp {args.dp}: hybrid sharding needs at least 2 ranks; try --dp 4")
    return args


def main(argv=None) -> int:
    from course.launch import launch

    args = parse_args(argv)
    cfg = {k: getattr(args, k) for k in ("preset", "vocab_size", "seq_len", "per_rank_batch", "repeats")}
    outputs = launch(hsdp_benchmark_worker, args.dp, cfg, device="cpu", backend="gloo",
                     timeout=args.timeout)
    rows = summarise(outputs)
    print(f"{args.dp} gloo ranks, GPT-2 {args.preset}; per rank and step (ring traffic), slowest rank's "
          f"step over {args.repeats} repeats")
    print(format_table(rows))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"config": {**cfg, "dp": args.dp}, "rows": rows}, indent=1))
    print(f"written: {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
