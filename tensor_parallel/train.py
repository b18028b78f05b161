"""Tensor-parallel GPT-2 training on Multi30k, one call per rank (``project/run_tensor_parallel.py``).

Every rank builds the same GPT-2 (same seed), keeps its shards
(:class:`tensor_parallel.gpt2.TensorParallelGPT2`) and processes the **same** batches:
tensor parallelism splits the model, not the data. After each backward pass
``model.sync_grads`` all-reduces the gradients that are partial sums (sequence
parallelism, ``spd``/``parallel`` blocks); the optimizer then updates each rank's shards.
A :class:`tensor_parallel.comm.CommCounter` records every collective of the training steps.
"""
from __future__ import annotations

from pathlib import Path

import torch
from torch.utils.data import DataLoader, Subset

from project.cli import run_config
from project.experiment import build_model, prepare_data, worker_env_quiet
from project.launch import context
from project.results import write_json, write_results
from project.train import corpus_bleu, evaluate_loss, greedy_translate, train_epoch
from tensor_parallel.comm import CommCounter
from tensor_parallel.gpt2 import TensorParallelGPT2

RESULTS_PREFIX = "tensor_parallel_"


def tp_loss(model, batch: dict) -> torch.Tensor:
    """Vocabulary-parallel next-token loss of a batch (for ``train_epoch(loss_fn=...)``)."""
    return model(batch["input_ids"], batch["attention_mask"], batch["labels"]).loss


def tp_logits(model, batch: dict) -> torch.Tensor:
    """Full (batch, seq, vocab) logits, the same on every rank (for evaluation and decoding)."""
    return model.gather_logits(model(batch["input_ids"], batch["attention_mask"]).logits)


def epoch_loader(dataset, batch_size: int, collate, seed: int) -> DataLoader:
    """A DataLoader over ``dataset`` in a seeded random order — the same order on every rank.

    The order is drawn up front (not by the DataLoader's sampler), so wrapping the loader
    in a progress bar on one rank cannot change it.
    """
    order = torch.randperm(len(dataset), generator=torch.Generator().manual_seed(seed)).tolist()
    return DataLoader(Subset(dataset, order), batch_size=batch_size, collate_fn=collate)


def per_step(counter: CommCounter, steps: int, n_layer: int) -> dict:
    """Collectives per training step: total, and per layer (the ``blocks`` scope / n_layer) by phase."""
    steps = max(1, steps)

    def scaled(summary, by):
        return {kind: {k: v / by for k, v in s.items()} for kind, s in summary.items()}

    return {"total": scaled(counter.summary(), steps),
            "per_layer_forward": scaled(counter.summary("blocks", "forward"), steps * n_layer),
            "per_layer_backward": scaled(counter.summary("blocks", "backward"), steps * n_layer),
            "grad_sync": scaled(counter.summary("grad_sync"), steps)}


def run_tp(rank: int, world_size: int, args) -> dict:
    """Train ``args.n_epochs`` epochs with tensor parallelism over ``world_size`` ranks.

    Writes ``<workdir>/tensor_parallel_rank{r}_results_epoch{e}.json`` (validation_loss,
    bleu, training_time, tokens_per_sec, train_losses, ``comm_per_step``, config) and, on
    rank 0, ``tensor_parallel_translations_epoch{e}.json``.

    Args:
        args: options of ``project/run_tensor_parallel.py`` (``tp_size == world_size``,
            ``sequence_parallel``, ``block_types``, and the shared ones).

    Returns:
        ``{"results": [paths], "train_losses": [...], "validation_loss": [...]}``.
    """
    worker_env_quiet()
    return train_tp(rank, world_size, args, prepare_data(args))


def train_tp(rank: int, world_size: int, args, data) -> dict:
    """:func:`run_tp` on already prepared data (:func:`project.experiment.prepare_data`)."""
    device = context().device
    hf_model = build_model(args, data.tokenizer.vocab_size)
    model = TensorParallelGPT2(hf_model, block_types=args.block_types,
                               sequence_parallel=args.sequence_parallel).to(device)
    n_layer = hf_model.config.n_layer
    del hf_model
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.learning_rate)
    # Every rank evaluates and translates the same sentences: all ranks take part in every forward pass.
    val_loader = DataLoader(data.validation, batch_size=64, collate_fn=data.collate)
    written, all_losses, val_losses = [], [], []
    for epoch in range(args.n_epochs):
        train_loader = epoch_loader(data.train, args.batch_size, data.collate, seed=args.seed + epoch)
        with CommCounter() as counter:
            stats = train_epoch(model, train_loader, optimizer, device, loss_fn=tp_loss,
                                after_backward=lambda m: m.sync_grads(), max_batches=args.max_batches,
                                desc=f"epoch {epoch} (tp_size {world_size})",
                                show_progress=rank == 0 and not args.quiet)
        validation_loss = evaluate_loss(model, val_loader, device, logits_fn=tp_logits,
                                        max_batches=getattr(args, "max_val_batches", None))
        bleu, translations = float("nan"), []
        if args.n_bleu:
            test = data.test[: args.n_bleu]
            hyps = greedy_translate(model, data.tokenizer, [e["src_ids"] for e in test], device,
                                    max_length=args.model_max_length, logits_fn=tp_logits)
            refs = [e["tgt"] for e in test]
            bleu = corpus_bleu(hyps, refs)
            translations = [{"source": e["src"], "reference": e["tgt"], "hypothesis": h} for e, h in zip(test, hyps)]
        payload = {
            "validation_loss": validation_loss,
            "bleu": bleu,
            "training_time": stats["time"],
            # Every rank works on the same tokens, so this is also the throughput of the whole group.
            "tokens_per_sec": stats["tokens"] / stats["time"],
            "train_loss": stats["loss"],
            "train_losses": stats["losses"],
            "steps": stats["steps"],
            "tokens": stats["tokens"],
            "comm_per_step": per_step(counter, stats["steps"], n_layer),
            "parameters_on_rank": sum(p.numel() for p in model.parameters()),
            "config": {**run_config(args), "world_size": world_size, "tp_size": world_size, "mode": "tensor_parallel",
                       "sequence_parallel": bool(args.sequence_parallel), "block_types": model.block_types,
                       "n_layer": n_layer},
        }
        written.append(str(write_results(args.workdir, rank, epoch, payload, prefix=RESULTS_PREFIX)))
        if rank == 0 and translations:
            write_json(Path(args.workdir) / f"{RESULTS_PREFIX}translations_epoch{epoch}.json", translations)
        all_losses += stats["losses"]
        val_losses.append(validation_loss)
    return {"results": written, "train_losses": all_losses, "validation_loss": val_losses}
