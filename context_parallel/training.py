"""Context-parallel GPT-2 training on packed Multi30k sequences: the training mode and its builder.

The run's mesh is ``dp x cp`` (``course.mesh.Mesh.build(dp=, cp=)``; dimensions
``("pp", "dp", "cp", "tp")``, cp inside dp). Every rank holds the whole model. Each global
batch of packed sequences (:mod:`context_parallel.packing`) is the same on every rank; the dp
rank takes its rows, and the cp rank its shard of their tokens (``layout``: zig-zag or contiguous
for the ring, contiguous for Ulysses). Attention runs across the cp group
(:mod:`context_parallel.gpt2`), everything else on the shard alone.

The loss of a step is the mean over every target token of the global batch, as one process
would compute it: each rank sums the cross-entropy of its shard's targets, and the gradient of
``sum_r loss_sum_r / total`` is the sum of the ranks' gradients. Each rank backpropagates
``loss_sum_r * (dp cp) / total`` and the gradients are *averaged* over the ``dp_cp`` group (the
ranks holding the same weights; torchtitan's ``dp_cp`` mesh dimension), which gives that sum.
"""
from __future__ import annotations

import torch
from torch.utils.data import DataLoader

from context_parallel.gpt2 import ContextParallelAttention, shard_batch, shard_loss_sum, shift_targets, \
    use_context_parallel_attention
from context_parallel.layouts import SequenceLayout
from context_parallel.packing import PackedCollate, pack_pairs
from course.collate import IGNORE_INDEX
from course.collectives import CommCounter, all_reduce, group_size, region
from course.epoch_runner import Evaluation, StepOutcome, TrainingMode, to_device
from course.launch import context
from course.mesh import Mesh
from course.model import build_gpt2


def average_gradients_over(model: torch.nn.Module, group) -> None:
    """Replace every gradient by its mean over the ranks of ``group`` (one all-reduce of all of them,
    flattened). Parameters without a gradient count as zero."""
    params = [p for p in model.parameters() if p.requires_grad]
    size = group_size(group)
    if size == 1:
        return
    flat = torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1) for p in params])
    flat = all_reduce(flat, group) / size
    offset = 0
    for p in params:
        p.grad = flat[offset: offset + p.numel()].view_as(p).clone()
        offset += p.numel()


def layout_for(config, cp: int) -> SequenceLayout:
    """The sequence layout of a run: ``config.layout`` (zig-zag or contiguous) for the ring, contiguous for Ulysses."""
    return SequenceLayout(config.layout if config.attention == "ring" else "contiguous", cp, config.seq_len)


def build_cp_model(config, vocab_size: int):
    """The run's GPT-2 (same weights on every rank: seeded) with context-parallel attention; its
    position table is long enough for the packed sequences."""
    model = build_gpt2(config.preset, vocab_size, n_positions=max(config.seq_len, config.model_max_length),
                       dropout=config.dropout, seed=config.seed)
    return use_context_parallel_attention(model)


