"""Workers that project/benchmark.py and notebooks/04_communication.ipynb launch (spawned ranks import them from here).

* :func:`ring_trace_worker`     — the messages of one ring all-reduce, for drawing the ring step by step;
* :func:`allreduce_bench_worker` — latency of ``dist.all_reduce``, the ring and the tree per message size;
* :func:`dp_throughput_worker`  — training tokens/s of ``average_gradients``, the bucketed reducer and torch DDP;
* :func:`overlap_timeline_worker` — when each bucket's all-reduce starts and ends relative to the backward pass;
* :func:`compression_worker`    — loss curves and bytes sent per step: none, top-k, PowerSGD, torch's PowerSGD hook.
"""
from __future__ import annotations

import statistics

import torch
import torch.distributed as dist

from course.measure import now, seconds, stamp

ALGORITHMS = ("dist.all_reduce", "ring", "tree")


def ring_trace_worker(rank: int, world_size: int, numel: int = 10) -> dict:
    """Ring all-reduce of ``[rank * 100 + i]`` (``numel`` int64 entries); the messages this rank sent and the result."""
    from communication.ring import ring_all_reduce

    from course.launch import context

    trace: list = []
    t = torch.arange(numel, dtype=torch.int64, device=context().device) + 100 * rank
    ring_all_reduce(t, group=None, trace=trace)
    return {"trace": trace, "result": t.tolist(), "chunks": [len(c) for c in torch.tensor_split(t, world_size)]}


def _timed(fn, tensor, inner: int, group) -> float:
    """Seconds per call of ``fn(tensor)``, over ``inner`` calls, the slowest rank's time (the clock read
    after the device's queued work, :func:`course.measure.now`: on a GPU, the calls to their completion)."""
    dist.barrier(group=group)
    t0 = now(tensor.device)
    for _ in range(inner):
        fn(tensor)
    # a timing: a host tensor, reduced over the group's gloo back-end
    elapsed = torch.tensor([(now(tensor.device) - t0) / inner], dtype=torch.float64, device="cpu")
    dist.all_reduce(elapsed, op=dist.ReduceOp.MAX, group=group)
    return float(elapsed)


