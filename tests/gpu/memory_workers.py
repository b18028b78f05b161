"""Workers of the GPU tier for the memory part (ZeRO, FSDP checkpoints, bf16 with activation
checkpointing); see :mod:`tests.gpu.workers`."""
from __future__ import annotations

import torch

from tests.gpu.workers import _device, _quiet, batch, gpt2, grads, tokens


def zero_worker(rank: int, world_size: int, zero: int, precision: str = "fp32", checkpointing: bool = False,
                dropout: float | None = None) -> dict:
    """Three steps of ``ShardedStep`` (ZeRO ``zero``); the losses and every full parameter afterwards.
    ``dropout``: default 0.1 with ``checkpointing`` (the recomputation replays the masks), else 0."""
    from course.mesh import Mesh
    from memory.training import ShardedStep

    _quiet()
    device = _device()
    group = Mesh.build(dp=world_size).dp_group
    if dropout is None:
        dropout = 0.1 if checkpointing else 0.0
    model = gpt2(dropout=dropout).to(device)
    step = ShardedStep(model, zero, group, torch.optim.AdamW, activation_checkpointing=checkpointing,
                       precision=precision, lr=1e-3)
    losses = []
    for i in range(3):
        torch.manual_seed(100 + i)  # the same dropout masks with and without checkpointing
        losses.append(step.train_step(batch(tokens(2 * world_size, seed=i)[2 * rank:2 * rank + 2], device), device).loss)
    with step.summon_full_params():
        params = {n: p.detach().cpu().clone() for n, p in model.named_parameters()}
    # every tensor of the model state (torch.optim keeps Adam's 0-dim step counter on the host)
    devices = {str(t.device) for ts in step.category_tensors().values() for t in ts if t.dim() > 0}
    return {"losses": losses, "params": params, "state_devices": sorted(devices)}


def fsdp_checkpoint_worker(rank: int, world_size: int, folder: str, resume_at: int, steps: int) -> dict:
    """ZeRO-3 for ``steps`` steps; with ``resume_at``: write a DCP checkpoint of the shards and the AdamW
    state after that many steps, build everything anew, load it and go on. Losses of every step."""
    from course.checkpoint import load_checkpoint, save_checkpoint
    from course.mesh import Mesh
    from memory.training import ShardedStep

    _quiet()
    device = _device()
    group = Mesh.build(dp=world_size).dp_group

    def build():
        model = gpt2().to(device)
        return model, ShardedStep(model, 3, group, torch.optim.AdamW, lr=1e-3)

    def state(sharded):
        shards = sharded.fsdp.shard_parameters()
        optim = sharded.optimizer.state
        return {f"rank{rank}": {f"unit{i}": {"shard": s.detach(), **{k: optim[s][k] for k in ("step", "exp_avg",
                                                                                             "exp_avg_sq")}}
                                for i, s in enumerate(shards)}}

    model, sharded = build()
    losses = []
    for i in range(steps):
        if i == resume_at:
            save_checkpoint(folder, i, state(sharded), rank=rank, group=group)
            model, sharded = build()
            template = {f"rank{rank}": {f"unit{j}": {"shard": torch.zeros_like(s), "step": torch.tensor(0.0),
                                                     "exp_avg": torch.zeros_like(s), "exp_avg_sq": torch.zeros_like(s)}
                                        for j, s in enumerate(sharded.fsdp.shard_parameters())}}
            loaded = load_checkpoint(f"{folder}/step{i:08d}", template, group=group)[f"rank{rank}"]
            with torch.no_grad():
                for j, s in enumerate(sharded.fsdp.shard_parameters()):
                    s.copy_(loaded[f"unit{j}"]["shard"])
                    sharded.optimizer.state[s] = {k: loaded[f"unit{j}"][k] for k in ("step", "exp_avg", "exp_avg_sq")}
        losses.append(sharded.train_step(batch(tokens(2 * world_size, seed=i)[2 * rank:2 * rank + 2], device),
                                         device).loss)
    return {"losses": losses, "shard_device": str(sharded.fsdp.shard_parameters()[0].device)}


def recomputation_on_one_device(device: str) -> dict:
    """In this process: GPT-2 with dropout under bf16 autocast on ``device``, checkpointed and plain;
    each block's MLP output in the forward pass and in its recomputation, the gradients of both."""
    from memory.checkpointing import apply_activation_checkpointing

    def run(checkpointing):
        model = gpt2(dropout=0.1).to(device).train()
        calls: dict = {}
        for i, block in enumerate(model.transformer.h):
            block.mlp.register_forward_hook(lambda m, a, out, i=i: calls.setdefault(i, []).append(out.detach().clone()))
        if checkpointing:
            apply_activation_checkpointing(model.transformer.h)
        b = batch(tokens(4), device)
        torch.manual_seed(7)
        with torch.autocast(torch.device(device).type, dtype=torch.bfloat16):
            logits = model(input_ids=b["input_ids"], attention_mask=b["attention_mask"]).logits
            loss = torch.nn.functional.cross_entropy(logits[:, :-1].flatten(0, 1).float(), b["labels"][:, 1:].flatten())
        loss.backward()
        return {"loss": float(loss.detach()), "grads": grads(model),
                "calls": {i: [c.cpu() for c in v] for i, v in calls.items()}}

    return {"checkpointed": run(True), "plain": run(False)}
