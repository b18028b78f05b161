"""Helpers shared by the memory (ZeRO / FSDP / checkpointing) tests: a tiny language model whose
parameter count is odd (so every dp size needs padding), its data, and the per-rank workers.

The reference everywhere is one process that computes the mean loss of the dp ranks' shards of a
global batch (the data-parallel gradient) and steps ``torch.optim.Adam`` on the whole model.
"""
from __future__ import annotations

import torch
from torch import nn

VOCAB, DIM, SEQ, PER_RANK, N_BLOCK = 37, 12, 6, 2, 2
LR = 0.05
ADAM = dict(lr=LR, betas=(0.8, 0.9), weight_decay=0.1)  # L2 weight decay: gradient scale matters
# The tolerance of the memory tests' gradients and parameters (torch.allclose: |got - want| <= atol + rtol |want|).
# Gradients: float32 sums of at most a few hundred terms in another order differ by a few 2^-24 ~ 6e-8 relative to
# the terms (a 2^-24 x log2(n) bound for a tree, x n for a chain: below 1e-5 relative for the gradients' sizes here).
# Parameters after 3 Adam steps: Adam divides each update by the root of the squared-gradient average, so a gradient
# rounding difference dg moves the update by about lr x dg / sqrt(v) — amplified where a gradient is near zero. This
# model's trajectory is far from that: its smallest |gradient + weight decay x w| over the steps is ~5e-6, against
# rounding differences ~1e-12 in such small coordinates. Rather than trust a bound, the trajectory is measured against
# exact arithmetic on every machine: the float32 reference's distance from the float64 one, in units of this
# tolerance, is at most 0.2 at every step for dp 2 and 4 (tests/memory/test_tolerance.py keeps it below 0.5), and
# any correct float32 implementation's rounding (other sums, other SIMD kernels) is of that same size.
TOL = dict(rtol=1e-5, atol=1e-6)


class Block(nn.Module):
    def __init__(self, dim, dropout=0.0):
        super().__init__()
        self.ln = nn.LayerNorm(dim)
        self.up, self.down = nn.Linear(dim, 3 * dim), nn.Linear(3 * dim, dim)
        self.drop = nn.Dropout(dropout)

    def forward(self, x):
        return x + self.drop(self.down(torch.nn.functional.gelu(self.up(self.ln(x)))))


class TinyLM(nn.Module):
    """Embedding (tied with the output head), ``N_BLOCK`` residual MLP blocks, final LayerNorm, and a
    ``scale`` vector of odd length: 2347 parameters, which no dp size > 1 divides."""

    def __init__(self, dropout=0.0):
        super().__init__()
        self.wte = nn.Embedding(VOCAB, DIM)
        self.blocks = nn.ModuleList(Block(DIM, dropout) for _ in range(N_BLOCK))
        self.ln_f = nn.LayerNorm(DIM)
        self.head = nn.Linear(DIM, VOCAB, bias=False)
        self.head.weight = self.wte.weight  # tied
        self.scale = nn.Parameter(torch.ones(7))

    def forward(self, ids):
        x = self.wte(ids)
        for block in self.blocks:
            x = block(x)
        logits = self.head(self.ln_f(x))
        return logits * self.scale.mean()


def make_model(dropout=0.0) -> TinyLM:
    torch.manual_seed(0)
    return TinyLM(dropout)


