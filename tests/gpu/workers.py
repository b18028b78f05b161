"""Workers of the GPU tier (spawned ranks import them from here). Each builds the same model and data
on every device (seeded, drawn on the host), runs one part of the course on the rank's device
(``course.launch.context().device``: a GPU with NCCL, or the CPU with gloo) and returns host copies
of what it computed, for ``tests.gpu.support.assert_same``."""
from __future__ import annotations

import torch

VOCAB, SEQ = 97, 16


def _quiet():
    from course.task import worker_env_quiet

    worker_env_quiet()


def _device():
    from course.launch import context

    return context().device


def gpt2(n_layer: int = 4, dropout: float = 0.0, n_embd: int = 32, n_head: int = 4, seed: int = 0):
    from course.model import build_gpt2

    model = build_gpt2("tiny", VOCAB, n_positions=SEQ, dropout=dropout, seed=seed, n_layer=n_layer, n_embd=n_embd,
                       n_head=n_head)
    model.config.use_cache = False
    return model


def tokens(rows: int, seed: int = 1) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, VOCAB, (rows, SEQ), generator=g, device="cpu")


def batch(ids: torch.Tensor, device) -> dict:
    return {"input_ids": ids.to(device), "attention_mask": torch.ones_like(ids).to(device), "labels": ids.to(device)}


def grads(model) -> dict:
    return {n: p.grad.detach().cpu() for n, p in model.named_parameters() if p.grad is not None}


# ---- launcher, epoch runner, data parallel ---------------------------------------------------------


def group_worker(rank: int, world_size: int) -> dict:
    """What the launcher made: the device, the group's back-ends; a host and a device all-reduce in it."""
    import torch.distributed as dist

    from course.launch import context

    ctx = context()
    host_sum = torch.tensor([rank + 1.0], device="cpu")
    dist.all_reduce(host_sum)  # gloo
    device_sum = torch.tensor([rank + 1.0], device=ctx.device)
    dist.all_reduce(device_sum)  # NCCL on a GPU
    return {"device": str(ctx.device), "local_rank": ctx.local_rank, "group_backend": ctx.group_backend,
            "backend": ctx.backend, "dist_backend": str(dist.get_backend()),
            "host_sum": float(host_sum), "device_sum": float(device_sum.cpu())}


def data_parallel_worker(rank: int, world_size: int) -> dict:
    """average_gradients, the steps every rank can take (a host count), the validation loss shared out."""
    from course.epoch_runner import evaluate_loss
    from course.loss import model_loss
    from course.mesh import Mesh
    from data_parallel import average_gradients
    from data_parallel.training import common_steps

    _quiet()
    device = _device()
    mesh = Mesh.build(dp=world_size)
    model = gpt2().to(device)
    ids = tokens(2 * world_size)[2 * rank:2 * rank + 2]
    model_loss(model, batch(ids, device)).backward()
    average_gradients(model, mesh.dp_group)
    steps = common_steps(10 + rank, None, mesh.dp_group)
    validation = [batch(tokens(3, seed=50 + rank), device)]
    val_loss = evaluate_loss(model, validation, device, group=mesh.dp_group)
    return {"grads": grads(model), "steps": steps, "validation_loss": val_loss}


# ---- pipeline ----------------------------------------------------------------------------------------


def pipeline_worker(rank: int, world_size: int, schedule: str, virtual_stages: int) -> dict:
    """One step of ``schedule`` over GPT-2 chunks on this rank's device; gradients, losses, the timer."""
    import torch.nn.functional as F

    from course.mesh import Mesh
    from pipeline.gpt2_stages import TiedGradients, gpt2_chunks
    from pipeline.schedules import SCHEDULES, schedule_actions
    from pipeline.stage_runner import StageRunner

    _quiet()
    device = _device()
    mesh = Mesh.build(pp=world_size)
    placement = SCHEDULES[schedule].placement  # "v": two chunks, rank 0 holds the first and the last stage
    virtual_stages = SCHEDULES[schedule].chunks_per_rank(virtual_stages)
    model = gpt2(n_layer=2 * world_size * virtual_stages)
    chunks, tied = gpt2_chunks(model, mesh.stage, world_size, virtual_stages, placement=placement)
    m = 2 * world_size
    ids = tokens(2 * m)
    inputs, targets = list(ids.split(2)), [t.to(device) for t in tokens(2 * m, seed=2).split(2)]

    def loss_fn(logits, target):
        return F.cross_entropy(logits.flatten(0, 1), target.flatten()) / m

    runner = StageRunner([c.to(device) for c in chunks], device, loss_fn=loss_fn, group=mesh.pp_group,
                         placement=placement)
    result = runner.run(schedule_actions(schedule, mesh.stage, world_size, m, virtual_stages),
                        inputs if runner.is_first else None, targets if runner.is_last else None)
    TiedGradients(mesh.embedding_group)(tied)
    held = {id(p) for c in chunks for p in c.parameters()}
    return {"grads": {n: p.grad.detach().cpu() for n, p in model.named_parameters()
                      if id(p) in held and p.grad is not None},
            "losses": dict(result.losses), "timer": result.timer, "events": len(result.events)}


