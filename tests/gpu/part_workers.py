"""Workers of the GPU tier for context parallelism, mixture of experts, HSDP and asynchronous checkpoints
(issue 38, item 10). Each reuses the CPU tests' inputs and helpers, places what it computes on the rank's device
(``course.launch.context().device``: a GPU with NCCL, the CPU with gloo) and returns host copies
(:func:`tests.gpu.support.host`), so one worker runs on both and the results compare."""
from __future__ import annotations

import torch

from tests.gpu.support import host
from tests.gpu.workers import _device, _quiet


# ---- context parallelism: ring attention and Ulysses ----------------------------------------------------------

def attention_worker(rank: int, world_size: int, kind: str, cp: int) -> dict:
    """``kind`` (``"ring"`` or ``"ulysses"``) attention over the cp groups of a ``world_size / cp`` x ``cp`` mesh,
    forward and backward, for each layout and mask: ``{case: {"out", "grads" (q, k, v), "ref", "ref_grads"}}``
    (this rank's shards; the reference is ``scaled_dot_product_attention`` over the whole sequence on the host).
    The inputs are tests/context_parallel/workers.py's (drawn on the host from one seed)."""
    from context_parallel import SequenceLayout, ring_attention, ulysses_attention
    from course.collectives import group_rank
    from course.mesh import Mesh
    from tests.context_parallel.workers import BLOCK, GivenLayout, global_inputs, reference

    _quiet()
    device = _device()
    group = Mesh.build(dp=world_size // cp, cp=cp).cp_group
    r = group_rank(group)
    cases = [("contiguous", True), ("contiguous", False), ("zigzag", True)]
    out = {}
    for layout_kind, causal in cases:
        if kind == "ring":
            q, k, v, grad = global_inputs()
            layout = SequenceLayout(layout_kind, cp, q.size(2))
        else:  # 4 heads: divisible by cp = 2 and 4
            q, k, v, grad = global_inputs((2, 4, 24, 8), seed=1)
            layout = GivenLayout(layout_kind, cp, q.size(2))
        ref, ref_grads = reference(q, k, v, grad, causal)
        leaves = [layout.shard(t, 2, r).to(device).requires_grad_(True) for t in (q, k, v)]
        if kind == "ring":
            y = ring_attention(*leaves, group=group, layout=layout, causal=causal, block_size=BLOCK)
        else:
            y = ulysses_attention(*leaves, group=group, causal=causal,
                                  layout=None if layout_kind == "contiguous" else layout)
        y.backward(layout.shard(grad, 2, r).to(device))
        out[f"{layout_kind}-{'causal' if causal else 'full'}"] = {
            "out": host(y), "grads": [host(t.grad) for t in leaves], "device": str(y.device),
            "ref": layout.shard(ref, 2, r), "ref_grads": [layout.shard(g, 2, r) for g in ref_grads]}
    return out


# ---- mixture of experts: the expert-parallel all-to-all with uneven and zero splits ---------------------------

def expert_parallel_worker(rank: int, world_size: int, ep_sizes: list) -> dict:
    """tests/moe/support.py's expert-parallel cases (uneven token counts, an expert without tokens, every token to
    one expert, capacity drops, a rank without tokens) at each ep of ``ep_sizes`` (dp = ``world_size``), on the
    rank's device: ``{(ep, case): {"out", "x_grad", "router", "experts", "ep_rank", "device"}}``."""
    from course.mesh import Mesh
    from moe.layer import MoELayer
    from tests.moe.support import EP_CASES, HIDDEN, ep_config, grads_of, make_layer, tokens, upstream

    _quiet()
    device = _device()
    out = {}
    for ep in ep_sizes:
        mesh = Mesh.build(dp=world_size, ep=ep)
        for case in EP_CASES:
            name, router, counts = case[0], case[2], case[3]
            config = ep_config(case)
            full = make_layer(config, router=router)
            layer = MoELayer(HIDDEN, config, full.experts.shard(mesh.ep_rank, ep), group=mesh.ep_group)
            with torch.no_grad():
                layer.router.weight.copy_(full.router.weight)
            layer.to(device)
            x = tokens(rank, counts[rank]).to(device).requires_grad_(True)
            y = layer(x).output  # tests/moe/support.py's layer_loss, with its fixed upstream gradient on the device
            ((y * upstream(rank, x.shape[0]).to(device)).sum() + layer.router_loss()).backward()
            out[(ep, name)] = {"out": host(y), "x_grad": host(x.grad), "router": host(layer.router.weight.grad),
                               "experts": host(grads_of(layer.experts)), "ep_rank": mesh.ep_rank,
                               "device": str(y.device)}
    return out


# ---- HSDP ----------------------------------------------------------------------------------------------------

def hsdp_worker(rank: int, world_size: int, replicas: int, steps: int) -> dict:
    """The course's hybrid sharding (``replicas`` x ``world_size / replicas``) on tests/support/memory.py's tiny
    language model, data and Adam, on the rank's device: per step the loss, the full mean gradients and the
    parameters after the step; the device of the shards."""
    from course.mesh import Mesh
    from memory.hsdp import HybridShardedModel
    from tests.support.memory import ADAM, batch, lm_loss, make_model, shard_of

    _quiet()
    device = _device()
    shard_group, replicate_group = Mesh.build(dp=world_size).hybrid_shard_groups(replicas)
    model = make_model().to(device)
    hsdp = HybridShardedModel(model, model.blocks, shard_group=shard_group, replicate_group=replicate_group)
    opt = torch.optim.Adam(hsdp.shard_parameters(), **ADAM)
    out = {"steps": [], "shard_devices": sorted({str(s.device) for s in hsdp.shard_parameters()})}
    for step in range(steps):
        ids = shard_of(batch(step, world_size), rank).to(device)
        opt.zero_grad()
        loss = lm_loss(model, ids)
        loss.backward()
        hsdp.finish_backward()
        rec = {"loss": loss.item(), "grads": host(hsdp.full_gradients())}
        opt.step()
        rec["params"] = host(hsdp.full_state())
        out["steps"].append(rec)
    return out


# ---- asynchronous checkpoints ----------------------------------------------------------------------------------

def async_checkpoint_worker(rank: int, world_size: int, root: str) -> dict:
    """Weights on the rank's device: step 1 saved synchronously, step 2 asynchronously (its own gloo group), the
    weights changed while it is written, then it is waited for and resumed into tensors on the device. Returns what
    was loaded (host copies), the loaded tensors' device and the checkpoint ``latest`` names."""
    from course.checkpoint import (checkpoint_group, latest_checkpoint, load_checkpoint, save_checkpoint,
                                   save_checkpoint_async)

    _quiet()
    device = _device()

    def state(value: float) -> dict:
        g = torch.Generator().manual_seed(rank)
        return {f"own{rank}": (torch.randn(4096, generator=g) + value).to(device),
                "shared": torch.full((1024, 4), value, device=device),
                "progress": {f"rank{rank}": {"steps": int(value)}}}

    save_group = checkpoint_group(None)
    save_checkpoint(root, 1, state(1.0), rank=rank)
    weights = state(2.0)
    pending = save_checkpoint_async(root, 2, weights, rank=rank, save_group=save_group)
    for t in (weights[f"own{rank}"], weights["shared"]):
        t.add_(100.0)  # the next steps change the weights while the files are written
    folder = pending.wait()
    template = {k: torch.zeros_like(v) if torch.is_tensor(v) else v for k, v in state(0.0).items()}
    loaded = load_checkpoint(folder, template)
    return {"latest": latest_checkpoint(root).name, "folder": folder.name, "device": str(loaded["shared"].device),
            "own": host(loaded[f"own{rank}"]), "expected_own": host(state(2.0)[f"own{rank}"]),
            "shared": host(loaded["shared"]), "steps": loaded["progress"][f"rank{rank}"]["steps"]}
