"""Worker functions the data-parallel notebook launches (spawned processes import them from here).

:func:`gradient_demos` is the one launch of sections 2 and 3 of notebooks/01_data_parallel.ipynb: it runs
:func:`all_reduce_demo`, :func:`gpt2_gradient_demo` and :func:`gpt2_token_weighted_gradient_demo` in the same
two processes, since starting processes that import ``transformers`` costs seconds each time.

The notebook's throughput measurement (world size 1 against 2) is the course's one data-parallel
throughput worker, ``communication.labs.experiments.dp_throughput_worker`` (variant ``average_gradients``).
"""
from __future__ import annotations

import torch
import torch.distributed as dist


def all_reduce_demo(rank: int, world_size: int, dp_group=None) -> dict:
    """Each rank starts with ``[rank+1, 10*(rank+1)]`` and all-reduces it (SUM) over the dp group.

    ``dp_group``: the group to reduce over (None: build the mesh ``dp = world_size`` and take its dp group).
    Returns the tensor before and after, to show that every rank ends with the same sum.
    """
    from course.mesh import Mesh

    dp_group = dp_group if dp_group is not None else Mesh.build(dp=world_size).dp_group
    before = torch.tensor([rank + 1.0, 10.0 * (rank + 1)], device="cpu")  # a demonstration on the host (gloo)
    after = before.clone()
    dist.all_reduce(after, op=dist.ReduceOp.SUM, group=dp_group)
    return {"before": before.tolist(), "after": after.tolist()}


def gpt2_gradient_demo(rank: int, world_size: int, batch: dict, vocab_size: int, dp_group=None) -> dict:
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
    dp_group = dp_group if dp_group is not None else Mesh.build(dp=world_size).dp_group
    model = build_gpt2("tiny", vocab_size, dropout=0.0, seed=0)
    per_rank = batch["input_ids"].shape[0] // world_size
    mine = {k: v[rank * per_rank:(rank + 1) * per_rank] for k, v in batch.items()}
    logits = model(input_ids=mine["input_ids"], attention_mask=mine["attention_mask"]).logits
    lm_loss(logits, mine["labels"]).backward()
    average_gradients(model, dp_group)
    return {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}


def gpt2_token_weighted_gradient_demo(rank: int, world_size: int, batch: dict, vocab_size: int, dp_group=None) -> dict:
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
    dp_group = dp_group if dp_group is not None else Mesh.build(dp=world_size).dp_group
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


def one_process_gradients(batch: dict, vocab_size: int, world_size: int) -> dict:
    """The references of the demonstrations, computed by one process with the same tiny GPT-2 (seed 0).

    Returns ``{"mean_of_shard_means": grads of the mean over the ``world_size`` equal row blocks of each block's
    token-mean loss, "token_mean": grads of the whole batch's token-mean loss, "shard_tokens": [target tokens
    per block]}`` (grads: name -> tensor).
    """
    from course.loss import count_target_tokens, lm_loss
    from course.model import build_gpt2

    def grads(loss_of) -> dict:
        model = build_gpt2("tiny", vocab_size, dropout=0.0, seed=0)
        loss_of(model).backward()
        return {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}

    def loss(model, rows: dict):
        return lm_loss(model(input_ids=rows["input_ids"], attention_mask=rows["attention_mask"]).logits, rows["labels"])

    per_rank = batch["input_ids"].shape[0] // world_size
    blocks = [{k: v[r * per_rank:(r + 1) * per_rank] for k, v in batch.items()} for r in range(world_size)]
    return {"mean_of_shard_means": grads(lambda m: sum(loss(m, b) for b in blocks) / world_size),
            "token_mean": grads(lambda m: loss(m, batch)),
            "shard_tokens": [count_target_tokens(b["labels"]) for b in blocks]}


def gradient_demos(rank: int, world_size: int, batch: dict, vocab_size: int, then=None, then_args: tuple = ()) -> dict:
    """The demonstrations in one launch, over one mesh's dp group (``dp = world_size``).

    Args:
        batch: one global batch (dict of (B, T) tensors, B divisible by world_size).
        then: optional, a module-level worker run afterwards in the same processes as
            ``then(rank, world_size, *then_args)`` (the notebook passes the course's data-parallel throughput
            measurement, so that its processes are not started again).

    Returns:
        ``{"all_reduce": all_reduce_demo's, "averaged": gpt2_gradient_demo's, "exact":
        gpt2_token_weighted_gradient_demo's, "then": then's result or None}``, and on rank 0 also
        ``"one_process"`` (:func:`one_process_gradients`).
    """
    from course.mesh import Mesh

    dp_group = Mesh.build(dp=world_size).dp_group
    out = {"all_reduce": all_reduce_demo(rank, world_size, dp_group),
           "averaged": gpt2_gradient_demo(rank, world_size, batch, vocab_size, dp_group),
           "exact": gpt2_token_weighted_gradient_demo(rank, world_size, batch, vocab_size, dp_group)}
    if rank == 0:
        out["one_process"] = one_process_gradients(batch, vocab_size, world_size)
    out["then"] = None
    if then is not None:
        dist.barrier(group=dp_group)  # rank 0's references done: what follows starts on every rank together
        out["then"] = then(rank, world_size, *then_args)
    return out
