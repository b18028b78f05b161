"""The step, replayed: each stage's kernels priced, the schedule's action lists replayed, communication overlapped.

:func:`predict` prices every kernel of a micro-batch on each stage (:func:`project.planner.kernels.stage_kernels`,
:func:`project.planner.pricing.kernel_seconds`) into a forward ``F``, a backward ``B`` (with the recomputed forward)
and, for ZB-H1, a weight-gradient ``W`` per micro-batch, adds the calls that sit inside them on the critical path
(tp, cp, ep), replays the schedule's action lists (``pipeline.SCHEDULES``, :func:`pipeline.metrics.replay`) with a pp
send per hand-over, hides ZeRO-3's per-block gathers behind the previous block (:func:`exposed_gathers`) and each
stage's gradient reduction behind its last backward (:func:`reduction_finish`) when ``--dp_overlap`` is on, then
runs the tied embedding's all-reduce, the 3D step's scalars, ZeRO-1/2's gathers and the optimizer. Communication
hidden behind computation still holds SMs while it runs: the computation it overlaps loses their share
(:func:`project.planner.pricing.contention_seconds`), added to the step as compute.

The step splits exactly into ``compute + bubble + exposed communication + optimizer`` (see :class:`Prediction`);
compute splits further into the kernel classes (matrix products, attention, memory-bound kernels) and the SMs'
share lost to hidden communication (``contention``). The bubble is
one thing throughout: the critical stage's idle time as a **fraction of the step**, beside the schedule's
formula for equal stages ``(p - 1) / (w m + p - 1)`` (``pipeline.Schedule.bubble``), which is the same fraction of
an ideal step.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from project.planner.communication import Call, call_seconds, group_placement, group_shape, stage_communication
from project.planner.kernels import stage_kernels
from project.planner.layout import pipeline_actions, stage_layout
from project.planner.memory import ALLOCATOR_HEADROOM, StageMemory, stage_memory
from project.planner.pricing import clock_factor, contention_seconds, kernel_seconds

BUCKET_BYTES = 25 * 2**20  # gradient bucket of DDP (torch.nn.parallel.DistributedDataParallel, bucket_cap_mb=25)
IN_ACTION = ("tp", "cp", "ep")  # groups whose calls sit inside a forward or backward: on the critical path
CLASSES = ("gemm", "attention", "memory")


@dataclass
class StagePrediction:
    """One pipeline stage (one rank of it): memory, per-micro-batch costs (seconds, with the in-action calls:
    ``forward_s``, ``backward_s``), its compute per step (``compute_s``) by kernel class (``compute_by_class``),
    its calls and their seconds per group."""

    stage: int
    memory: StageMemory
    compute_s: float
    compute_by_class: dict
    forward_s: float
    backward_s: float
    optimizer_s: float
    comm: list
    comm_s: dict


@dataclass
class Prediction:
    """The prediction for one configuration (times in seconds, memory in bytes).

    ``step_s = compute_s + bubble_s + comm_s + optimizer_s`` exactly: ``compute_s`` is the critical stage's
    computation (the stage busiest in the replay; ``compute_by_class`` splits it into the kernel classes and
    ``contention``, the computation lost to the SMs hidden communication holds), ``bubble_s`` its idle time in the
    replay without transfer latency (``bubble`` = ``bubble_s / step_s``; ``bubble_theory`` the schedule's formula),
    ``comm_s`` the exposed communication (per group in ``exposed_s``; ``hidden_s`` the rest of each group's seconds),
    ``optimizer_s`` the optimizer step at the end. ``model_flops`` (PaLM's) and ``hardware_flops`` (as executed,
    recomputation included) per step, summed over the devices; ``mfu`` and ``hfu`` over the peak."""

    stages: list
    memory_bytes: float
    device_memory_bytes: float
    usable_memory_bytes: float
    fits: bool
    compute_s: float
    compute_by_class: dict
    bubble: float
    bubble_theory: float
    bubble_s: float
    comm_s: float
    exposed_s: dict
    hidden_s: dict
    comm_total_s: dict
    optimizer_s: float
    pipeline_s: float
    step_s: float
    tokens: float
    model_flops: float
    hardware_flops: float
    mfu: float
    hfu: float
    hardware: str
    peak_flops: float
    efficiency_source: str
    overlap: bool
    critical_stage: int
    limit: str = ""
    extra: dict = field(default_factory=dict)

    def shares(self) -> dict[str, float]:
        """Each part of the step as a fraction of it: the kernel classes, the bubble, each group's exposed
        communication, the optimizer (they sum to 1)."""
        out = {k: v / self.step_s for k, v in self.compute_by_class.items()}
        out["bubble"] = self.bubble_s / self.step_s
        out |= {f"exposed {g}": t / self.step_s for g, t in self.exposed_s.items()}
        out["optimizer"] = self.optimizer_s / self.step_s
        return out


def exposed_gathers(per_block: float, compute_per_block: float, blocks: int, overlap: bool) -> float:
    """Seconds a ZeRO-3 unit-by-unit all-gather adds to a pass over ``blocks`` blocks, each gather taking
    ``per_block`` and each block's computation ``compute_per_block``: with prefetch (``overlap``, as FSDP's
    forward and backward prefetch) the first gather is exposed and each later one hides behind the previous
    block's computation, ``g + (blocks - 1) max(0, g - c)``; without, all of them, ``blocks g``."""
    if blocks < 1 or per_block <= 0:
        return 0.0
    if not overlap:
        return blocks * per_block
    return per_block + (blocks - 1) * max(0.0, per_block - compute_per_block)


def reduction_finish(start_last_backward: float, end_backward: float, seconds: float, last_bucket: float,
                     overlap: bool) -> float:
    """When a stage's gradient reduction ends: its buckets but the last run from the start of the stage's last
    backward (its gradients are produced during it), the last bucket once the backward has ended and the others
    are done; without ``overlap`` all of it after the backward. The exposed part (the result less
    ``end_backward``) is ``max(0, C - C_last - B_last) + C_last`` with ``B_last`` the last backward's length
    (Li et al. 2020, PyTorch Distributed, Sec. 3.2.3: bucketing and overlap)."""
    if not overlap:
        return end_backward + seconds
    last = min(last_bucket, seconds)
    return max(end_backward, start_last_backward + seconds - last) + last


def replay_step(actions, costs: list[dict], latency: float, extra: list[dict] | None = None):
    """:func:`pipeline.metrics.replay` of ``actions`` with ``costs[r][kind]`` seconds per action of stage r
    (``extra[r][kind]``: seconds added to the stage's first action of that kind)."""
    from pipeline.metrics import replay

    durations = []
    for r, acts in enumerate(actions):
        seen, row = set(), []
        for a in acts:
            add = 0.0
            if extra and a[0] not in seen:
                add = extra[r].get(a[0], 0.0)
                seen.add(a[0])
            row.append(costs[r][a[0]] + add)
        durations.append(row)
    return replay(actions, durations, latency)


@dataclass
class Split:
    """A stage's calls by where they sit in the step: ``in_action`` {group: (forward, backward) seconds per
    micro-batch}, ``hop`` (one pp send), ``gathers`` {group: (forward, backward) seconds of ZeRO-3's per-unit
    all-gathers}, ``reduction`` {group: seconds of the gradient reduction}, ``last_bucket`` {group: its last
    bucket}, ``post`` {group: after the reduction: the tied embedding's all-reduce, the 3D step's scalars, ZeRO-1/2's
    gather of the updated weights}."""

    in_action: dict = field(default_factory=dict)
    hop: float = 0.0
    gathers: dict = field(default_factory=dict)
    reduction: dict = field(default_factory=dict)
    last_bucket: dict = field(default_factory=dict)
    post: dict = field(default_factory=dict)


def split_calls(calls: list[Call], config) -> Split:
    """:class:`Split` of a stage's priced calls."""
    from project.planner.communication import passes, zeropp_parts

    m = config.micro_batches
    forward_share = {"tp": passes(config) / (passes(config) + 1), "cp": (passes(config)) / (passes(config) + 2),
                     "ep": 1 / 2}
    out = Split()
    by_group: dict[str, list[Call]] = {}
    for c in calls:
        by_group.setdefault(c.group, []).append(c)
    hpz = "hpz" in zeropp_parts(config)
    for group, group_calls in by_group.items():
        for c in group_calls:
            seconds, scalar = c.seconds, c.bytes == 8 and c.count <= 2
            if scalar or group == "embedding":
                out.post[group] = out.post.get(group, 0.0) + seconds
            elif group in IN_ACTION:
                f = seconds / m * forward_share[group]
                old = out.in_action.get(group, (0.0, 0.0))
                out.in_action[group] = (old[0] + f, old[1] + seconds / m - f)
            elif group == "pp":
                if c.kind == "send":
                    out.hop = seconds / c.count
            elif c.kind == "all_gather" and config.zero == 3:
                gathers = [x for x in group_calls if x.kind == "all_gather"]
                backward = group == "dp_shard" or (not (hpz and group == "dp") and c is gathers[-1])
                old = out.gathers.get(group, (0.0, 0.0))
                out.gathers[group] = (old[0] + (0 if backward else seconds), old[1] + (seconds if backward else 0))
            elif c.kind == "all_gather":  # ZeRO-1/2: the updated slices, after the optimizer step
                out.post[group] = out.post.get(group, 0.0) + seconds
            else:  # the gradient reduction (all-reduce, reduce-scatter, or ZeRO++'s int8 all-to-all)
                out.reduction[group] = out.reduction.get(group, 0.0) + seconds
                unit = seconds / c.count if config.zero == 3 else seconds * min(1.0, BUCKET_BYTES / max(c.bytes, 1.0))
                out.last_bucket[group] = max(out.last_bucket.get(group, 0.0), unit)
    return out


def price_stage(config, hardware, stage: int):
    """``(StagePrediction, costs per action kind, extra on the first action of a kind, Split, compute per step,
    gathers' exposed seconds)`` of ``stage``."""
    from course.collectives import ring_traffic_bytes

    from project.planner.pricing import gemm_base_efficiency  # noqa: F401 (the source is read in predict)

    m, v = config.micro_batches, (config.virtual_stages if config.pp > 1 else 1)
    memory = stage_memory(config, stage)
    calls = stage_communication(config, stage)
    comm_s: dict[str, float] = {}
    for c in calls:
        c.seconds = c.count * call_seconds(hardware, config, c.group, c.kind, c.bytes)
        c.traffic_bytes = c.count * ring_traffic_bytes(c.kind, c.bytes, group_shape(config, c.group)[0])
        comm_s[c.group] = comm_s.get(c.group, 0.0) + c.seconds
    split = split_calls(calls, config)
    by_phase = {"F": 0.0, "B": 0.0, "W": 0.0, "R": 0.0, "O": 0.0}
    by_class = {k: 0.0 for k in CLASSES}
    for k in stage_kernels(config, stage):
        seconds = kernel_seconds(k, hardware, config.precision, config.flops_efficiency)
        by_phase[k.phase] += seconds
        if k.phase != "O":
            by_class[k.kind] += seconds * m
    tp_f = sum(f for f, _ in split.in_action.values())
    tp_b = sum(b for _, b in split.in_action.values())
    forward, backward = by_phase["F"], by_phase["B"] + by_phase["R"]
    if config.schedule == "zb-h1" and config.pp > 1:
        cost = {"F": forward + tp_f, "B": backward + tp_b, "W": by_phase["W"]}
    else:
        cost = {"F": forward + tp_f, "B": backward + by_phase["W"] + tp_b}
    blocks = max(1, stage_layout(config, stage).blocks)
    overlap = config.dp_overlap == "on"
    gather_f = sum(exposed_gathers(f / blocks, forward / blocks, blocks, overlap) for f, _ in split.gathers.values())
    gather_b = sum(exposed_gathers(b / blocks, (backward + by_phase["W"]) / blocks, blocks, overlap)
                   for _, b in split.gathers.values())
    optimizer = by_phase["O"] * m
    compute = (forward + backward + by_phase["W"]) * m
    predicted = StagePrediction(stage=stage, memory=memory, compute_s=compute, compute_by_class=by_class,
                                forward_s=cost["F"], backward_s=cost["B"] + cost.get("W", 0.0), optimizer_s=optimizer,
                                comm=calls, comm_s=comm_s)
    return predicted, {k: t / v for k, t in cost.items()}, {"F": gather_f, "B": gather_b}, split, compute, \
        gather_f + gather_b


def predict(config, hardware) -> Prediction:
    """The :class:`Prediction` for ``config`` (a :class:`project.planner.cli.PlanConfig`) on ``hardware``
    (:class:`course.hardware.Hardware`): the module docstring's replay."""
    from pipeline.schedules import SCHEDULES

    from project.planner.kernels import stage_flops
    from project.planner.pricing import gemm_base_efficiency

    overlap = config.dp_overlap == "on"
    priced = [price_stage(config, hardware, stage) for stage in range(config.pp)]
    stages = [p[0] for p in priced]
    costs, extra, splits = [p[1] for p in priced], [p[2] for p in priced], [p[3] for p in priced]
    actions = pipeline_actions(config)
    hop = max(s.hop for s in splits)
    still = replay_step(actions, costs, 0.0, extra)
    events = replay_step(actions, costs, hop, extra) if hop else still
    t0 = max(e[3] for ev in still for e in ev)
    t1 = max(e[3] for ev in events for e in ev)
    finish, ends = [], []
    for r, ev in enumerate(events):
        last_b = max(e[2] for e in ev if e[0] == "B")
        total = sum(splits[r].reduction.values())
        last = max(splits[r].last_bucket.values(), default=0.0)
        finish.append(reduction_finish(last_b, ev[-1][3], total, last, overlap))
        ends.append(finish[-1] + sum(splits[r].post.values()) + stages[r].optimizer_s)
    step = max(ends)
    busy = [sum(e[3] - e[2] for e in ev) for ev in still]
    crit = max(range(config.pp), key=lambda r: busy[r])
    exposed: dict[str, float] = {}

    def add(group, seconds):
        if seconds > 0:
            exposed[group] = exposed.get(group, 0.0) + seconds

    m = config.micro_batches
    for group, (f, b) in splits[crit].in_action.items():
        add(group, (f + b) * m)
    gathers = splits[crit].gathers
    gather_total = sum(f + b for f, b in gathers.values())
    for group, (f, b) in gathers.items():  # the exposed part of ZeRO-3's gathers, shared out by their seconds
        add(group, priced[crit][5] * (f + b) / gather_total)
    add("pp", t1 - t0)
    r_red = max(range(config.pp), key=lambda r: finish[r])
    red_total = sum(splits[r_red].reduction.values())
    for group, seconds in splits[r_red].reduction.items():
        add(group, (max(finish) - t1) * seconds / red_total)
    r_end = max(range(config.pp), key=lambda r: ends[r])
    tail = step - max(finish)
    after = {**splits[r_end].post, "optimizer": stages[r_end].optimizer_s}
    after_total = sum(after.values())
    optimizer_s = tail * after["optimizer"] / after_total if after_total else 0.0
    for group, seconds in splits[r_end].post.items():
        add(group, tail * seconds / after_total)
    totals: dict[str, float] = {}
    for s in stages:
        for group, seconds in s.comm_s.items():
            totals[group] = max(totals.get(group, 0.0), seconds)
    hidden = {g: max(0.0, t - exposed.get(g, 0.0)) for g, t in totals.items()}
    contention = contention_seconds(sum(t for g, t in hidden.items() if g != "pp"), hardware)  # collectives only
    step += contention
    compute = priced[crit][4] + contention
    bubble_s = t0 - busy[crit]
    tokens = config.batch_size * config.model_max_length
    model_flops = config.model.model_flops_per_token(config.vocab_size, config.model_max_length) * tokens
    hardware_flops = sum(stage_flops(config, r) for r in range(config.pp)) * config.tp * config.dp * config.cp
    peak = hardware.peak_flops[config.precision]
    memory_bytes = max(s.memory.total for s in stages)
    usable = hardware.memory_bytes * (1 - ALLOCATOR_HEADROOM)
    source = "measured on this CPU" if "achieved_flops" in hardware.notes else \
        gemm_base_efficiency(hardware, 1e12, config.flops_efficiency)[1]
    out = Prediction(stages=stages, memory_bytes=memory_bytes, device_memory_bytes=hardware.memory_bytes,
                     usable_memory_bytes=usable, fits=memory_bytes <= usable, compute_s=compute,
                     compute_by_class=dict(stages[crit].compute_by_class) | {"contention": contention}, bubble=bubble_s / step if step else 0.0,
                     bubble_theory=SCHEDULES[config.schedule].bubble(config.pp, m, config.virtual_stages)
                     if config.pp > 1 else 0.0, bubble_s=bubble_s, comm_s=sum(exposed.values()), exposed_s=exposed,
                     hidden_s=hidden, comm_total_s=totals, optimizer_s=optimizer_s, pipeline_s=t1, step_s=step,
                     tokens=tokens, model_flops=model_flops, hardware_flops=hardware_flops,
                     mfu=model_flops / (step * config.devices * peak), hfu=hardware_flops / (step * config.devices * peak),
                     hardware=hardware.name, peak_flops=peak, efficiency_source=source, overlap=overlap,
                     critical_stage=crit, extra={"clock_factor": clock_factor(hardware)})
    from project.planner.report import limiting_term

    out.limit = limiting_term(config, hardware, out)
    return out
