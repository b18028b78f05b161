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
    before = torch.tensor([rank + 1.0, 10.0 * (rank + 1)])
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