# ---- tensor parallel ---------------------------------------------------------------------------------


def tensor_parallel_worker(rank: int, world_size: int, sequence_parallel: bool) -> dict:
    from course.mesh import Mesh
    from tensor_parallel.gpt2 import TensorParallelGPT2

    _quiet()
    device = _device()
    mesh = Mesh.build(tp=world_size)
    model = TensorParallelGPT2(gpt2(n_embd=64, n_head=8), sequence_parallel=sequence_parallel,
                               group=mesh.tp_group).to(device)
    b = batch(tokens(4), device)
    out = model(b["input_ids"], b["attention_mask"], b["labels"])
    out.loss.backward()
    model.sync_grads()
    return {"loss": float(out.loss.detach()), "logits": model.gather_logits(out.logits.detach()).cpu(),
            "grads": grads(model)}


# ---- communication -----------------------------------------------------------------------------------


def all_reduce_worker(rank: int, world_size: int, algorithm: str) -> dict:
    """The ring or recursive-doubling all-reduce of a device tensor, and dist.all_reduce of the same."""
    import torch.distributed as dist

    from communication import ring_all_reduce, tree_all_reduce

    device = _device()
    g = torch.Generator().manual_seed(10 + rank)
    x = torch.randn(1000 + 3, generator=g, device="cpu").to(device)  # not divisible by p: uneven chunks
    want = x.clone()
    dist.all_reduce(want)
    {"ring": ring_all_reduce, "tree": tree_all_reduce}[algorithm](x)
    return {"result": x.cpu(), "dist_all_reduce": want.cpu(), "device": str(x.device)}


def reducer_worker(rank: int, world_size: int, kind: str) -> dict:
    """Two steps of data parallelism with the bucketed, top-k or PowerSGD gradient synchronisation."""
    from communication.buckets import BucketedReducer
    from communication.compression import PowerSGDReducer, TopKReducer
    from course.loss import model_loss
    from course.mesh import Mesh

    _quiet()
    device = _device()
    group = Mesh.build(dp=world_size).dp_group
    model = gpt2().to(device)
    sync = {"bucketed": lambda: BucketedReducer(model, group=group, bucket_mb=0.05, overlap=True),
            "topk": lambda: TopKReducer(model, group=group, ratio=0.1),
            "powersgd": lambda: PowerSGDReducer(model, group=group, rank=2)}[kind]()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    losses, first = [], {}
    for step in range(2):
        optimizer.zero_grad(set_to_none=True)
        sync.before_backward()
        loss = model_loss(model, batch(tokens(2 * world_size, seed=step)[2 * rank:2 * rank + 2], device))
        loss.backward()
        if step == 0:
            first["local"] = grads(model)  # this rank's own gradients, before the synchronisation
        sync.finish()
        if step == 0:
            first["synced"] = grads(model)
        optimizer.step()
        losses.append(float(loss.detach()))
    return {"losses": losses, **first}


# ---- 3D ----------------------------------------------------------------------------------------------


def three_d_worker(rank: int, world_size: int, dp: int, pp: int, tp: int) -> dict:
    """One 3D step (1F1B x TP x DP, global-norm clip) of GPT-2 on this rank's device."""
    from course.mesh import Mesh
    from pipeline import StageRunner
    from three_d.stage import StageLoss, TensorParallelStage
    from three_d.step import three_d_step

    _quiet()
    device = _device()
    mesh = Mesh.build(dp=dp, pp=pp, tp=tp)
    stage = TensorParallelStage(gpt2(n_layer=4, n_embd=64, n_head=4), mesh.stage, pp, group=mesh.tp_group).to(device)
    runner = StageRunner(stage, device, loss_fn=StageLoss(mesh.tp_group), group=mesh.pp_group)
    ids = tokens(8)
    share = 8 // dp
    mine = ids[mesh.dp_rank * share:(mesh.dp_rank + 1) * share].to(device)
    out = three_d_step(stage, runner, mesh, mine, mine.clone(), 2, "1f1b", 1.0)
    return {"loss": out["loss"], "grad_norm": out["grad_norm"], "coordinates": (mesh.stage, mesh.dp_rank, mesh.tp_rank),
            "grads": {n: p.grad.detach().cpu() for n, p in stage.named_parameters() if p.grad is not None}}


# ---- failure ------------------------------------------------------------------------------------------


def nccl_hang_worker(rank: int, world_size: int) -> None:
    """Rank 0 waits in an all-reduce of a device tensor that rank 1 never joins."""
    import time

    import torch.distributed as dist

    if rank == 0:
        x = torch.ones(4, device=_device())
        dist.all_reduce(x)
        torch.cuda.synchronize()  # the collective can only end by timing out
    else:
        time.sleep(300)
