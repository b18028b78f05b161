"""Workers that notebooks/05_memory.ipynb (and ``project/run_data_parallel.py --memory_report``) launch.

:func:`memory_breakdown` (and :func:`memory_breakdown_by_dp`, several dp sizes in one launch) trains a GPT-2 built from a config (random tokens, no data files)
for a few steps with each ZeRO stage in turn, on every rank of a dp group, and measures on
each rank:

* the bytes of parameters, gradients and optimizer state held at the optimizer step (after
  the gradient reduction, before the update), counted by storage
  (:func:`course.saved_tensors.storage_bytes`), next to the ZeRO formulas;
* the activation bytes autograd saved in the forward pass (:class:`course.saved_tensors.SavedTensorBytes`);
* the communication per step and rank (:class:`course.collectives.CommCounter`, ring traffic);
* the step time (median, min, max over the timed steps after one warm-up step,
  :func:`course.benchmarking.summarise`; the clock read after the device's queued work, :func:`course.measure.now`) and the peak memory of the timed steps
  (:class:`course.measure.MemoryMeter`: ``torch.cuda.max_memory_allocated`` on a GPU, the process's peak
  RSS on the CPU; ``timer`` and ``memory`` in the result name them).

:func:`step_memory_timeline` follows one training step's memory, operation by operation, by category (torch's
``MemTracker``): the picture behind every peak this notebook prints. :func:`allreduce_calls_worker` prices a
collective call: one all-reduce per parameter tensor against one of the same elements in a flat buffer.

:func:`zero_step_times` times the stages for a comparison: every variant in the same launch, their steps
interleaved (:func:`course.benchmarking.interleaved`), so that :func:`course.benchmarking.compare` can give a
verdict; :func:`memory_breakdown`'s own step times run the stages one after another and are not for comparing.

The model and the batches live on the rank's device (``course.launch.context().device``; the CPU in a
single process).
"""
from __future__ import annotations

import contextlib

import torch

from course import trace
from course.benchmarking import summarise
from course.collectives import CommCounter
from course.loss import model_loss
from course.measure import MemoryMeter, Stopwatch
from course.saved_tensors import SavedTensorBytes, storage_bytes
from memory.accounting import peak_rss_bytes, zero_formula_bytes
from memory.training import ShardedStep, autocast


def _device():
    """The rank's device inside a launched worker, else the CPU."""
    from course.launch import context

    try:
        return context().device
    except RuntimeError:
        return torch.device("cpu")


def random_batch(step: int, batch_size: int, seq_len: int, vocab_size: int, dp_rank: int = 0, device="cpu") -> dict:
    """A batch of random tokens in the course's batch format (``input_ids``, ``attention_mask``, ``labels``),
    drawn on the host (the same tokens on every device) and put on ``device``."""
    g = torch.Generator().manual_seed(1000 * step + dp_rank)
    ids = torch.randint(0, vocab_size, (batch_size, seq_len), generator=g, device="cpu").to(device)
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids.clone()}


def build_tiny_gpt2(preset: str = "tiny", vocab_size: int = 1000, n_positions: int = 64, dropout: float = 0.0,
                    seed: int = 0, **overrides):
    from course.model import build_gpt2

    return build_gpt2(preset, vocab_size, n_positions=n_positions, dropout=dropout, seed=seed, **overrides)