def allreduce_bench_worker(rank: int, world_size: int, sizes_bytes: list[int], repeats: int, warmup: int = 1) -> dict:
    """Seconds per all-reduce of a float32 tensor of each size, for each algorithm, interleaved.

    Small messages are timed over several calls (``inner`` = up to 64 calls, fewer as the
    message grows to 1 MB) so that the timer's resolution does not dominate. Returns
    ``{algorithm: {size: [seconds per call, one per repeat]}}`` (the slowest rank's time).
    """
    from communication.ring import ring_all_reduce, tree_all_reduce
    from course.launch import context
    from course.task import worker_env_quiet

    worker_env_quiet()
    device = context().device  # NCCL on GPUs: the message lives on the GPU
    group = None  # the benchmark's ranks form one group
    fns = {"dist.all_reduce": lambda t: dist.all_reduce(t, group=group),
           "ring": lambda t: ring_all_reduce(t, group=group),
           "tree": lambda t: tree_all_reduce(t, group=group)}
    out: dict = {a: {} for a in ALGORITHMS}
    for size in sizes_bytes:
        tensor = torch.ones(max(1, size // 4), dtype=torch.float32, device=device)
        inner = max(1, min(64, (1 << 20) // max(size, 1)))
        for name in ALGORITHMS:
            for _ in range(warmup):
                _timed(fns[name], tensor, 1, group)
        for _ in range(repeats):
            for name in ALGORITHMS:  # interleaved: the machine's load changes alike for all three
                out[name].setdefault(size, []).append(_timed(fns[name], tensor, inner, group))
    return out


def _synthetic_batch(seed: int, batch: int, seq: int, vocab_size: int, device="cpu") -> dict:
    g = torch.Generator().manual_seed(seed)  # drawn on the host: the same tokens on every device
    ids = torch.randint(0, vocab_size, (batch, seq), generator=g, device="cpu").to(device)
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids.clone()}


def dp_throughput_worker(rank: int, world_size: int, cfg: dict) -> dict:
    """Training tokens/s (all ranks) of three gradient synchronisations on the same model and batches.

    ``cfg``: ``preset``, ``vocab_size``, ``seq``, ``per_rank_batch``, ``steps`` (per timed
    repeat), ``repeats``, ``warmup`` (steps), ``bucket_mb``. The variants take turns in each
    repeat (interleaved), each with its own replica and AdamW, dropout 0:
    ``average_gradients`` (5.1.2), ``bucketed`` (:class:`BucketedReducer`, overlap on) and
    ``ddp`` (``DistributedDataParallel`` with the same ``bucket_cap_mb``).

    Returns ``{"tokens_per_sec": {variant: [per repeat]}, "param_sha": {variant: fingerprint}}``.
    """
    from torch.nn.parallel import DistributedDataParallel

    from communication.buckets import BucketedReducer
    from course.loss import model_loss
    from course.launch import context
    from course.model import build_gpt2, parameter_fingerprint
    from course.task import worker_env_quiet
    from data_parallel import average_gradients

    worker_env_quiet()
    device = context().device
    group = None
    variants = {}
    for name in ("average_gradients", "bucketed", "ddp"):
        model = build_gpt2(cfg["preset"], cfg["vocab_size"], n_positions=cfg["seq"], dropout=0.0, seed=0).to(device)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
        if name == "ddp":
            forward = DistributedDataParallel(model, bucket_cap_mb=cfg["bucket_mb"], process_group=group)
            sync = None
        else:
            forward = model
            sync = BucketedReducer(model, group=group, bucket_mb=cfg["bucket_mb"], overlap=True) \
                if name == "bucketed" else None
        variants[name] = (model, forward, opt, sync)

    def step(name, batch):
        model, forward, opt, sync = variants[name]
        opt.zero_grad(set_to_none=True)
        if sync is not None:
            sync.before_backward()
        model_loss(forward, batch).backward()
        if sync is not None:
            sync.finish()
        elif name == "average_gradients":
            average_gradients(model, group)
        opt.step()

    tokens = cfg["per_rank_batch"] * cfg["seq"] * world_size
    batches = [_synthetic_batch(1000 * i + rank, cfg["per_rank_batch"], cfg["seq"], cfg["vocab_size"], device)
               for i in range(cfg["steps"])]
    for name in variants:
        for i in range(cfg["warmup"]):
            step(name, batches[i % len(batches)])
    out = {name: [] for name in variants}
    for _ in range(cfg["repeats"]):
        for name in variants:
            dist.barrier(group=group)
            t0 = now(device)
            for batch in batches:
                step(name, batch)
            elapsed = torch.tensor([now(device) - t0], dtype=torch.float64, device="cpu")  # a timing: host, gloo
            dist.all_reduce(elapsed, op=dist.ReduceOp.MAX, group=group)
            out[name].append(tokens * len(batches) / float(elapsed))
    return {"tokens_per_sec": out, "param_sha": {n: parameter_fingerprint(v[0]) for n, v in variants.items()},
            "n_buckets": len(variants["bucketed"][3].buckets)}


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
    model = build_gpt2(cfg["preset"], cfg["vocab_size"], n_positions=cfg["seq"], dropout=0.0, seed=0).to(device)
    batch = _synthetic_batch(rank, cfg["per_rank_batch"], cfg["seq"], cfg["vocab_size"], device)
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

    ``cfg``: ``preset``, ``vocab_size``, ``seq``, ``per_rank_batch``, ``steps``, ``topk_ratio``,
    ``powersgd_rank``, ``batches`` (a list of global batches, dicts of (B, T) tensors; rank r
    takes its rows). Variants: ``none`` (average_gradients), ``topk`` (:class:`TopKReducer`),
    ``powersgd`` (:class:`PowerSGDReducer`), ``torch_powersgd`` (DDP with torch's
    ``powerSGD_hook``, same rank, compression from the first step, no minimum compression rate).

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
        model = build_gpt2(cfg["preset"], cfg["vocab_size"], n_positions=cfg["seq"], dropout=0.0, seed=0).to(device)
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
