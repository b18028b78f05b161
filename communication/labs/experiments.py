"""Workers that project/tools/benchmark.py and notebooks/01 and 04 launch (spawned ranks import them from here).

Their repeated measurements go through the course's one benchmark harness (:mod:`course.benchmarking`).

* :func:`ring_trace_worker`     — the messages of one ring all-reduce, for drawing the ring step by step;
* :func:`allreduce_bench_worker` — latency of ``dist.all_reduce``, the ring and the tree per message size;
* :func:`dp_throughput_worker`  — training tokens/s of ``average_gradients``, the bucketed reducer and torch DDP,
  at one or several numbers of ranks (also notebook 01's scaling measurement);
* :func:`overlap_timeline_worker` — when each bucket's all-reduce starts and ends relative to the backward pass;
* :func:`compression_worker`    — loss curves and bytes sent per step: none, top-k, PowerSGD, torch's PowerSGD hook.

:func:`launch_measured` launches one of them with the machine recorded around it (busy ranks, the load before
and after, the conditions), for a notebook to print beside what it measured.
"""
from __future__ import annotations

import math
import statistics

import torch
import torch.distributed as dist

from course.measure import seconds, stamp

ALGORITHMS = ("dist.all_reduce", "ring", "tree")
INNER_SECONDS = 2e-3  # a timed repeat of allreduce_bench_worker lasts at least this long (up to MAX_INNER calls)
MAX_INNER = 64


def launch_measured(worker, world_size: int, *args, device: str = "auto", **kwargs) -> tuple[dict, dict]:
    """:func:`course.launch.launch` of ``worker`` on ``world_size`` ranks, with the machine it ran on:
    :func:`course.benchmarking.machine` (``busy_ranks=world_size``) before the ranks start, and
    :func:`course.benchmarking.finish` (the load after, the conditions: quiet, loaded, oversubscribed) once they
    are done. ``kwargs`` go to ``launch`` (``timeout``, ...).

    Returns:
        ``(launch's {rank: result}, the machine record)``; print it with :func:`course.benchmarking.describe`.

    Raises:
        course.launch.RankFailure: as ``launch``.
    """
    from course.benchmarking import finish, machine
    from course.launch import launch, resolve_device_backend

    info = machine(resolve_device_backend(device, "auto", world_size)[0], busy_ranks=world_size)
    out = launch(worker, world_size, *args, device=device, **kwargs)
    return out, finish(info)


def ring_trace_worker(rank: int, world_size: int, numel: int = 10) -> dict:
    """Ring all-reduce of ``[rank * 100 + i]`` (``numel`` int64 entries); the messages this rank sent and the result."""
    from communication.ring import ring_all_reduce

    from course.launch import context

    trace: list = []
    t = torch.arange(numel, dtype=torch.int64, device=context().device) + 100 * rank
    ring_all_reduce(t, group=None, trace=trace)
    return {"trace": trace, "result": t.tolist(), "chunks": [len(c) for c in torch.tensor_split(t, world_size)]}


