"""Worker functions the data-parallel notebook launches (spawned processes import them from here)."""
from __future__ import annotations

import torch
import torch.distributed as dist


def all_reduce_demo(rank: int, world_size: int) -> dict:
    """Each rank starts with ``[rank+1, 10*(rank+1)]`` and all-reduces it (SUM) over the dp group.

    Returns the tensor before and after, to show that every rank ends with the same sum.
    """
    from course.mesh import Mesh

    dp_group = Mesh.build(dp=world_size).dp_group
    before = torch.tensor([rank + 1.0, 10.0 * (rank + 1)], device="cpu")  # a demonstration on the host (gloo)
    after = before.clone()
    dist.all_reduce(after, op=dist.ReduceOp.SUM, group=dp_group)
    return {"before": before.tolist(), "after": after.tolist()}


def gpt2_gradient_demo(rank: int, world_size: int, batch: dict, vocab_size: int) -> dict:
    """Gradients of a tiny GPT-2 on this rank's rows of ``batch``, averaged over the dp group.

    ``batch`` is one global batch (dict of (B, T) tensors, B divisible by world_size);
    rank r takes rows ``r*B/world_size .. (r+1)*B/world_size``. Returns the averaged
    gradients (name -> tensor).
    """
    from course.loss import lm_loss
    from course.mesh import Mesh
    from course.model import build_gpt2
    from course.task import worker_env_quiet
    from data_parallel.gradients import average_gradients

    worker_env_quiet()
    dp_group = Mesh.build(dp=world_size).dp_group
    model = build_gpt2("tiny", vocab_size, dropout=0.0, seed=0)
    per_rank = batch["input_ids"].shape[0] // world_size
    mine = {k: v[rank * per_rank:(rank + 1) * per_rank] for k, v in batch.items()}
    logits = model(input_ids=mine["input_ids"], attention_mask=mine["attention_mask"]).logits
    lm_loss(logits, mine["labels"]).backward()
    average_gradients(model, dp_group)
    return {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}


def gpt2_token_weighted_gradient_demo(rank: int, world_size: int, batch: dict, vocab_size: int) -> dict:
    """The exact data-parallel gradient of the batch's per-token mean loss.

    Each rank sums its shard's token losses, divides by the **global** number of target tokens
    (the ranks' counts all-reduced in the dp group), and the gradients are then all-reduced
    with SUM — not averaged: the division already happened. The result is the gradient of
    the token mean over the whole global batch, whatever the shards' token counts.

    ``batch``: one global batch (dict of (B, T) tensors, B divisible by world_size).
    Returns ``{"grads": {name: tensor}, "tokens": this shard's target tokens, "global_tokens": int}``.
    """
    from course.loss import count_target_tokens, lm_loss
    from course.mesh import Mesh
    from course.model import build_gpt2
    from course.task import worker_env_quiet

    worker_env_quiet()
    dp_group = Mesh.build(dp=world_size).dp_group
    model = build_gpt2("tiny", vocab_size, dropout=0.0, seed=0)
    per_rank = batch["input_ids"].shape[0] // world_size
    mine = {k: v[rank * per_rank:(rank + 1) * per_rank] for k, v in batch.items()}
    tokens = torch.tensor([count_target_tokens(mine["labels"])], dtype=torch.float64, device="cpu")  # a count
    global_tokens = tokens.clone()
    dist.all_reduce(global_tokens, op=dist.ReduceOp.SUM, group=dp_group)
    logits = model(input_ids=mine["input_ids"], attention_mask=mine["attention_mask"]).logits
    (lm_loss(logits, mine["labels"], reduction="sum") / float(global_tokens)).backward()
    for p in model.parameters():
        if p.grad is not None:
            dist.all_reduce(p.grad, op=dist.ReduceOp.SUM, group=dp_group)
    return {"grads": {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None},
            "tokens": int(tokens), "global_tokens": int(global_tokens)}


def dp_throughput_worker(rank: int, world_size: int, batches: list[dict], vocab_size: int, warmup: int,
                         repeats: int = 3) -> list[dict]:
    """Time data-parallel training steps of the tiny GPT-2 on fixed batches, with 1, 2, ...,
    ``world_size`` ranks, the sizes taking turns within every repeat (so a change in the
    machine's load during the measurement touches every size alike).

    One launch of ``world_size`` processes does all the timings: for a window of ``n`` ranks,
    ranks ``0 .. n - 1`` train — each with ``cores // n`` threads, what :mod:`course.launch`
    would give a run of ``n`` processes, so that one rank alone has the whole machine — while
    the others wait at a barrier (which takes no CPU). Every window trains a fresh model on the
    same ``batches`` (each a global batch; rank r of n takes its rows), so the windows do the
    same work. The first ``warmup`` steps of a window are not timed (memory allocation,
    first-call costs).

    Returns:
        rank 0: ``[{"world_size": n, "repeat": k, "seconds": timed seconds, "tokens": target
        tokens of all ranks in the timed steps}, ...]`` (rank 0's clock; the ranks of a window
        wait for each other at every gradient all-reduce, so one clock times the group's step);
        other ranks: ``[]``.
    """
    import os
    import time

    from course.loss import count_target_tokens, lm_loss
    from course.mesh import Mesh
    from course.model import build_gpt2
    from course.task import worker_env_quiet
    from data_parallel.gradients import average_gradients

    worker_env_quiet()
    world = Mesh.build(dp=world_size).dp_group
    groups = {n: dist.new_group(list(range(n))) for n in range(1, world_size + 1)}  # collective: every rank
    threads = torch.get_num_threads()
    timings = []
    for repeat in range(repeats):
        for n in range(1, world_size + 1):
            dist.barrier(group=world)
            if rank < n:
                torch.set_num_threads(max(1, (os.cpu_count() or 1) // n))
                model = build_gpt2("tiny", vocab_size, dropout=0.0, seed=0)
                optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
                per_rank = batches[0]["input_ids"].shape[0] // n
                tokens, start = 0, None
                for step, batch in enumerate(batches):
                    if step == warmup:
                        dist.barrier(group=groups[n])
                        start = time.perf_counter()
                    mine = {k: v[rank * per_rank:(rank + 1) * per_rank] for k, v in batch.items()}
                    optimizer.zero_grad()
                    logits = model(input_ids=mine["input_ids"], attention_mask=mine["attention_mask"]).logits
                    lm_loss(logits, mine["labels"]).backward()
                    average_gradients(model, groups[n])
                    optimizer.step()
                    if step >= warmup:
                        tokens += count_target_tokens(batch["labels"])
                dist.barrier(group=groups[n])
                if rank == 0:
                    timings.append({"world_size": n, "repeat": repeat, "seconds": time.perf_counter() - start,
                                    "tokens": tokens})
                torch.set_num_threads(threads)
    dist.barrier(group=world)
    return timings
