"""Tensor-parallel GPT-2 training on Multi30k: the training mode and the per-rank worker.

Every rank builds the same GPT-2 (same seed), keeps its shards
(:class:`tensor_parallel.gpt2.TensorParallelGPT2`, over the ``tp`` group of the run's mesh)
and processes the **same** batches as the other ranks of its tp group: tensor parallelism
splits the model, not the data. After each backward pass ``model.sync_grads`` all-reduces
the gradients that are partial sums (sequence parallelism, ``spd``/``parallel`` blocks);
the optimizer then updates each rank's shards. A :class:`course.collectives.CommCounter`
records every collective of the training steps. The shared epoch runner
(:func:`course.epoch_runner.run_epochs`) does evaluation, BLEU and the results files.
"""
from __future__ import annotations

import torch
from torch.utils.data import DataLoader, Subset

from course.collectives import CommCounter
from course.epoch_runner import Evaluation, StepOutcome, TrainingMode, run_epochs, supervised_step
from course.launch import context
from course.mesh import Mesh
from course.task import build_model
from tensor_parallel.export import hf_state_dict
from tensor_parallel.gpt2 import TensorParallelGPT2


def tp_loss(model, batch: dict) -> torch.Tensor:
    """Vocabulary-parallel next-token loss of a batch (a ``loss_fn`` for :func:`course.epoch_runner.supervised_step`)."""
    return model(batch["input_ids"], batch["attention_mask"], batch["labels"]).loss


def tp_logits(model, batch: dict) -> torch.Tensor:
    """Full (batch, seq, vocab) logits, the same on every rank of the tp group (for evaluation and decoding)."""
    return model.gather_logits(model(batch["input_ids"], batch["attention_mask"]).logits)


def epoch_loader(dataset, batch_size: int, collate, seed: int) -> DataLoader:
    """A DataLoader over ``dataset`` in a seeded random order — the same order on every rank.

    The order is drawn up front (not by the DataLoader's sampler), so wrapping the loader
    in a progress bar on one rank cannot change it.
    """
    order = torch.randperm(len(dataset), generator=torch.Generator().manual_seed(seed), device="cpu").tolist()
    return DataLoader(Subset(dataset, order), batch_size=batch_size, collate_fn=collate)


def per_step(counter: CommCounter, steps: int, n_layer: int) -> dict:
    """Collectives per training step: total, and per layer (the ``blocks`` scope / n_layer) by phase."""
    steps = max(1, steps)

    def scaled(summary, by):
        return {kind: {k: v / by for k, v in s.items()} for kind, s in summary.items()}

    return {"total": scaled(counter.summary(), steps),
            "per_layer_forward": scaled(counter.summary("blocks", "forward"), steps * n_layer),
            "per_layer_backward": scaled(counter.summary("blocks", "backward"), steps * n_layer),
            "grad_sync": scaled(counter.summary("grad_sync"), steps),
            "by_group": {name: scaled(s, steps) for name, s in counter.by_group().items()}}


class TensorParallelTraining(TrainingMode):
    """Tensor parallelism over the ``tp`` group: the same batches on every rank, each holding its shards."""

    mode = "tensor_parallel"

    def __init__(self, config, data, device, model, n_layer, mesh, **kwargs):
        super().__init__(config, data, device, **kwargs)
        self.model, self.n_layer, self.mesh = model, n_layer, mesh
        self.optimizer = torch.optim.AdamW(model.parameters(), lr=config.learning_rate)
        self.counter = CommCounter()  # counts and bytes (it reads no clock: no GPU synchronisation)

    @property
    def checkpoint_key(self) -> str:
        return f"tp{self.mesh.tp_rank}"  # each tp rank saves its shards

    def epoch_batches(self, epoch: int):
        loader = epoch_loader(self.data.train, self.config.batch_size, self.data.collate, seed=self.config.seed + epoch)
        steps = len(loader) if self.config.max_batches is None else min(len(loader), self.config.max_batches)
        return loader, steps

    def training(self, epoch: int):
        self.counter = CommCounter()  # counts and bytes (it reads no clock: no GPU synchronisation)
        return self.counter

    def train_step(self, batch: dict) -> StepOutcome:
        return supervised_step(self.model, self.optimizer, batch, self.device, loss_fn=tp_loss,
                               after_backward=lambda m: m.sync_grads())

    def export_state(self) -> dict:
        """The shards gathered over tp as ``transformers``' GPT-2 (:func:`tensor_parallel.export.hf_state_dict`)."""
        return hf_state_dict(self.model)

    def evaluation(self) -> Evaluation:
        # Every rank of a tp group evaluates and translates the same sentences: all take part in every forward.
        return Evaluation(self.model, self.device, logits_fn=tp_logits)

    def epoch_extra(self, epoch: int, stats: dict) -> dict:
        return {"comm_per_step": per_step(self.counter, stats["steps"], self.n_layer),
                "parameters_on_rank": sum(p.numel() for p in self.model.parameters())}

    def record(self) -> dict:
        return {**self.config.record(), "world_size": self.mesh.world_size, "mode": self.mode,
                "sequence_parallel": bool(self.config.sequence_parallel), "block_types": self.model.block_types,
                "n_layer": self.n_layer, "mesh": self.mesh.describe()}

    def progress_desc(self, epoch: int) -> str:
        return f"epoch {epoch} (tp {self.mesh.dims.tp})"


def tp_training(config, data, mesh: Mesh) -> TensorParallelTraining:
    """This rank's :class:`TensorParallelTraining` over ``mesh.tp_group``: the GPT-2 of ``config`` (same seed
    on every rank) cut into this rank's shards (``config.block_types``, ``config.sequence_parallel``) on the
    worker's device. What ``project/train.py --mode tp`` trains; the parity harness (``project/tools/parity.py``) steps
    it directly."""
    device = context().device
    hf_model = build_model(config, data.tokenizer.vocab_size)
    model = TensorParallelGPT2(hf_model, block_types=config.block_types, sequence_parallel=config.sequence_parallel,
                               group=mesh.tp_group).to(device)
    return TensorParallelTraining(config, data, device, model, hf_model.config.n_layer, mesh, rank=mesh.rank,
                                  world_group=mesh.group("world"), show_progress=mesh.rank == 0)


def train_tp(rank: int, world_size: int, config, data, mesh: Mesh | None = None) -> dict:
    """:func:`tp_training`'s epochs on already prepared data (:func:`course.task.prepare_data`) and, optionally, a
    built mesh (default: ``tp = world_size``).

    Returns:
        ``{"results": [paths], "train_losses": [...], "validation_loss": [...]}``.
    """
    import json

    mesh = mesh or Mesh.build(tp=world_size)
    written = run_epochs(tp_training(config, data, mesh))
    results = [json.loads(open(path).read()) for path in written]
    return {"results": written, "train_losses": [x for r in results for x in r["train_losses"]],
            "validation_loss": [r["validation_loss"] for r in results]}
