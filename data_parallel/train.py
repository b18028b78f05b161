"""Assignment 5.1.3 — data-parallel training of GPT-2, one call per rank.

:func:`run_dp` is the worker that ``project/run_data_parallel.py`` launches on every
rank (``project.launch.launch(run_dp, world_size, args)``). Each rank holds a full
replica of the model, trains on its own shard of every global batch, and averages
gradients with all-reduce before each optimizer step, so the replicas never diverge.
"""
from __future__ import annotations

from pathlib import Path

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader

from data_parallel.comm import average_gradients
from data_parallel.partition import Partition, partition_dataset
from project.cli import run_config
from project.experiment import build_model, prepare_data, worker_env_quiet
from project.launch import context
from project.model import parameter_fingerprint
from project.results import write_json, write_results
from project.train import corpus_bleu, evaluate_loss, gather_translations, train_epoch


def common_steps(n_batches: int, max_batches: int | None = None) -> int:
    """Batches every rank can run: the fewest any rank has (ranks must step together,
    or the all-reduce of the rank with one more batch waits forever)."""
    t = torch.tensor([n_batches if max_batches is None else min(n_batches, max_batches)])
    dist.all_reduce(t, op=dist.ReduceOp.MIN)
    return int(t)


def _max_over_ranks(value: float) -> float:
    t = torch.tensor([value], dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t)


def _sum_over_ranks(value: float) -> float:
    t = torch.tensor([value], dtype=torch.float64)
    dist.all_reduce(t)
    return float(t)


def run_dp(rank: int, world_size: int, args) -> dict:
    """Train ``args.n_epochs`` epochs data-parallel; write ``rank{r}_results_epoch{e}.json``.

    Args:
        args: the options of ``project/run_data_parallel.py`` (``batch_size`` is global).

    In epoch e, rank r trains on ``partition_dataset(r, world_size, train, batch_size,
    collate, seed=args.seed + e)`` — a new shuffle each epoch, the same on every rank —
    for the number of batches every rank has, averaging gradients after each backward.
    With ``args.save_checkpoint``, rank 0 saves the final weights to
    ``<workdir>/checkpoint_data_parallel.pt``.

    Returns:
        ``{"results": [paths], "initial_sha256": ..., "final_sha256": ...}`` — the
        fingerprints of the weights before and after training (equal across ranks when
        data parallelism is right).
    """
    worker_env_quiet()
    device = context().device
    data = prepare_data(args)
    model = build_model(args, data.tokenizer.vocab_size).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.learning_rate)
    initial_sha = parameter_fingerprint(model)
    # Validation and BLEU are shared out over the ranks too, then summed / gathered.
    val_loader = DataLoader(Partition(data.validation, range(rank, len(data.validation), world_size)),
                            batch_size=64, collate_fn=data.collate)
    written = []
    for epoch in range(args.n_epochs):
        # BEGIN ASSIGN5_1_3
        # A fresh shuffle each epoch: every rank uses the same seed, so the shards stay disjoint.
        train_loader = partition_dataset(rank, world_size, data.train, args.batch_size, data.collate,
                                         seed=args.seed + epoch)
        steps = common_steps(len(train_loader), args.max_batches)
        stats = train_epoch(model, train_loader, optimizer, device, after_backward=average_gradients,
                            max_batches=steps, desc=f"epoch {epoch} (rank 0 of {world_size})",
                            show_progress=rank == 0 and not args.quiet)
        # END ASSIGN5_1_3
        validation_loss = evaluate_loss(model, val_loader, device)
        bleu, translations = float("nan"), []
        if args.n_bleu:
            sources, hyps, refs = gather_translations(model, data.tokenizer, data.test[: args.n_bleu], device,
                                                      max_length=args.model_max_length)
            bleu = corpus_bleu(hyps, refs)
            translations = [{"source": s, "reference": r, "hypothesis": h} for s, h, r in zip(sources, hyps, refs)]
        slowest = _max_over_ranks(stats["time"])
        all_tokens = _sum_over_ranks(stats["tokens"])
        payload = {
            "validation_loss": validation_loss,
            "bleu": bleu,
            "training_time": stats["time"],
            "tokens_per_sec": stats["tokens"] / stats["time"],
            "global_tokens_per_sec": all_tokens / slowest,
            "train_loss": stats["loss"],
            "train_losses": stats["losses"],
            "steps": stats["steps"],
            "tokens": stats["tokens"],
            "param_sha256": parameter_fingerprint(model),
            "initial_param_sha256": initial_sha,
            "config": {**run_config(args), "world_size": world_size, "mode": "data_parallel",
                       "per_rank_batch_size": args.batch_size // world_size},
        }
        written.append(str(write_results(args.workdir, rank, epoch, payload)))
        if rank == 0 and translations:
            write_json(Path(args.workdir) / f"translations_epoch{epoch}.json", translations)
    if rank == 0 and args.save_checkpoint:
        torch.save(model.state_dict(), Path(args.workdir) / "checkpoint_data_parallel.pt")
    return {"results": written, "initial_sha256": initial_sha, "final_sha256": parameter_fingerprint(model)}