class ContextParallelTraining(TrainingMode):
    """dp x cp: rows of the global batch per dp rank, tokens of each row per cp rank (module docstring)."""

    mode = "context_parallel"

    def __init__(self, config, data, device, model, mesh: Mesh, **kwargs):
        super().__init__(config, data, device, **kwargs)
        self.model, self.mesh = model, mesh
        self.dp, self.cp = mesh.dims.dp, mesh.dims.cp
        if config.batch_size % self.dp:
            raise ValueError(f"--batch_size {config.batch_size} is not divisible by --dp {self.dp}")
        self.layout = layout_for(config, self.cp)
        self.attention = ContextParallelAttention(config.attention, self.layout, mesh.cp_group, config.block_size)
        self.optimizer = torch.optim.AdamW(model.parameters(), lr=config.learning_rate)
        self.collate = PackedCollate(data.tokenizer.pad_id, config.seq_len)
        self.counter = CommCounter()
        self.n_layer = model.config.n_layer

    def epoch_batches(self, epoch: int):
        """Packed sequences (a new packing each epoch: seed ``config.seed + epoch``), the same on every rank."""
        sequences = pack_pairs(self.data.train, self.data.collate, self.config.seq_len, seed=self.config.seed + epoch)
        loader = DataLoader(sequences, batch_size=self.config.batch_size, collate_fn=self.collate, drop_last=True)
        steps = len(loader) if self.config.max_batches is None else min(len(loader), self.config.max_batches)
        return loader, steps

    def training(self, epoch: int):
        self.counter = CommCounter()
        return self.counter

    def train_step(self, batch: dict) -> StepOutcome:
        rows = self.config.batch_size // self.dp
        total = int((shift_targets(batch["labels"]) != IGNORE_INDEX).sum())  # targets of the global batch
        start = self.mesh.dp_rank * rows
        mine = to_device({k: v[start:start + rows] for k, v in batch.items()}, self.device)
        shard = shard_batch(mine, self.layout, self.mesh.cp_rank)
        self.optimizer.zero_grad(set_to_none=True)
        self.attention.stats.clear()
        loss_sum, _ = shard_loss_sum(self.model, shard, self.attention)
        (loss_sum * (self.dp * self.cp) / max(1, total)).backward()
        with region("grad_sync", "step"):
            average_gradients_over(self.model, self.mesh.dp_cp_group)
        self.optimizer.step()
        with region("loss", "step"):
            loss = all_reduce(loss_sum.detach(), self.mesh.dp_cp_group) / max(1, total)
        tokens = int(self.layout.shard(mine["attention_mask"], 1, self.mesh.cp_rank).sum())
        return StepOutcome(loss.item(), tokens)

    def evaluation(self) -> Evaluation:
        # Every rank holds the whole model: validation and BLEU are shared out over all of them (dp x cp).
        return Evaluation(self.model, self.device, group=self.mesh.dp_cp_group)

    def epoch_extra(self, epoch: int, stats: dict) -> dict:
        steps = max(1, stats["steps"])
        per_step = {name: {kind: {k: v / steps for k, v in s.items()} for kind, s in by_kind.items()}
                    for name, by_kind in self.counter.by_group().items()}
        cp_traffic = sum(s["traffic_bytes"] for s in per_step.get("cp", {}).values())
        return {"comm_per_step": per_step, "cp_traffic_bytes_per_layer": cp_traffic / self.n_layer,
                "tokens_per_rank_per_sequence": self.layout.local_len}

    def record(self) -> dict:
        return {**self.config.record(), "mode": self.mode, "world_size": self.mesh.world_size, "dp": self.dp,
                "cp": self.cp, "attention": self.config.attention, "layout": self.layout.kind,
                "seq_len": self.config.seq_len, "block_size": self.config.block_size, "attention_dropout": 0.0,
                "mesh": self.mesh.describe()}

    def progress_desc(self, epoch: int) -> str:
        return f"epoch {epoch} (dp {self.dp} x cp {self.cp}, {self.config.attention})"


def cp_training(config, data, mesh: Mesh) -> ContextParallelTraining:
    """This rank's :class:`ContextParallelTraining` on the run's ``config.dp x config.cp`` ``mesh``: the GPT-2 of
    :func:`build_cp_model` (same seed on every rank) on the worker's device. What ``project/train.py --mode cp``
    trains: ``<workdir>/context_parallel_rank{r}_results_epoch{e}.json`` (validation_loss, bleu, training_time,
    tokens_per_sec, train_losses, ``comm_per_step`` per group, config) and, on rank 0,
    ``context_parallel_translations_epoch{e}.json``."""
    device = context().device
    model = build_cp_model(config, data.tokenizer.vocab_size).to(device)
    return ContextParallelTraining(config, data, device, model, mesh, rank=mesh.rank, world_group=mesh.group("world"),
                                   throughput_group=mesh.group("world"), show_progress=mesh.rank == 0)