def measure_stage(model, zero: int, group, *, steps: int = 3, batch_size: int = 4, seq_len: int = 64,
                  vocab_size: int = 1000, checkpointing: bool = False, precision: str = "fp32",
                  lr: float = 1e-3, timed_comm: bool = False, zeropp=(), hpz_group=None) -> dict:
    """Train ``steps`` steps (+1 warm-up) with ZeRO ``zero`` and measure (see the module docstring). With
    ``timed_comm`` the result's ``comm_seconds`` lists, per timed step, the seconds spent in communication
    calls per group (a :class:`course.trace.Recorder` active during the step;
    :func:`course.trace.communication_seconds_by_group`). ``zeropp``, ``hpz_group``: ZeRO++ with ``zero=3``
    (:class:`memory.training.ShardedStep`)."""
    from course.collectives import group_rank, group_size

    dp, rank = group_size(group), group_rank(group)
    device = next(model.parameters()).device
    n_params = sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())
    sharded = ShardedStep(model, zero, group, torch.optim.Adam, activation_checkpointing=checkpointing,
                          precision=precision, zeropp=zeropp, hpz_group=hpz_group, lr=lr)
    params_ = [p for p in model.parameters()]
    times, held, saved, losses, peak, comm_seconds = [], None, None, [], 0, []
    with CommCounter() as counter:
        for step in range(steps + 1):
            batch = random_batch(step, batch_size, seq_len, vocab_size, rank, device)
            counter.reset()
            recorder = trace.Recorder(device)
            timing = trace.recording(recorder) if timed_comm else contextlib.nullcontext()
            with Stopwatch(device) as clock, MemoryMeter(device) as memory, timing:
                sharded.end_evaluation()
                sharded.optimizer.zero_grad(set_to_none=True)
                # ZeRO-3 gathers a block's parameters into new storages just before its forward: the
                # storages of these tensors are looked up again whenever a new storage is saved
                excluded = params_ + list(sharded.category_tensors()["params"])
                with SavedTensorBytes(exclude=lambda: excluded) as s:
                    with autocast(device, precision):
                        loss = model_loss(model, batch)
                loss.backward()
                sharded.reduce_gradients()
                held = {k: storage_bytes(v) for k, v in sharded.category_tensors().items()}
                sharded.optimizer.step()
            times.append(clock.seconds)
            if step:  # the timed steps
                peak = max(peak, memory.peak_bytes)
                comm_seconds.append(trace.communication_seconds_by_group(recorder.spans))
            losses.append(loss.item())
            saved = s.activation_bytes
            comm, comm_by_group = counter.summary(), counter.by_group()
    formula = zero_formula_bytes(zero, n_params, dp)
    timed = summarise(times[1:])  # course.benchmarking: the timed steps after the warm-up step
    return {"zero": zero, "dp": dp, "n_params": n_params, "held": held, "formula": formula,
            "bytes_per_param": {k: v / n_params for k, v in held.items()},
            "formula_bytes_per_param": {k: v / n_params for k, v in formula.items()},
            "activation_bytes": saved, "comm": comm, "comm_by_group": comm_by_group,
            "comm_traffic_bytes": sum(v["traffic_bytes"] for v in comm.values()),
            "step_time_median": timed["median"], "step_time_min": timed["min"], "step_time_max": timed["max"],
            "peak_rss_bytes": peak_rss_bytes(), "peak_memory_bytes": peak, "memory": memory.measure,
            "timer": clock.timer, "comm_seconds": comm_seconds, "losses": losses, "checkpointing": checkpointing, "precision": precision}


def memory_breakdown(rank: int, world_size: int, stages=(0, 1, 2, 3), steps: int = 3, preset: str = "tiny",
                     vocab_size: int = 1000, seq_len: int = 64, batch_size: int = 4, checkpointing=(False,),
                     precision: str = "fp32", model_overrides: dict | None = None) -> list[dict]:
    """Worker: for each ZeRO stage (and each ``checkpointing`` setting), a fresh GPT-2 and
    :func:`measure_stage` over the world as the dp group. Returns this rank's measurements."""
    from course.task import worker_env_quiet

    worker_env_quiet()
    out = []
    for ckpt in checkpointing:
        for zero in stages:
            model = build_tiny_gpt2(preset, vocab_size, seq_len, **(model_overrides or {})).to(_device())
            out.append(measure_stage(model, zero, None, steps=steps, batch_size=batch_size, seq_len=seq_len,
                                     vocab_size=vocab_size, checkpointing=ckpt, precision=precision))
    return out


def memory_breakdown_by_dp(rank: int, world_size: int, runs, stages=(0, 1, 2, 3), steps: int = 3,
                           preset: str = "tiny", vocab_size: int = 1000, seq_len: int = 64, batch_size: int = 4,
                           precision: str = "fp32", model_overrides: dict | None = None) -> dict[int, list[dict]]:
    """Worker: :func:`memory_breakdown` for several dp sizes in one launch (one start of the processes).

    ``runs`` lists ``(dp, checkpointing)`` pairs, e.g. ``[(1, (False, True)), (2, (False,)), (4, (False,))]``;
    for each in turn, ranks ``0 .. dp - 1`` train every stage over a group of their own while the others
    wait at a barrier. Returns ``{dp: rank 0's measurements}`` on rank 0 (``{}`` on the others). Run the
    smaller dp sizes first: a rank's peak RSS only grows over the launch.

    Raises:
        ValueError: a dp larger than ``world_size``.
    """
    import torch.distributed as dist

    from course.mesh import Mesh
    from course.task import worker_env_quiet

    if max(dp for dp, _ in runs) > world_size:
        raise ValueError(f"runs need {max(dp for dp, _ in runs)} ranks, the launch has {world_size}")
    worker_env_quiet()
    world = Mesh.build(dp=world_size).dp_group
    groups = {dp: dist.new_group(list(range(dp))) for dp in sorted({dp for dp, _ in runs})}  # collective: every rank
    found: dict[int, list[dict]] = {}
    for dp, checkpointing in runs:
        dist.barrier(group=world)
        if rank >= dp:
            continue
        for ckpt in checkpointing:
            for zero in stages:
                model = build_tiny_gpt2(preset, vocab_size, seq_len, **(model_overrides or {})).to(_device())
                row = measure_stage(model, zero, groups[dp], steps=steps, batch_size=batch_size, seq_len=seq_len,
                                    vocab_size=vocab_size, checkpointing=ckpt, precision=precision)
                if rank == 0:
                    found.setdefault(dp, []).append(row)
    dist.barrier(group=world)
    return found


