"""The planner's measurements on this machine's CPU (``python -m project.planner --hardware cpu``, ``--measure``).

* :func:`cpu_hardware` — the CPU as a :class:`course.hardware.Hardware`: the matrix-product FLOP/s one
  rank reaches while every rank of the run computes at once (the ranks share the cores; timed to the slowest rank,
  and refused above the machine's measured peak, :func:`course.benchmarking.check_rate`), and, per group
  size p, an alpha-beta line fitted to gloo all-reduce times (:func:`communication.alpha_beta.fit_alpha_beta`)
  measured with every group of p consecutive ranks all-reducing at once;
* :func:`measure_run` — the planned configuration, run: every rank's bytes of parameters, gradients and
  optimizer state held after the optimizer step (counted by storage, :func:`memory.accounting.storage_bytes`),
  its peak activation bytes (saved for the backward pass), the bytes of every collective per group
  (:class:`course.collectives.CommCounter`), and the step time (median over ``--steps`` timed steps after
  a warm-up; the slowest rank's time of each step; :class:`course.measure.Stopwatch`). 3D meshes run the 3D
  step (:func:`three_d.step.three_d_step`, fp32, no clipping); a mesh of dp only runs the memory part's
  step (:class:`memory.training.ShardedStep`: ZeRO, checkpointing, precision);
* :func:`compare` — prediction beside measurement, with the error of every term: memory per category,
  communication bytes per group, and time — compute (the step less the time inside communication calls),
  the time inside each group's calls, and on a pipeline the wait inside send/recv (bubble, transfers and
  slower stages: what the prediction's step leaves after this stage's compute and other communication).

Timings come from a shared 2-core machine: the results file says so (``machine``).
"""
from __future__ import annotations

import json
import os
import statistics
from dataclasses import dataclass
from pathlib import Path

SIZES = [1 << 10, 1 << 12, 1 << 14, 1 << 16, 1 << 18, 1 << 20, 1 << 22]  # all-reduce sizes fitted (bytes)
MAX_CPU_RANKS = 8


@dataclass(frozen=True)
class BlockShape:
    """The course GPT-2 block the CPU's figures are measured on: a micro-batch of ``batch`` sequences of ``seq``
    tokens, ``hidden`` wide, ``heads`` heads, an MLP ``inner`` wide, built from preset ``preset``."""

    batch: int
    seq: int
    hidden: int
    heads: int
    inner: int
    preset: str
    dropout: float

    @classmethod
    def of(cls, config) -> "BlockShape":
        """The block of ``config``'s model and micro-batch."""
        from project.planner.layout import sizes

        z = sizes(config)
        return cls(z.b, z.s, z.h, z.a, z.f, config.preset, config.dropout)


def measurable(config) -> str:
    """Why ``--measure`` cannot run ``config`` here ("" when it can)."""
    if config.devices > MAX_CPU_RANKS:
        return f"{config.devices} ranks on this machine's {os.cpu_count()} cores; measure at most {MAX_CPU_RANKS}"
    if config.cp > 1 or config.ep > 1 or config.num_experts > 1:
        return "no run here combines context or expert parallelism with the others: measure with --cp 1 --ep 1"
    if config.pp == 1 and config.tp == 1:
        return "" if config.micro_batches == 1 else "a mesh of dp only takes --micro_batches 1"
    three_d = [("--zero", config.zero), ("--activation_checkpointing", config.activation_checkpointing),
               ("--sequence_parallel", config.sequence_parallel), ("--precision bf16", config.precision != "fp32"),
               ("--schedule interleaved", config.schedule == "interleaved")]
    used = [name for name, on in three_d if on]
    if used:
        return f"the 3D step (pp or tp > 1) runs fp32, 1F1B/GPipe/ZB-H1, without {', '.join(used)}: drop them"
    return ""


# ---- the CPU's figures ------------------------------------------------------------------------------

