"""The training mode of ``project/run_3d.py``: GPT-2 on a ``dp x pp x tp`` mesh, run by the epoch runner.

Every rank builds the run's :class:`course.mesh.Mesh`, the same dense GPT-2 (same seed) and
from it its :class:`three_d.stage.TensorParallelStage`; every rank reads the same global
batches in the same order and keeps its dp rank's rows. Each step is
:func:`three_d.step.three_d_step` (pipeline schedule over pp, tp stages, tied sum, dp
average, global clip) followed by AdamW on the stage's parameters.

Evaluation: the stages' parameters are gathered in the pp group into every rank's full
tensor-parallel model (:class:`tensor_parallel.TensorParallelGPT2`, the one the stage was cut
from), which the ranks of a tp group evaluate together; the validation sentences are shared
out over the dp group.

Results (``<workdir>/three_d_rank{r}_results_epoch{e}.json``) carry, besides the common
entries: the timeline of the epoch's last full batch on this rank (F/B per micro-batch),
communication per group and kind (count, bytes, per step), peak activation bytes, the
rank's coordinates and groups.
"""
from __future__ import annotations

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, Subset

import pipeline
from course.cli import run_config
from course.collectives import CommCounter, global_rank
from course.epoch_runner import Evaluation, StepOutcome, TrainingMode, run_epochs
from course.task import build_model, prepare_data, worker_env_quiet
from three_d.stage import StageLoss, TensorParallelStage
from three_d.step import three_d_step

RESULTS_PREFIX = "three_d_"


class ThreeDTraining(TrainingMode):
    """One rank of a 3D run: its stage's tp shard, its dp rank's rows of every batch."""

    mode = "three_d"
    results_prefix = RESULTS_PREFIX

    def __init__(self, args, data, device, mesh, stage: TensorParallelStage):
        super().__init__(args, data, device, rank=mesh.rank, world_group=mesh.group("world"),
                         throughput_group=mesh.dp_group,
                         show_progress=mesh.is_last_stage and mesh.dp_rank == 0 and mesh.tp_rank == 0)
        self.mesh, self.stage = mesh, stage
        self.optimizer = torch.optim.AdamW(stage.parameters(), lr=args.learning_rate)
        self.runner = pipeline.StageRunner(stage, device, loss_fn=StageLoss(mesh.tp_group), group=mesh.pp_group)
        self.counter = CommCounter()
        self.timeline, self.peak_bytes, self.peak_in_flight = [], 0, 0

    @property
    def checkpoint_key(self) -> str:
        return f"pp{self.mesh.stage}_tp{self.mesh.tp_rank}"

    def checkpoint_module(self):
        return self.stage

    def train_mode(self):
        self.stage.train()

    def epoch_batches(self, epoch: int):
        order = torch.randperm(len(self.data.train), generator=torch.Generator().manual_seed(self.args.seed + epoch))
        loader = DataLoader(Subset(self.data.train, order.tolist()), batch_size=self.args.batch_size,
                            collate_fn=self.data.collate, drop_last=True)  # every dp rank needs its full share
        steps = len(loader) if self.args.max_batches is None else min(len(loader), self.args.max_batches)
        return loader, steps

    def training(self, epoch: int):
        self.counter = CommCounter()
        self.timeline, self.peak_bytes, self.peak_in_flight = [], 0, 0
        return self.counter

    def train_step(self, batch: dict) -> StepOutcome:
        share = self.args.batch_size // self.mesh.dims.dp
        rows = slice(self.mesh.dp_rank * share, (self.mesh.dp_rank + 1) * share)
        ids, labels = batch["input_ids"][rows].to(self.device), batch["labels"][rows].to(self.device)
        out = three_d_step(self.stage, self.runner, self.mesh, ids, labels, self.args.n_chunk, self.args.schedule,
                           self.args.max_grad_norm)
        self.optimizer.step()
        result = out["result"]
        self.peak_bytes = max(self.peak_bytes, result.peak_activation_bytes)
        self.peak_in_flight = max(self.peak_in_flight, result.peak_in_flight)
        self.timeline = [dict(stage=self.mesh.stage, kind=k, micro_batch=i, start=a, end=b)
                         for k, i, a, b in result.events]
        self.last_grad_norm = out["grad_norm"]
        return StepOutcome(out["loss"], int(batch["attention_mask"][rows].sum()))

    def batch_losses(self, losses):
        box = [losses]
        dist.broadcast_object_list(box, src=global_rank(self.mesh.pp_group, self.mesh.dims.pp - 1),
                                   group=self.mesh.pp_group)
        return box[0]

    def evaluation(self) -> Evaluation:
        full = self.stage.full_model
        pieces: list = [None] * self.mesh.dims.pp
        mine = {name: p.detach().cpu() for name, p in self.stage.named_parameters() if name != "lm_head.weight"}
        dist.all_gather_object(pieces, mine, group=self.mesh.pp_group)
        params = dict(full.named_parameters())
        with torch.no_grad():
            for piece in pieces:
                for name, value in piece.items():
                    params[name].copy_(value)
        full.to(self.device)
        return Evaluation(full, self.device, group=self.mesh.dp_group,
                          logits_fn=lambda m, b: m.gather_logits(m(b["input_ids"], b.get("attention_mask")).logits))

    def epoch_extra(self, epoch: int, stats: dict) -> dict:
        steps = max(1, stats["steps"])
        by_group = self.counter.by_group()
        per_step = {g: {k: {"count": v["count"] / steps, "bytes": v["bytes"] / steps} for k, v in kinds.items()}
                    for g, kinds in by_group.items()}
        return {"timeline": self.timeline, "timeline_note": "forward and backward of every micro-batch of the "
                "epoch's last batch on this rank (seconds since the pp group's common origin)",
                "comm_per_step": per_step, "peak_activation_bytes": self.peak_bytes,
                "peak_in_flight": self.peak_in_flight, "coordinates": dict(zip(("pp", "dp", "tp"),
                                                                                 self.mesh.coordinates)),
                "last_grad_norm": getattr(self, "last_grad_norm", None), "time_origin": self.runner.origin}

    def config(self) -> dict:
        return {**run_config(self.args), "mode": self.mode, "world_size": self.mesh.world_size,
                "dp": self.mesh.dims.dp, "pp": self.mesh.dims.pp, "tp": self.mesh.dims.tp,
                "schedule": self.args.schedule, "n_chunk": self.args.n_chunk,
                "scatter_gather": bool(self.args.scatter_gather), "blocks": list(self.stage.blocks),
                "mesh": self.mesh.describe()}

    def progress_desc(self, epoch: int) -> str:
        d = self.mesh.dims
        return f"3d dp{d.dp} pp{d.pp} tp{d.tp} {self.args.schedule} epoch {epoch}"


def run_3d(rank: int, world_size: int, args) -> dict:
    """Rank ``rank`` of a ``args.dp x args.pp x args.tp`` run: builds the mesh, data, model and its
    stage, and trains ``args.n_epochs`` epochs (:class:`ThreeDTraining`).

    Returns:
        ``{"results": [paths]}``.
    """
    from course.launch import context
    from course.mesh import Mesh

    worker_env_quiet()
    device = context().device
    mesh = Mesh.build(dp=args.dp, pp=args.pp, tp=args.tp)
    data = prepare_data(args)
    model = build_model(args, data.tokenizer.vocab_size)
    stage = TensorParallelStage(model, mesh.stage, args.pp, group=mesh.tp_group, scatter_gather=args.scatter_gather)
    stage.to(device)
    return {"results": run_epochs(ThreeDTraining(args, data, device, mesh, stage))}