def zero_step_times(rank: int, world_size: int, variants=((0, False), (1, False), (2, False), (3, False)),
                    repeats: int = 5, warmup: int = 1, preset: str = "tiny", vocab_size: int = 1000, seq_len: int = 64,
                    batch_size: int = 4, precision: str = "fp32", model_overrides: dict | None = None) -> dict:
    """Worker: the seconds of one training step of each ``(zero, checkpointing)`` variant, **interleaved**
    (:func:`course.benchmarking.interleaved`: ``warmup`` untimed steps of each, then ``repeats`` rounds in
    which every variant takes one timed step in turn, timed on the slowest rank of the world), so a change in
    the machine's load or a warming allocator touches every variant alike, and a verdict between two of them
    is :func:`course.benchmarking.compare` of their lists.

    Every variant holds its own GPT-2 (the same initial weights) and :class:`memory.training.ShardedStep`
    over the world as the dp group (``dp = world_size``); each step takes a fresh random batch
    (:func:`random_batch`, a different one per rank). Launch it with no more ranks than cores for a
    wall-clock comparison (``course.benchmarking.machine(busy_ranks=world_size)`` says whether it was).

    Returns:
        ``{"dp", "names" (one per variant, e.g. ``"ZeRO-1"``, ``"ZeRO-0 + checkpointing"``),
        "seconds" ({name: [seconds per step, one per repeat]}), "variants"}`` — the same on every rank.

    Raises:
        ValueError: a stage outside 0..3, fewer than :data:`course.benchmarking.MIN_REPEATS` repeats, or two
            variants alike.
    """
    from course.benchmarking import MIN_REPEATS, interleaved
    from course.task import worker_env_quiet

    variants = [(int(z), bool(c)) for z, c in variants]
    if any(z not in (0, 1, 2, 3) for z, _ in variants):
        raise ValueError(f"ZeRO stages are 0, 1, 2 or 3, not {sorted({z for z, _ in variants})}")
    if len(set(variants)) != len(variants):
        raise ValueError(f"each (zero, checkpointing) variant once, not {variants}")
    if repeats < MIN_REPEATS:
        raise ValueError(f"repeats must be >= {MIN_REPEATS} (a median and a spread), not {repeats}")
    from course.mesh import Mesh

    worker_env_quiet()
    device = _device()
    world = Mesh.build(dp=world_size).dp_group
    names = [f"ZeRO-{z}" + (" + checkpointing" if c else "") for z, c in variants]
    steps, counts = {}, {}
    for name, (zero, ckpt) in zip(names, variants):
        model = build_tiny_gpt2(preset, vocab_size, seq_len, **(model_overrides or {})).to(device)
        steps[name] = ShardedStep(model, zero, world, torch.optim.Adam, activation_checkpointing=ckpt,
                                  precision=precision, lr=1e-3)
        counts[name] = 0

    def one_step(name):
        def run():
            counts[name] += 1
            steps[name].train_step(random_batch(counts[name], batch_size, seq_len, vocab_size, rank), device)
        return run

    seconds = interleaved({name: one_step(name) for name in names}, repeats, warmup, device, group=world)
    return {"dp": world_size, "names": names, "variants": variants, "seconds": seconds}


def precision_curves(steps: int = 30, precisions=("fp32", "bf16"), n_batches: int = 4, batch_size: int = 8,
                     seq_len: int = 32, vocab_size: int = 500, lr: float = 3e-3, **model_overrides) -> dict:
    """In this process (one rank, no process group): the training loss per step of the same GPT-2
    (same initial weights) on the same ``n_batches`` random batches, cycled, for each precision.

    Returns ``{precision: [loss per step]}``; ``"bf16"`` autocasts the forward and backward to
    bfloat16 with fp32 weights, gradients and Adam state (:class:`memory.training.ShardedStep`).
    """
    overrides = dict(n_layer=2, **model_overrides)
    batches = [random_batch(i, batch_size, seq_len, vocab_size) for i in range(n_batches)]
    out = {}
    for precision in precisions:
        model = build_tiny_gpt2("tiny", vocab_size, seq_len, **overrides)
        step = ShardedStep(model, 0, None, torch.optim.Adam, precision=precision, lr=lr)
        out[precision] = [step.train_step(batches[i % n_batches], "cpu").loss for i in range(steps)]
    return out