def _rate(work, flops: float, repeats: int, world) -> float:
    """Median FLOP/s per rank of ``work()`` (``flops`` each) over ``repeats`` timings, every rank at once: each timing
    a loop of about 2 GFLOP per rank — far longer than the scheduler's time slice, so that ranks sharing the cores
    do run together — from a barrier to the end of the slowest rank (:func:`course.benchmarking.timed`). A rank
    timing its own short loop would time the slices in which it ran alone while the others waited: a rate the ranks
    cannot reach at once (notebook 06 once showed 8 x 81.7 GFLOP/s on 2 cores)."""
    from course.benchmarking import timed

    calls = max(1, int(2e9 // flops))
    rates = []
    for i in range(repeats + 1):
        seconds = timed(lambda: [work() for _ in range(calls)], group=world)
        if i:  # the first is the warm-up
            rates.append(flops * calls / seconds)
    return statistics.median(rates)


def device_worker(rank: int, world_size: int, block: BlockShape, group_sizes: list[int], repeats: int) -> dict:
    """This rank's FLOP/s while every rank computes at once — of one matrix product ``(b s, h) x (h, inner)``
    (``flops``) and of one course GPT-2 block's forward and backward pass on a micro-batch (``block_flops``:
    the block's model FLOPs, :func:`course.model.model_flops_per_token` per layer, over its time: what the
    layer norms, softmax, GeLU and Python add to the products) — and, for each group size p, the all-reduce
    time per size of :data:`SIZES` in groups of p consecutive ranks (every group at once; the slowest rank's
    median over ``repeats``)."""
    import torch
    import torch.distributed as dist

    from course.benchmarking import interleaved, summarise
    from course.model import build_gpt2
    from tensor_parallel.gpt2 import TensorParallelGPT2

    world = dist.group.WORLD
    b, s, h, inner = block.batch, block.seq, block.hidden, block.inner
    x, w = torch.randn(b * s, h, device="cpu"), torch.randn(h, inner, device="cpu")
    flops = _rate(lambda: x @ w, 2.0 * b * s * h * inner, repeats, world)
    alone = [dist.new_group([r]) for r in range(world_size)][rank]  # collective: every rank makes every group
    layer = TensorParallelGPT2(build_gpt2(block.preset, 256, n_positions=s, dropout=block.dropout, seed=0,
                                          n_layer=1), group=alone).h[0]
    hidden = torch.randn(b, s, h, device="cpu", requires_grad=True)
    bias = torch.zeros(1, 1, s, s, device="cpu").masked_fill(torch.ones(s, s, dtype=torch.bool).triu(1), -1e9)

    def forward_backward():
        layer(hidden, bias).sum().backward()

    block_flops = _rate(forward_backward, (6.0 * (4 * h * h + 2 * h * inner) + 12.0 * h * s) * b * s, repeats, world)
    groups = {}
    for p in group_sizes:  # collective: every rank makes every group, in the same order
        for first in range(0, world_size, p):
            g = dist.new_group(list(range(first, first + p)))
            if first <= rank < first + p:
                groups[p] = g
    lines = {}
    for p, group in groups.items():
        times = {}
        for size in SIZES:
            t = torch.ones(size // 4)
            calls = max(1, min(32, (1 << 20) // size))
            # every group at once: barrier and slowest rank over the world (course.benchmarking.interleaved)
            found = interleaved({"all_reduce": lambda t=t, group=group: dist.all_reduce(t, group=group)}, repeats,
                                group=world, inner=calls)["all_reduce"]
            times[size] = summarise(found)["median"]
        lines[p] = times
    return {"flops": flops, "block_flops": block_flops, "all_reduce_seconds": lines}


def measure_cpu(world_size: int, block: BlockShape, group_sizes: list[int], repeats: int = 5) -> dict:
    """This machine's figures for ``world_size`` ranks: ``{"world_size", "flops", "block_flops" (FLOP/s: the
    median over ranks of each rank's median), "all_reduce_fits": {p: (alpha, beta)}, "all_reduce_seconds":
    {p: {size: seconds}}, "cores", "block"}`` (see :func:`device_worker`)."""
    from dataclasses import asdict

    from communication.alpha_beta import fit_alpha_beta
    from course.launch import launch

    from course.benchmarking import check_rate, machine_peak_flops

    out = launch(device_worker, world_size, block, sorted(set(group_sizes)), repeats, device="cpu", timeout=900)
    flops = statistics.median(r["flops"] for r in out.values())
    check_rate(flops, machine_peak_flops(), "the planner's matrix-product rate per rank", ranks=world_size)
    lines = out[0]["all_reduce_seconds"]
    fits = {str(p): fit_alpha_beta(list(times), list(times.values())) for p, times in lines.items()}
    return {"world_size": world_size, "flops": flops,
            "block_flops": statistics.median(r["block_flops"] for r in out.values()),
            "all_reduce_fits": fits, "all_reduce_seconds": {str(p): {str(s): t for s, t in times.items()}
                                                              for p, times in lines.items()},
            "cores": os.cpu_count(), "block": asdict(block)}


def cpu_hardware(config, group_sizes: list[int]):
    """The CPU as a :class:`course.hardware.Hardware` for ``config``'s world size: measured now (the block of
    ``config``'s model and micro-batch, :class:`BlockShape`; all-reduces in groups of each of ``group_sizes``), or
    read from ``config.cpu_figures`` (the file keeps one entry per world size and block; a missing one is measured
    and added)."""
    from course.hardware import Hardware, Link

    block = BlockShape.of(config)
    path = Path(config.cpu_figures) if config.cpu_figures else None
    stored = json.loads(path.read_text()) if path and path.exists() else {}
    key = f"{config.devices} ranks, {block}"
    if key not in stored:
        stored[key] = measure_cpu(config.devices, block, [p for p in group_sizes if config.devices % p == 0])
        if path:
            from course.results import write_json

            write_json(path, stored)
    figures = stored[key]
    alpha, beta = next(iter(figures["all_reduce_fits"].values()))
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / config.devices
    return Hardware("cpu", {"fp32": figures["flops"], "bf16": figures["flops"]}, memory,
                    Link("loopback", alpha / 2, beta, 0.0, "gloo all-reduce fitted here"), None, config.devices,
                    f"this machine ({figures['cores']} cores), measured with {config.devices} ranks",
                    {"all_reduce_fits": {p: tuple(v) for p, v in figures["all_reduce_fits"].items()},
                     "achieved_flops": figures["block_flops"]})


# ---- the run ----------------------------------------------------------------------------------------

def _held(params, grads, optimizer) -> dict:
    from course.saved_tensors import storage_bytes
    from memory.accounting import optimizer_state_tensors

    return {"params": storage_bytes(params), "grads": storage_bytes(grads),
            "optimizer": storage_bytes(optimizer_state_tensors(optimizer))}


def run_worker(rank: int, world_size: int, plan: dict) -> dict:
    """One rank of the planned run (``plan``: the configuration's fields): its measurements (module doc)."""
    import torch
    import torch.distributed as dist

    from course import trace
    from course.collectives import CommCounter, name_group
    from course.launch import context
    from course.measure import Stopwatch
    from course.mesh import ParallelDims
    from course.model import build_gpt2
    from course.task import worker_env_quiet

    worker_env_quiet()
    device = context().device
    dims = ParallelDims(dp=plan["dp"], pp=plan["pp"], tp=plan["tp"])
    s, vocab = plan["model_max_length"], plan["vocab_size"]
    model = build_gpt2(plan["preset"], vocab, n_positions=s, dropout=plan["dropout"], seed=plan["seed"])
    if dims.pp == 1 and dims.tp == 1:
        from course.mesh import Mesh
        from memory.labs.experiments import measure_stage

        from project.options.run_data_parallel import node_group_size, zeropp_parts

        mesh = Mesh(dims)
        parts = zeropp_parts(plan["zero"], plan["zeropp"])  # ZeRO++: hpZ's node-sized group as the planner lays it out
        node = node_group_size(dims.dp, plan["zeropp_group"], (plan["devices_per_node"] or 8) // dims.tp)
        hpz = mesh.hybrid_shard_groups(dims.dp // node)[0] if "hpz" in parts else None
        found = measure_stage(model.to(device), plan["zero"], mesh.dp_group, steps=plan["steps"], zeropp=parts,
                              hpz_group=hpz, batch_size=plan["batch_size"] // dims.dp, seq_len=s, vocab_size=vocab,
                              checkpointing=plan["activation_checkpointing"], precision=plan["precision"],
                              lr=plan["learning_rate"], timed_comm=True)
        comm = found["comm_by_group"] if dims.dp > 1 else {}  # "dp"; with ZeRO++'s hpz also "dp_shard"
        waits = {name: statistics.median(step.get(name, 0.0) for step in found["comm_seconds"]) for name in comm}
        return {"rank": rank, "stage": 0, "held": found["held"], "activations": found["activation_bytes"],
                "comm": comm, "step_s": found["step_time_median"], "own_step_s": found["step_time_median"],
                "comm_seconds": waits, "timer": found["timer"]}
    from three_d.rank_setup import setup_rank
    from three_d.step import three_d_step

    ranked = setup_rank(dims, model, device)
    mesh, stage, runner = ranked.mesh, ranked.stage, ranked.runner
    for name in ("dp", "pp", "tp"):
        name_group(mesh.group(name), name)
    name_group(mesh.embedding_group, "embedding")
    optimizer = torch.optim.AdamW(stage.parameters(), lr=plan["learning_rate"])
    rows = plan["batch_size"] // dims.dp
    ids = torch.randint(0, vocab, (rows, s), generator=torch.Generator().manual_seed(1 + mesh.dp_rank)).to(device)
    times, peak, waits = [], 0, []
    for step in range(1 + plan["steps"]):
        dist.barrier(group=dist.group.WORLD)
        recorder = trace.Recorder(device)
        with CommCounter() as counter, Stopwatch(device) as clock, trace.recording(recorder):
            out = three_d_step(stage, runner, mesh, ids, ids.clone(), plan["micro_batches"], plan["schedule"], None)
            optimizer.step()
        if step:
            times.append(clock.seconds)
            peak = max(peak, out["result"].peak_activation_bytes)
            waits.append(trace.communication_seconds_by_group(recorder.spans))
    slowest = torch.tensor(times, dtype=torch.float64)
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX, group=dist.group.WORLD)
    params = list(stage.parameters())
    return {"rank": rank, "stage": mesh.stage, "coordinates": mesh.coordinates._asdict(),
            "held": _held(params, [p.grad for p in params], optimizer), "activations": peak,
            "comm": counter.by_group(), "step_s": statistics.median(slowest.tolist()),
            "own_step_s": statistics.median(times), "timer": clock.timer,
            "comm_seconds": {g: statistics.median(w.get(g, 0.0) for w in waits) for g in set().union(*waits)}}


def measure_run(config) -> dict:
    """Run ``config`` on this machine's CPU (one process per rank): ``{"ranks": [per rank measurements],
    "machine"}`` (see :func:`run_worker`)."""
    import dataclasses

    from course.launch import launch

    out = launch(run_worker, config.world_size, dataclasses.asdict(config), device="cpu", timeout=1800)
    return {"ranks": [out[r] for r in sorted(out)],
            "machine": f"{os.cpu_count()} CPU cores shared by {config.world_size} ranks (and whatever else runs)"}


def compare(config, prediction: dict, measurement: dict) -> list[dict]:
    """Rows ``{"term", "stage", "predicted", "measured", "error"}`` (error = predicted / measured - 1), per
    pipeline stage (its first rank's measurement): memory by category (bytes), communication bytes per
    group (per step), and the step time (seconds, the whole run)."""
    rows = []
    firsts = {}
    for r in measurement["ranks"]:
        firsts.setdefault(r["stage"], r)

    def row(term, stage, predicted, measured):
        error = predicted / measured - 1 if measured else (0.0 if not predicted else float("inf"))
        rows.append({"term": term, "stage": stage, "predicted": predicted, "measured": measured, "error": error})

    for stage, measured in sorted(firsts.items()):
        predicted = prediction.stages[stage]
        held = predicted.memory.categories()
        for category in ("params", "grads", "optimizer"):
            row(f"memory: {category} (bytes)", stage, held[category], measured["held"][category])
        row("memory: activations (bytes)", stage, held["activations"], measured["activations"])
        groups = sorted({c.group for c in predicted.comm} | set(measured["comm"]))
        for group in groups:
            want = sum(c.count * c.bytes for c in predicted.comm if c.group == group)
            got = sum(v["bytes"] for v in measured["comm"].get(group, {}).values())
            row(f"communication: {group} (bytes per step)", stage, want, got)
        # time: this rank's compute (its step less its time inside communication calls), the time inside
        # the calls of each group but pp, and inside pp's send/recv: the pipeline's wait (bubble, transfers
        # and slower stages; predicted: the step less this stage's compute and other communication)
        waits = measured.get("comm_seconds", {})
        other = {g: t for g, t in predicted.comm_s.items() if g != "pp"}
        row("time: compute (s)", stage, predicted.compute_s, measured["own_step_s"] - sum(waits.values()))
        for group in sorted(set(other) | set(waits) - {"pp"}):
            row(f"time: communication {group} (s)", stage, other.get(group, 0.0), waits.get(group, 0.0))
        if config.pp > 1:
            row("time: pipeline wait: bubble + pp (s)", stage,
                prediction.step_s - predicted.compute_s - sum(other.values()), waits.get("pp", 0.0))
    row("step time (s)", "all", prediction.step_s, max(r["step_s"] for r in measurement["ranks"]))
    return rows