def allreduce_bench_worker(rank: int, world_size: int, sizes_bytes: list[int], repeats: int, warmup: int = 1) -> dict:
    """Seconds per all-reduce of a float32 tensor of each size, for each algorithm, interleaved
    (:func:`course.benchmarking.interleaved`: ``warmup`` untimed calls, then ``repeats`` rounds in which
    the three take turns, the slowest rank's time, the clock read after the device's queued work).

    A repeat times ``inner`` calls in a row and divides, so that the timer and the barrier before it do not
    dominate a short call: one timed probe call per algorithm (also a warm-up) gives the slowest one's time
    t, and ``inner = min(64, ceil(INNER_SECONDS / t))`` — the same on every rank (the probe is the
    slowest rank's), so a fast link (NCCL: microseconds) repeats up to 64 times and a slow or loaded
    machine once. Returns ``{algorithm: {size: [seconds per call, one per repeat]}, "inner": {size: inner}}``.
    """
    from communication.ring import ring_all_reduce, tree_all_reduce
    from course.benchmarking import interleaved, timed
    from course.launch import context
    from course.task import worker_env_quiet

    worker_env_quiet()
    device = context().device  # NCCL on GPUs: the message lives on the GPU
    group = None  # the benchmark's ranks form one group
    fns = {"dist.all_reduce": lambda t: dist.all_reduce(t, group=group),
           "ring": lambda t: ring_all_reduce(t, group=group),
           "tree": lambda t: tree_all_reduce(t, group=group)}
    out: dict = {a: {} for a in ALGORITHMS}
    out["inner"] = {}
    for size in sizes_bytes:
        tensor = torch.ones(max(1, size // 4), dtype=torch.float32, device=device)
        variants = {name: (lambda f=fns[name]: f(tensor)) for name in ALGORITHMS}
        probe = max(timed(fn, device, group) for fn in variants.values())
        inner = max(1, min(MAX_INNER, math.ceil(INNER_SECONDS / max(probe, 1e-9))))
        times = interleaved(variants, repeats, warmup, device, group, inner=inner)
        for name in ALGORITHMS:
            out[name][size] = times[name]
        out["inner"][size] = inner
    return out


def _synthetic_batch(seed: int, batch: int, seq: int, vocab_size: int, device="cpu") -> dict:
    g = torch.Generator().manual_seed(seed)  # drawn on the host: the same tokens on every device
    ids = torch.randint(0, vocab_size, (batch, seq), generator=g, device="cpu").to(device)
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids.clone()}


DP_VARIANTS = ("average_gradients", "bucketed", "ddp")
NO_SYNC = "no_sync"  # a timing control, not data parallelism: each rank steps on its own gradient, nothing all-reduced


def dp_throughput_worker(rank: int, world_size: int, cfg: dict) -> dict:
    """Training tokens/s of data-parallel GPT-2: each gradient synchronisation (``variants``) at each number
    of ranks (``world_sizes``), on the same model and batches — the one data-parallel throughput
    measurement of the course (notebooks 01 and 04, ``project/tools/benchmark.py``).

    ``cfg``:

    * ``variants``: of ``average_gradients`` (5.1.2, one all-reduce per tensor), ``bucketed``
      (:class:`communication.buckets.BucketedReducer`, overlap on, ``bucket_mb``) and ``ddp``
      (``DistributedDataParallel``, the same ``bucket_cap_mb``); default all three. ``no_sync`` (:data:`NO_SYNC`)
      is a control: the same step with no gradient communication at all, so that its difference from
      ``average_gradients`` measures what the all-reduces cost;
    * ``world_sizes``: windows of ranks ``0 .. n - 1`` (default ``[world_size]``). In a window of ``n``
      ranks, each has ``cores // n`` threads — what :mod:`course.launch` gives a run of ``n`` processes,
      so one rank alone has the whole machine — while the others wait at a barrier (which takes no CPU);
    * the model: ``preset``, ``vocab_size``, dropout 0, AdamW;
    * the data: ``batches`` (global batches, dicts of (B, T) tensors; rank r of n takes rows
      ``r B/n .. (r+1) B/n``: the same work split n ways), or else ``steps`` synthetic batches of
      ``per_rank_batch`` rows of ``seq_len`` random tokens per rank;
    * ``warmup`` untimed steps per variant and window, then ``repeats`` rounds in which every window and
      variant takes its turn (:func:`course.benchmarking.timed`: the slowest rank of the window, the
      clock read after the device's queued work), so a change in the machine's load touches all alike.

    Tokens are the non-padding input tokens of all ranks of the window (``attention_mask``), as the
    epoch runner's ``tokens_per_sec`` counts them.

    Returns:
        rank 0: ``{"rows": [{"variant", "world_size", "repeat", "seconds", "steps", "tokens",
        "tokens_per_sec"}], "param_sha": {variant: parameter fingerprint (largest window)}, "n_buckets":
        buckets of the bucketed reducer}``; the other ranks ``{}``.
    """
    import os

    from torch.nn.parallel import DistributedDataParallel

    from course.benchmarking import timed
    from course.launch import context
    from course.loss import model_loss
    from course.model import build_gpt2, parameter_fingerprint
    from course.task import worker_env_quiet
    from data_parallel import average_gradients

    worker_env_quiet()
    device = context().device
    sizes = sorted(cfg.get("world_sizes") or [world_size])
    names = tuple(cfg.get("variants") or DP_VARIANTS)
    if max(sizes) > world_size or min(sizes) < 1:
        raise ValueError(f"world_sizes {sizes} must lie in 1 .. {world_size} (the ranks launched)")
    unknown = set(names) - set(DP_VARIANTS) - {NO_SYNC}
    if unknown:
        raise ValueError(f"unknown variants {sorted(unknown)}: choose from {DP_VARIANTS + (NO_SYNC,)}")
    groups = {n: dist.new_group(list(range(n))) if n < world_size else None for n in sizes}  # collective: every rank
    threads, cores = torch.get_num_threads(), os.cpu_count() or 1

    def my_batches(n: int) -> list[dict]:
        if cfg.get("batches"):
            per = cfg["batches"][0]["input_ids"].shape[0] // n
            return [{k: v[rank * per:(rank + 1) * per].to(device) for k, v in b.items()} for b in cfg["batches"]]
        return [_synthetic_batch(1000 * i + rank, cfg["per_rank_batch"], cfg["seq_len"], cfg["vocab_size"], device)
                for i in range(cfg["steps"])]

    def tokens_per_step(n: int) -> list[int]:
        if cfg.get("batches"):
            per = cfg["batches"][0]["input_ids"].shape[0] // n
            return [int(b["attention_mask"][:per * n].sum()) for b in cfg["batches"]]
        return [cfg["per_rank_batch"] * cfg["seq_len"] * n] * cfg["steps"]

    def build(name: str, n: int):
        seq = max(b["input_ids"].shape[1] for b in cfg["batches"]) if cfg.get("batches") else cfg["seq_len"]
        model = build_gpt2(cfg.get("preset", "tiny"), cfg["vocab_size"], n_positions=seq, dropout=0.0,
                           seed=0).to(device)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
        forward, sync = model, None
        if name == "ddp":
            forward = DistributedDataParallel(model, bucket_cap_mb=cfg.get("bucket_mb", 25.0), process_group=groups[n])
        elif name == "bucketed":
            from communication.buckets import BucketedReducer

            sync = BucketedReducer(model, group=groups[n], bucket_mb=cfg.get("bucket_mb", 25.0), overlap=True)
        return model, forward, opt, sync

    def step(state, name: str, n: int, batch: dict) -> None:
        model, forward, opt, sync = state
        opt.zero_grad(set_to_none=True)
        if sync is not None:
            sync.before_backward()
        model_loss(forward, batch).backward()
        if sync is not None:
            sync.finish()
        elif name == "average_gradients":
            average_gradients(model, groups[n])
        opt.step()

    states, data = {}, {}
    for n in sizes:  # build and warm up every (window, variant) once
        dist.barrier(group=None)
        if rank < n:
            torch.set_num_threads(max(1, cores // n))
            data[n] = my_batches(n)
            for name in names:
                states[(name, n)] = build(name, n)
                for i in range(cfg["warmup"]):
                    step(states[(name, n)], name, n, data[n][i % len(data[n])])
            torch.set_num_threads(threads)
    rows = []
    for repeat in range(cfg["repeats"]):
        for n in sizes:
            dist.barrier(group=None)
            if rank >= n:
                continue
            torch.set_num_threads(max(1, cores // n))
            for name in names:
                seconds = timed(lambda: [step(states[(name, n)], name, n, b) for b in data[n]], device, groups[n])
                tokens = sum(tokens_per_step(n))
                rows.append({"variant": name, "world_size": n, "repeat": repeat, "seconds": seconds,
                             "steps": len(data[n]), "tokens": tokens, "tokens_per_sec": tokens / seconds})
            torch.set_num_threads(threads)
    dist.barrier(group=None)
    if rank != 0:
        return {}
    largest = max(sizes)
    bucketed = states.get(("bucketed", largest))
    return {"rows": rows, "param_sha": {name: parameter_fingerprint(states[(name, largest)][0]) for name in names},
            "n_buckets": len(bucketed[3].buckets) if bucketed else None}


def overlap_timeline_worker(rank: int, world_size: int, cfg: dict) -> dict:
    """One training step of GPT-2 (``cfg`` as :func:`dp_throughput_worker`) with the bucketed reducer
    recording events, with overlap on and off; times in ms from the start of the backward pass.

    Returns ``{"overlap": t, "after backward": t}`` with ``t = {"backward": (start, end),
    "finish_end": ms, "grads": [(ms, bucket)], "launches": {bucket: ms}, "waits": {bucket: ms},
    "n_buckets": int}``.
    """
    from communication.buckets import BucketedReducer
    from course.launch import context
    from course.loss import model_loss
    from course.model import build_gpt2
    from course.task import worker_env_quiet

    worker_env_quiet()
    device = context().device
    model = build_gpt2(cfg["preset"], cfg["vocab_size"], n_positions=cfg["seq_len"], dropout=0.0, seed=0).to(device)
    batch = _synthetic_batch(rank, cfg["per_rank_batch"], cfg["seq_len"], cfg["vocab_size"], device)
    out = {}
    for label, overlap in (("overlap", True), ("after backward", False)):
        reducer = BucketedReducer(model, group=None, bucket_mb=cfg["bucket_mb"], overlap=overlap, record=True)
        for _ in range(2):  # the second step is recorded (the first warms up)
            reducer.events.clear()
            model.zero_grad(set_to_none=True)
            reducer.before_backward()
            loss = model_loss(model, batch)
            dist.barrier(group=None)
            t0 = stamp(device)  # course.measure.stamp: no waiting, so the all-reduces keep overlapping
            loss.backward()
            t1 = stamp(device)
            reducer.finish()
            t2 = stamp(device)
        reducer.remove()
        t0 = seconds(t0)
        ms = lambda t: 1000 * (seconds(t) - t0)  # noqa: E731
        out[label] = {"backward": (0.0, ms(t1)), "finish_end": ms(t2),
                      "grads": [(ms(t), b) for t, kind, b in reducer.events if kind == "grad"],
                      "launches": {b: ms(t) for t, kind, b in reducer.events if kind == "launch"},
                      "waits": {b: ms(t) for t, kind, b in reducer.events if kind == "wait"},
                      "n_buckets": len(reducer.buckets)}
    return out


def compression_worker(rank: int, world_size: int, cfg: dict) -> dict:
    """Train the same GPT-2 on the same batches with each compression; loss per step and bytes sent.

    ``cfg``: ``preset``, ``vocab_size``, ``seq_len``, ``per_rank_batch``, ``steps``, ``topk_ratio``,
    ``powersgd_rank``, ``batches`` (a list of global batches, dicts of (B, T) tensors; rank r
    takes its rows). Variants: ``none`` (average_gradients), ``topk`` (:class:`TopKReducer`),
    ``powersgd`` (:class:`PowerSGDReducer`), ``torch_powersgd`` (DDP with torch's
    ``powerSGD_hook``, same rank, uncompressed for its first two steps (``start_powerSGD_iter=2``, the least
    torch allows with error feedback), no minimum compression rate).

    Returns ``{variant: {"losses": [per step, mean over ranks], "bytes_sent": per step per rank,
    "dense_bytes": ...}}``.
    """
    from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as psgd
    from torch.nn.parallel import DistributedDataParallel

    from communication.compression import PowerSGDReducer, TopKReducer
    from course.epoch_runner import to_device
    from course.launch import context
    from course.loss import model_loss
    from course.model import build_gpt2
    from course.task import worker_env_quiet
    from data_parallel import average_gradients

    worker_env_quiet()
    device = context().device
    group = None
    out = {}
    for variant in ("none", "topk", "powersgd", "torch_powersgd"):
        model = build_gpt2(cfg["preset"], cfg["vocab_size"], n_positions=cfg["seq_len"], dropout=0.0, seed=0).to(device)
        opt = torch.optim.AdamW(model.parameters(), lr=cfg.get("learning_rate", 1e-3))
        forward, sync = model, None
        if variant == "topk":
            sync = TopKReducer(model, group=group, ratio=cfg["topk_ratio"])
        elif variant == "powersgd":
            sync = PowerSGDReducer(model, group=group, rank=cfg["powersgd_rank"])
        elif variant == "torch_powersgd":
            # One bucket for the whole model: torch's hook chains collectives from future callbacks, and
            # with several buckets those chains can interleave in a different order on each rank, which
            # gloo (one ordered stream of collectives) answers with a recv timeout. An explicit
            # bucket_cap_mb also sets DDP's first-bucket cap, so 1024 MB gives a single bucket here.
            forward = DistributedDataParallel(model, process_group=group, bucket_cap_mb=1024)
            state = psgd.PowerSGDState(process_group=group, matrix_approximation_rank=cfg["powersgd_rank"],
                                       start_powerSGD_iter=2, min_compression_rate=0.0, use_error_feedback=True,
                                       warm_start=True)
            forward.register_comm_hook(state, psgd.powerSGD_hook)
        losses, sent = [], []
        for batch in cfg["batches"]:
            per = batch["input_ids"].shape[0] // world_size
            mine = to_device({k: v[rank * per:(rank + 1) * per] for k, v in batch.items()}, device)
            opt.zero_grad(set_to_none=True)
            loss = model_loss(forward, mine)
            loss.backward()
            if sync is not None:
                sync.finish()
                sent.append(sync.bytes_sent)
            elif variant == "none":
                average_gradients(model, group)
            opt.step()
            mean = loss.detach().clone()
            dist.all_reduce(mean, group=group)
            losses.append(float(mean) / world_size)
        dense = sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)
        if variant == "torch_powersgd":  # the same formula as PowerSGDReducer: r (n + m) per matrix, vectors dense
            sent = [_powersgd_bytes(model, cfg["powersgd_rank"])] * len(losses)
        elif variant == "none":
            sent = [dense] * len(losses)
        out[variant] = {"losses": losses, "bytes_sent": statistics.median(sent), "dense_bytes": dense}
    return out


def _powersgd_bytes(model, r: int) -> int:
    """Bytes one rank sends per PowerSGD step: r (n + m) per compressible matrix, the vectors in full."""
    total = 0
    for p in model.parameters():
        if p.dim() >= 2 and min(p.shape[0], p[0].numel()) > r:
            total += r * (p.shape[0] + p[0].numel()) * p.element_size()
        else:
            total += p.numel() * p.element_size()
    return total