def recomputation_check(device="cpu", preset: str = "tiny", vocab_size: int = 1000, seq_len: int = 32,
                        batch_size: int = 4, dropout: float = 0.1, seed: int = 7, **model_overrides) -> dict:
    """In this process: does activation checkpointing (:mod:`memory.checkpointing`) recompute on ``device``
    exactly what the forward pass computed, under bf16 autocast with dropout on?

    The same GPT-2 (``preset``, dropout ``dropout``, weights of seed 0) takes one forward and backward pass
    of the same random batch (``batch_size`` x ``seq_len`` tokens) under ``torch.autocast`` to bfloat16
    (:func:`memory.training.autocast`), random state seeded with ``seed`` before the forward pass: once with
    every block checkpointed, once plain. A hook on each block's MLP records its output (batch, seq_len,
    n_embd) at every call: with checkpointing, the forward pass's and then the recomputation's in the
    backward pass, which must be equal bit for bit and in dtype (same dropout masks: the random state of
    the CPU and of the GPU restored; same precision: the autocast state of the inputs' device replayed).
    The GPU tier checks the same on CUDA (``tests/gpu/test_memory_nccl.py``), the graded test on the CPU
    (``tests/memory/test_checkpointing_replay.py``); this is the form the GPU report records
    (``project/tools/gpu_report.py``).

    Returns:
        ``{"device", "preset", "precision", "dropout", "batch_size", "seq_len", "blocks", "recomputed_blocks"
        (blocks whose MLP ran twice), "equal_blocks" (recomputation == forward pass, same dtype),
        "forward_dtype", "recomputed_dtype", "max_abs_difference" (largest |recomputed - forward| over every
        block), "loss_checkpointed", "loss_plain", "loss_equal", "max_gradient_difference" (largest
        |gradient checkpointed - plain| over the parameters, relative to the largest |gradient| of the plain
        run), "equal" (every block recomputed, equal, and the losses equal)}``.
    """
    from course.model import build_gpt2
    from memory.checkpointing import apply_activation_checkpointing

    device = torch.device(device)
    batch = random_batch(0, batch_size, seq_len, vocab_size, device=device)

    def run(checkpointing: bool):
        model = build_gpt2(preset, vocab_size, n_positions=seq_len, dropout=dropout, seed=0,
                           **model_overrides).to(device).train()
        model.config.use_cache = False  # the recomputation would fill the cache twice
        calls: dict = {}
        for i, block in enumerate(model.transformer.h):
            block.mlp.register_forward_hook(
                lambda m, a, out, i=i: calls.setdefault(i, []).append(out.detach().clone()))
        if checkpointing:
            apply_activation_checkpointing(model.transformer.h)
        torch.manual_seed(seed)  # seeds the CPU's and every GPU's generator: the same dropout masks in both runs
        with autocast(device, "bf16"):
            loss = model_loss(model, batch)
        loss.backward()
        grads = {n: p.grad.detach() for n, p in model.named_parameters() if p.grad is not None}
        return loss.detach(), calls, grads

    loss_ck, calls, grads_ck = run(True)
    loss_plain, _, grads_plain = run(False)
    recomputed = {i: c for i, c in calls.items() if len(c) == 2}
    equal = [i for i, (fwd, again) in recomputed.items() if fwd.dtype == again.dtype and torch.equal(fwd, again)]
    diffs = [float((again.float() - fwd.float()).abs().max()) for fwd, again in recomputed.values()]
    scale = max(float(g.abs().max()) for g in grads_plain.values()) or 1.0
    grad_diff = max(float((grads_ck[n].float() - g.float()).abs().max()) for n, g in grads_plain.items()) / scale
    first = next(iter(recomputed.values()), None)
    return {"device": str(device), "preset": preset, "precision": "bf16", "dropout": dropout,
            "batch_size": batch_size, "seq_len": seq_len, "blocks": len(calls),
            "recomputed_blocks": len(recomputed), "equal_blocks": len(equal),
            "forward_dtype": str(first[0].dtype) if first else None,
            "recomputed_dtype": str(first[1].dtype) if first else None,
            "max_abs_difference": max(diffs, default=0.0), "loss_checkpointed": float(loss_ck),
            "loss_plain": float(loss_plain), "loss_equal": bool(torch.equal(loss_ck, loss_plain)),
            "max_gradient_difference": grad_diff,
            "equal": len(calls) > 0 and len(equal) == len(calls) and bool(torch.equal(loss_ck, loss_plain))}


