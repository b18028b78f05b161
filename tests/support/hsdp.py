"""The worker of tests/memory/test_hsdp.py: hybrid sharding (memory.hsdp) on a 2 x 2 mesh of 4 gloo ranks,
and torch's FSDP2 (``fully_shard`` on a 2D ``DeviceMesh``, ``reshard_after_forward=True``) beside it on the
same tiny language model (tests/support/memory.py), data and optimizer."""
from __future__ import annotations

import torch

from tests.support.memory import ADAM, batch, lm_loss, make_model, shard_of


def hsdp_worker(rank: int, world_size: int, replicas: int, steps: int) -> dict:
    """Per step: this rank's loss, the full mean gradients and the parameters after the step, of the course's
    HSDP and of FSDP2; the communication of the course's steps by group and kind; the slice sizes."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    from course.collectives import CommCounter
    from course.mesh import Mesh
    from memory.hsdp import HybridShardedModel

    mesh = Mesh.build(dp=world_size)
    shard_group, replicate_group = mesh.hybrid_shard_groups(replicas)
    model = make_model()
    hsdp = HybridShardedModel(model, model.blocks, shard_group=shard_group, replicate_group=replicate_group)
    opt = torch.optim.Adam(hsdp.shard_parameters(), **ADAM)

    twin = make_model()
    mesh2d = init_device_mesh("cpu", (replicas, world_size // replicas), mesh_dim_names=("dp_replicate", "dp_shard"))
    for block in twin.blocks:
        fully_shard(block, mesh=mesh2d, reshard_after_forward=True)
    fully_shard(twin, mesh=mesh2d, reshard_after_forward=True)
    twin_opt = torch.optim.Adam(twin.parameters(), **ADAM)

    out = {"shard_numel": {u.name: u.shard.numel() for u in hsdp.units},
           "padded": {u.name: u.padded for u in hsdp.units}, "steps": [],
           "fsdp2_placements": [str(p.placements) for p in twin.parameters()][:1]}
    with CommCounter(timed=False) as counter:
        for step in range(steps):
            ids = shard_of(batch(step, world_size), rank)
            opt.zero_grad()
            counter.reset()
            loss = lm_loss(model, ids)
            loss.backward()
            hsdp.finish_backward()
            comm = counter.by_group()
            rec = {"loss": loss.item(), "grads": hsdp.full_gradients(), "comm": comm}
            opt.step()
            rec["params"] = hsdp.full_state()
            twin_opt.zero_grad()
            twin_loss = lm_loss(twin, ids)
            twin_loss.backward()
            rec["fsdp2_loss"] = twin_loss.item()
            rec["fsdp2_grads"] = {n: p.grad.full_tensor().detach().clone() for n, p in twin.named_parameters()}
            twin_opt.step()
            rec["fsdp2_params"] = {n: p.full_tensor().detach().clone() for n, p in twin.named_parameters()}
            out["steps"].append(rec)
    return out