def batch(step: int, world_size: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(100 + step)
    return torch.randint(0, VOCAB, (world_size * PER_RANK, SEQ), generator=g)


def lm_loss(model, ids):
    logits = model(ids[:, :-1])
    return nn.functional.cross_entropy(logits.reshape(-1, VOCAB), ids[:, 1:].reshape(-1))


def shard_of(ids, rank):
    return ids[rank * PER_RANK:(rank + 1) * PER_RANK]


def flat(tensors) -> torch.Tensor:
    return torch.cat([t.detach().reshape(-1) for t in tensors])


def reference_run(world_size: int, steps: int, dtype: torch.dtype = torch.float32, first: int = 0):
    """Plain data parallelism in one process: per step, the flat mean gradient (before the step)
    and the flat parameters after ``torch.optim.Adam``'s step (unique parameters, in order); in
    ``dtype`` (float64: the trajectory of exact arithmetic, to within 2^-53). The ranks' shards are
    ``first .. first + world_size - 1`` of each step's batch (those of a dp group of ranks from ``first``)."""
    model = make_model().to(dtype)
    opt = torch.optim.Adam(model.parameters(), **ADAM)
    grads, params = [], []
    for step in range(steps):
        ids = batch(step, first + world_size)
        opt.zero_grad()
        loss = sum(lm_loss(model, shard_of(ids, r)) for r in range(first, first + world_size)) / world_size
        loss.backward()
        grads.append(flat(p.grad for p in model.parameters()))
        opt.step()
        params.append(flat(model.parameters()))
    return grads, params


def zero_worker(rank, world_size, stage, steps, planted=None):
    """ZeRO-``stage`` (1 or 2) for ``steps`` steps; per step: this rank's slice gradient, the
    flat parameters, the optimizer state's element count, whether full gradients are still held;
    stage 1 also every parameter's gradient after the reduction (flat, None as zeros) and the parameters
    of ``torch.distributed.optim.ZeroRedundancyOptimizer`` run beside it. ``planted``: with a planted
    wrong solution (:mod:`tests.support.planting`)."""
    from tests.support.planting import planting

    with planting(planted):
        return _zero_steps(rank, world_size, stage, steps)


def _zero_steps(rank, world_size, stage, steps):
    import torch.distributed as dist

    from memory.zero import ZeroOptimizer

    model = make_model()
    opt = ZeroOptimizer(model.parameters(), torch.optim.Adam, group=None, stage=stage, **ADAM)
    if stage == 1:  # torch.distributed.optim takes seconds to import
        from torch.distributed.optim import ZeroRedundancyOptimizer

        twin = make_model()
        zro = ZeroRedundancyOptimizer(twin.parameters(), optimizer_class=torch.optim.Adam, **ADAM)
    out = {"start": opt.start, "end": opt.end, "padded": opt.padded, "steps": []}
    for step in range(steps):
        ids = shard_of(batch(step, world_size), rank)
        opt.zero_grad()
        lm_loss(model, ids).backward()
        opt.reduce_gradients()
        rec = {"shard_grad": opt.shard.grad.detach().clone(),
               "shard_grad_storage_bytes": opt.shard.grad.untyped_storage().nbytes(),
               "full_grads_held": sum(p.grad.numel() for p in opt.params if p.grad is not None)}
        if stage == 1:
            rec["param_grads"] = flat(torch.zeros_like(p) if p.grad is None else p.grad for p in opt.params)
        opt.step()
        rec["params"] = flat(opt.params)
        rec["state_numel"] = sum(t.numel() for t in opt.state_tensors() if t.dim() > 0)
        if stage == 1:
            zro.zero_grad()
            lm_loss(twin, ids).backward()
            for p in twin.parameters():  # the reference's own averaging: not a student's a5_1_2
                dist.all_reduce(p.grad)
                p.grad /= world_size
            zro.step()
            rec["zro_params"] = flat(twin.parameters())
        out["steps"].append(rec)
    if world_size == 4:
        out["in_groups"] = _zero_in_groups(rank, stage, steps)
    return out


# Four ranks as two dp groups of two (pp 2 x dp 2: ranks {0, 1} and {2, 3}), rank r on shard r of the 4-rank batch:
# group {2g, 2g + 1} is the 2-rank data parallelism of shards 2g and 2g + 1 (reference_run(2, ..., first=2g)). A
# collective over every rank instead of the given group is the same thing when the group is the world; here it mixes
# the other group's gradients in.
GROUPS_MESH = dict(pp=2, dp=2)


def _zero_in_groups(rank, stage, steps):
    """ZeRO-``stage`` over this rank's dp group of :data:`GROUPS_MESH`: per step the slice gradient and the flat
    parameters after the step."""
    from course.mesh import Mesh
    from memory.zero import ZeroOptimizer

    model = make_model()
    opt = ZeroOptimizer(model.parameters(), torch.optim.Adam, group=Mesh.build(**GROUPS_MESH).dp_group, stage=stage,
                        **ADAM)
    out = []
    for step in range(steps):
        opt.zero_grad()
        lm_loss(model, shard_of(batch(step, 4), rank)).backward()
        opt.reduce_gradients()
        rec = {"shard_grad": opt.shard.grad.detach().clone()}
        opt.step()
        rec["params"] = flat(opt.params)
        out.append(rec)
    return out


def fsdp_worker(rank, world_size, steps, with_fsdp2, planted=None):
    """ZeRO-3 (memory.fsdp) for ``steps`` steps; per step: the full mean gradients and full parameters
    (gathered), the full-parameter bytes held after the step and the most held at once during it, the
    size of the slices; with ``with_fsdp2``, the parameters of torch's FSDP2 (``fully_shard``) beside it, and
    (``"accumulation"``) the results of :func:`fsdp_accumulation_worker` in the same launch. ``planted``: with a
    planted wrong solution (:mod:`tests.support.planting`)."""
    from tests.support.planting import planting

    with planting(planted):
        return _fsdp_steps(rank, world_size, steps, with_fsdp2)


def _fsdp_steps(rank, world_size, steps, with_fsdp2):
    from memory.fsdp import FullyShardedModel

    model = make_model()
    fsdp = FullyShardedModel(model, model.blocks, group=None)
    opt = torch.optim.Adam(fsdp.shard_parameters(), **ADAM)
    peak = {"bytes": 0}

    def watch(*_):
        peak["bytes"] = max(peak["bytes"], fsdp.held_full_bytes())

    for module in model.modules():  # after the unit's own hooks: sees what is held while it computes
        module.register_forward_hook(watch)
    for p in model.parameters():
        p.register_hook(lambda g: watch() or g)
    if with_fsdp2:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        twin = make_model()
        mesh = init_device_mesh("cpu", (world_size,))
        for block in twin.blocks:
            fully_shard(block, mesh=mesh)
        fully_shard(twin, mesh=mesh)
        twin_opt = torch.optim.Adam(twin.parameters(), **ADAM)
    unit_bytes = {u.name: u.full_bytes for u in fsdp.units}
    out = {"unit_bytes": unit_bytes, "shard_numel": [u.shard.numel() for u in fsdp.units], "steps": []}
    for step in range(steps):
        ids = shard_of(batch(step, world_size), rank)
        opt.zero_grad()
        peak["bytes"] = 0
        lm_loss(model, ids).backward()
        fsdp.finish_backward()
        rec = {"grads": fsdp.full_gradients(), "peak_full_bytes": peak["bytes"],
               "held_after_backward": fsdp.held_full_bytes(),
               "full_grads_held": sum(p.grad.numel() for p in model.parameters() if p.grad is not None)}
        opt.step()
        rec["params"] = fsdp.full_state()
        if with_fsdp2:
            twin_opt.zero_grad()
            lm_loss(twin, ids).backward()
            twin_opt.step()
            rec["fsdp2_params"] = {n: p.full_tensor().detach().clone() for n, p in twin.named_parameters()}
        out["steps"].append(rec)
    if with_fsdp2:
        out["accumulation"] = fsdp_accumulation_worker(rank, world_size)
    if world_size == 4:
        out["in_groups"] = _fsdp_in_groups(rank, steps)
    return out


def _fsdp_in_groups(rank, steps):
    """ZeRO-3 over this rank's dp group of :data:`GROUPS_MESH`: per step the full mean gradients and the full
    parameters after the step."""
    from course.mesh import Mesh
    from memory.fsdp import FullyShardedModel

    model = make_model()
    fsdp = FullyShardedModel(model, model.blocks, group=Mesh.build(**GROUPS_MESH).dp_group)
    opt = torch.optim.Adam(fsdp.shard_parameters(), **ADAM)
    out = []
    for step in range(steps):
        opt.zero_grad()
        lm_loss(model, shard_of(batch(step, 4), rank)).backward()
        fsdp.finish_backward()
        rec = {"grads": fsdp.full_gradients()}
        opt.step()
        rec["params"] = fsdp.full_state()
        out.append(rec)
    return out


def fsdp_accumulation_worker(rank, world_size):
    """ZeRO-3, one optimizer step after two micro-steps (backward on each half of this rank's shard, the
    loss halved): the full mean gradients before the step and the full parameters after it."""
    from memory.fsdp import FullyShardedModel

    model = make_model()
    fsdp = FullyShardedModel(model, model.blocks, group=None)
    opt = torch.optim.Adam(fsdp.shard_parameters(), **ADAM)
    ids = shard_of(batch(0, world_size), rank)
    opt.zero_grad()
    half = PER_RANK // 2
    for micro in (ids[:half], ids[half:]):
        (lm_loss(model, micro) / 2).backward()
        fsdp.finish_backward()
    grads = fsdp.full_gradients()
    opt.step()
    return {"grads": grads, "params": fsdp.full_state()}


def reference_named_run(world_size: int, steps: int, first: int = 0):
    """As :func:`reference_run`, by parameter name: per step ``({name: grad}, {name: param after step})``."""
    model = make_model()
    opt = torch.optim.Adam(model.parameters(), **ADAM)
    out = []
    for step in range(steps):
        ids = batch(step, first + world_size)
        opt.zero_grad()
        (sum(lm_loss(model, shard_of(ids, r)) for r in range(first, first + world_size)) / world_size).backward()
        grads = {n: p.grad.clone() for n, p in model.named_parameters()}
        opt.step()
        out.append((grads, {n: p.detach().clone() for n, p in model.named_parameters()}))
    return out