TIMELINE_CATEGORIES = ("Parameter", "Gradient", "Optstate", "Activation", "Temp")


def step_memory_timeline(preset: str = "tiny", vocab_size: int = 1000, seq_len: int = 64, batch_size: int = 4,
                         **model_overrides) -> dict:
    """In this process, on the CPU: one AdamW training step of the course's GPT-2 (``preset`` with
    ``model_overrides``, dropout 0, a random batch) followed operation by operation under torch's ``MemTracker``
    (``torch.distributed._tools.mem_tracker``), which files every live tensor under a category — parameters,
    gradients, optimizer state, activations (saved for the backward pass), temporaries — by the module and
    phase that made it. After every operation the current bytes of each category are read (a dispatch mode).

    The step starts after one warm-up step, so Adam's moments exist (a first step would create them midway), and
    with the gradients freed (``zero_grad(set_to_none=True)``).

    Returns:
        ``{"rows": [{"op" (index), "phase" ("forward", "backward", "optimizer"), category: bytes for
        :data:`TIMELINE_CATEGORIES`}], "phases": {phase: (first op, last op)}, "peak": the row where the total
        peaked, "n_params"}``.
    """
    from torch.distributed._tools.mem_tracker import MemTracker
    from torch.utils._python_dispatch import TorchDispatchMode

    model = build_tiny_gpt2(preset, vocab_size, seq_len, **model_overrides)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    batch = random_batch(0, batch_size, seq_len, vocab_size)
    model_loss(model, batch).backward()  # warm-up: Adam's moments and step counters exist from here on
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    tracker = MemTracker()
    tracker.track_external(model, optimizer)
    rows, phase = [], {"now": "forward"}

    def read() -> dict:
        out = {c: 0 for c in TIMELINE_CATEGORIES}
        for per_device in tracker.get_tracker_snapshot("current").values():
            for category, nbytes in per_device.items():
                name = getattr(category, "value", category)
                if name in out:
                    out[name] += nbytes
        return out

    class Timeline(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            result = func(*args, **(kwargs or {}))
            rows.append({"op": len(rows), "phase": phase["now"], **read()})
            return result

    with tracker, Timeline():
        loss = model_loss(model, batch)
        phase["now"] = "backward"
        loss.backward()
        phase["now"] = "optimizer"
        optimizer.step()
    phases = {}
    for r in rows:
        first, _ = phases.get(r["phase"], (r["op"], r["op"]))
        phases[r["phase"]] = (first, r["op"])
    peak = max(rows, key=lambda r: sum(r[c] for c in TIMELINE_CATEGORIES))
    return {"rows": rows, "phases": phases, "peak": peak, "n_params": sum(p.numel() for p in model.parameters())}


def allreduce_calls_worker(rank: int, world_size: int, repeats: int = 7, warmup: int = 1, preset: str = "tiny",
                           vocab_size: int = 1000, seq_len: int = 64, model_overrides: dict | None = None) -> dict:
    """Worker: what a collective *call* costs. The gradient-sized tensors of the course's GPT-2 (one per parameter
    tensor: what ZeRO-0's per-tensor all-reduces send) all-reduced one call per tensor, against one all-reduce of
    the same elements in one flat buffer (ZeRO-1/2's single call), interleaved
    (:func:`course.benchmarking.interleaved`, the slowest rank's time).

    Returns:
        ``{"seconds": {"per tensor": [...], "flat": [...]}, "calls": tensors per step, "bytes": bytes per step}``.
    """
    import torch.distributed as dist

    from course.benchmarking import interleaved
    from course.task import worker_env_quiet

    worker_env_quiet()
    model = build_tiny_gpt2(preset, vocab_size, seq_len, **(model_overrides or {}))
    tensors = [torch.ones_like(p) for p in model.parameters()]
    flat = torch.ones(sum(t.numel() for t in tensors), device=tensors[0].device)
    group = dist.group.WORLD

    def per_tensor():
        for t in tensors:
            dist.all_reduce(t, group=group)

    seconds = interleaved({"per tensor": per_tensor, "flat": lambda: dist.all_reduce(flat, group=group)}, repeats,
                          warmup, group=group)
    return {"seconds": seconds, "calls": len(tensors), "bytes": 4 * flat.numel()}
