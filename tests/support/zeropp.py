"""The worker of tests/memory/test_quantized_sharding.py: ZeRO++ (memory.zeropp) beside ZeRO-3 (memory.fsdp) and
beside one process without sharding, with plain SGD on the tiny language model of tests/support/memory.py.

SGD (no momentum) keeps the comparison readable: a parameter's distance from ZeRO-3's after k steps is ``lr`` times
the sum of the k gradient differences, nothing rescales it (Adam would divide it by sqrt(v)).
"""
from __future__ import annotations

import torch

from tests.support.memory import N_BLOCK, batch, lm_loss, make_model, shard_of
from tests.support.planting import planting

SGD_LR = 0.1
BLOCK = 16  # elements per quantization block: several blocks per slice, the scales' 4 bytes visible in the bytes


def zeropp_worker(rank: int, world_size: int, node: int, steps: int, planted: str | None = None) -> dict:
    """``steps`` SGD steps of ZeRO-3, of ZeRO++ (qwz, hpz with node-sized groups of ``node`` ranks, qgz) and of
    one unsharded model on the whole batch. Per step: losses (ZeRO++ and ZeRO-3: this rank's shard; unsharded:
    the whole batch), full parameters after the step, ZeRO-3's full mean gradient before it; ZeRO++'s hpZ bytes
    held after the forward and after the backward; the communication of ZeRO++'s steps by group and kind, and
    what the groups are called."""
    from course import collectives
    from course.collectives import CommCounter
    from course.mesh import Mesh
    from memory.fsdp import FullyShardedModel
    from memory.zeropp import ZeroPPModel

    with planting(planted):
        mesh = Mesh.build(dp=world_size)
        node_group, _ = mesh.hybrid_shard_groups(world_size // node)
        plain = make_model()
        plain_opt = torch.optim.SGD(plain.parameters(), lr=SGD_LR)
        three = make_model()
        fsdp = FullyShardedModel(three, three.blocks, group=mesh.dp_group)
        three_opt = torch.optim.SGD(fsdp.shard_parameters(), lr=SGD_LR)
        model = make_model()
        zpp = ZeroPPModel(model, model.blocks, group=mesh.dp_group, options=("qwz", "hpz", "qgz"),
                          hpz_group=node_group, block=BLOCK)
        opt = torch.optim.SGD(zpp.shard_parameters(), lr=SGD_LR)
        out = {"steps": [], "dp_name": collectives.group_name(mesh.dp_group),
               "node_name": collectives.group_name(node_group),
               "padded": {u.name: u.padded for u in zpp.units}, "n_blocks": N_BLOCK}
        counter = CommCounter()
        for step in range(steps):
            ids = batch(step, world_size)
            mine = shard_of(ids, rank)
            rec = {}
            plain_opt.zero_grad()
            loss = lm_loss(plain, ids)
            loss.backward()
            plain_opt.step()
            rec["plain_loss"] = loss.item()
            rec["plain_params"] = {n: p.detach().clone() for n, p in plain.named_parameters()}

            three_opt.zero_grad()
            loss = lm_loss(three, mine)
            loss.backward()
            fsdp.finish_backward()
            rec["zero3_grads"] = fsdp.full_gradients()
            three_opt.step()
            rec["zero3_loss"] = loss.item()
            rec["zero3_params"] = fsdp.full_state()

            opt.zero_grad()
            with counter:
                loss = lm_loss(model, mine)
                rec["secondary_after_forward"] = zpp.held_secondary_bytes()
                loss.backward()
                zpp.finish_backward()
            rec["secondary_after_backward"] = zpp.held_secondary_bytes()
            rec["grads"] = zpp.full_gradients()
            opt.step()
            rec["loss"] = loss.item()
            rec["params"] = zpp.full_state()
            out["steps"].append(rec)
        out["comm"] = {name: counter.summary(group=name) for name in {r.group for r in counter.records}}
        out["comm_records"] = [(r.kind, r.group, r.bytes, str(r.shape)) for r in counter.records[:40]]
        return out
