"""Training GPT-2 on Multi30k with pipeline parallelism: what ``project/run_pipeline.py`` runs.

Modes (``--model_parallel_mode``):

* ``model_parallel`` — the model split over ``n_stages`` stages, the whole batch going
  through them one stage after another (:class:`pipeline.gpt2.GPT2Pipeline` with a single
  micro-batch). One process.
* ``pipeline_parallel`` — the same stages, the batch cut into ``n_chunk`` micro-batches
  that flow through the clock-cycle schedule (:class:`pipeline.pipe.Pipe`), one worker
  thread per stage. One process.
* ``1f1b`` (and ``gpipe``) — one process per stage, activations and gradients sent
  between neighbours, the per-rank action lists of the schedule
  (:mod:`pipeline.multiprocess`). :func:`run_stage_worker` runs on every rank.

All modes minimise the same loss — the batch's mean next-token loss on target tokens —
so with dropout 0 they compute the same updates. Results go to
``<workdir>/pipeline_<mode>_rank{r}_results_epoch{e}.json`` with the per-stage timeline
of the epoch's last full batch.
"""
from __future__ import annotations

import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, Subset

from project.cli import run_config
from project.experiment import build_model, prepare_data, worker_env_quiet
from project.model import parameter_fingerprint
from project.results import write_json, write_results
from project.train import (corpus_bleu, count_target_tokens, evaluate_loss, gather_translations, lm_loss,
                           train_epoch)

MULTIPROCESS_MODES = ("1f1b", "gpipe")
SINGLE_PROCESS_MODES = ("model_parallel", "pipeline_parallel")


def results_prefix(mode: str) -> str:
    """``pipeline_<mode>_``: pipeline results never collide with data-parallel ones."""
    return f"pipeline_{mode}_"


def micro_batch_size(args) -> int:
    """Rows per micro-batch: the whole batch for ``model_parallel``, else ``batch_size // n_chunk``."""
    return args.batch_size if args.model_parallel_mode == "model_parallel" else args.batch_size // args.n_chunk


def train_loader(data, args, epoch: int) -> DataLoader:
    """The epoch's shuffled batches — the same on every rank (seed ``args.seed + epoch``)."""
    g = torch.Generator().manual_seed(args.seed + epoch)
    return DataLoader(data.train, batch_size=args.batch_size, shuffle=True, generator=g, collate_fn=data.collate)


def evaluate(model, data, args, device, logits_fn, rank: int = 0, world_size: int = 1):
    """Validation loss and BLEU (the sentences shared out over the ranks, if several)."""
    val = Subset(data.validation, range(rank, len(data.validation), world_size))
    validation_loss = evaluate_loss(model, DataLoader(val, batch_size=64, collate_fn=data.collate), device,
                                    logits_fn=logits_fn)
    bleu, translations = float("nan"), []
    if args.n_bleu:
        sources, hyps, refs = gather_translations(model, data.tokenizer, data.test[: args.n_bleu], device,
                                                  max_length=args.model_max_length, logits_fn=logits_fn)
        bleu = corpus_bleu(hyps, refs)
        translations = [{"source": s, "reference": r, "hypothesis": h} for s, h, r in zip(sources, hyps, refs)]
    return validation_loss, bleu, translations


def _config(args, world_size: int, **extra) -> dict:
    mode = args.model_parallel_mode
    return {**run_config(args), "mode": mode, "world_size": world_size, "n_stages": args.n_stages,
            "n_chunk": 1 if mode == "model_parallel" else args.n_chunk, "micro_batch_size": micro_batch_size(args),
            **extra}


def _write(args, rank, epoch, payload, translations):
    mode = args.model_parallel_mode
    path = write_results(args.workdir, rank, epoch, payload, prefix=results_prefix(mode))
    if rank == 0 and translations:
        write_json(Path(args.workdir) / f"{results_prefix(mode)}translations_epoch{epoch}.json", translations)
    return str(path)


# ---- one process: model_parallel and pipeline_parallel ------------------------------------

def cpu_threads_per_stage(args) -> int | None:
    """On CPU, give each stage ``cores // n_stages`` threads, as the 1f1b processes get
    (:mod:`project.launch`): a stage owns its share of the cores like it would own a GPU,
    and the stage threads of one clock cycle do not fight over the same cores. Returns the
    thread count (None on GPU)."""
    import os

    if args.device != "cpu":
        return None
    threads = max(1, (os.cpu_count() or 1) // args.n_stages)
    torch.set_num_threads(threads)
    return threads


def run_single_process(args) -> list[str]:
    """Train with :class:`pipeline.gpt2.GPT2Pipeline` in this process; returns the results files.

    On CPU, torch's thread count is set to ``cores // n_stages`` for the run and restored after.
    """
    previous_threads = torch.get_num_threads()
    try:
        return _run_single_process(args)
    finally:
        torch.set_num_threads(previous_threads)


def _run_single_process(args) -> list[str]:
    from pipeline.gpt2 import GPT2Pipeline, stage_devices

    worker_env_quiet()
    threads = cpu_threads_per_stage(args)
    torch.manual_seed(args.seed)
    data = prepare_data(args)
    model = build_model(args, data.tokenizer.vocab_size)
    devices = stage_devices(args.device, args.n_stages)
    piped = GPT2Pipeline(model, args.n_stages, micro_batch_size(args), devices=devices)
    piped.pipe.record_timeline = True
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.learning_rate)

    def loss_fn(m, batch):
        logits = m(batch["input_ids"])
        return lm_loss(logits, batch["labels"].to(logits.device))

    def logits_fn(m, batch):
        return m(batch["input_ids"]).to(batch["input_ids"].device)

    written = []
    for epoch in range(args.n_epochs):
        stats = train_epoch(piped, train_loader(data, args, epoch), optimizer, devices[0], loss_fn=loss_fn,
                            max_batches=args.max_batches, desc=f"{args.model_parallel_mode} epoch {epoch}",
                            show_progress=not args.quiet)
        timeline = [dict(stage=s, kind=k, micro_batch=i, start=a, end=b) for s, k, i, a, b in piped.pipe.timeline]
        validation_loss, bleu, translations = evaluate(piped, data, args, devices[0], logits_fn)
        payload = {
            "validation_loss": validation_loss, "bleu": bleu, "training_time": stats["time"],
            "tokens_per_sec": stats["tokens"] / stats["time"], "train_loss": stats["loss"],
            "train_losses": stats["losses"], "steps": stats["steps"], "tokens": stats["tokens"],
            "timeline": timeline, "timeline_note": "forward of the epoch's last batch, one row per stage task",
            "param_sha256": parameter_fingerprint(model),
            "config": _config(args, 1, devices=[str(d) for d in devices], threads_per_stage=threads),
        }
        written.append(_write(args, 0, epoch, payload, translations))
    return written


# ---- one process per stage: 1f1b and gpipe ---------------------------------------------------

def run_stage_worker(rank: int, world_size: int, args) -> dict:
    """Rank ``rank`` trains its stage of GPT-2 with the ``args.model_parallel_mode`` schedule.

    Every rank builds the whole GPT-2 (same seed) and trains only its stage; it reads the
    same batches as the others; rank 0 feeds the input_ids of each micro-batch, the last
    rank takes the labels and computes the loss. The tied embedding/head gradient is summed
    between the first and the last rank before each optimizer step. After each epoch the
    stages' weights are gathered on every rank, loaded into its full copy of the model (moved
    to its device), and that model is evaluated data-parallel (each rank a share of the sentences).

    Returns:
        ``{"results": [paths]}``.
    """
    from pipeline.gpt2_stages import TiedGradients, gpt2_stage, named_stage_parameters
    from pipeline.multiprocess import StageRunner
    from pipeline.schedules_1f1b import schedule_actions
    from project.launch import context

    worker_env_quiet()
    device = context().device
    first, last = rank == 0, rank == world_size - 1
    data = prepare_data(args)
    model = build_model(args, data.tokenizer.vocab_size)
    stage, tied = gpt2_stage(model, rank, world_size)
    stage.to(device)
    sync_tied = TiedGradients(world_size)
    optimizer = torch.optim.AdamW(stage.parameters(), lr=args.learning_rate)
    runner = StageRunner(stage, rank, world_size, device,
                         loss_fn=lambda logits, t: lm_loss(logits, t[0], reduction="sum") / t[1])
    mb = micro_batch_size(args)
    show = last and not args.quiet
    written = []
    for epoch in range(args.n_epochs):
        loader = train_loader(data, args, epoch)
        total = len(loader) if args.max_batches is None else min(len(loader), args.max_batches)
        losses, tokens, timeline = [], 0, []
        peak_in_flight = peak_bytes = 0
        bar = None
        if show:
            from tqdm.auto import tqdm
            bar = tqdm(total=total, desc=f"{args.model_parallel_mode} epoch {epoch} (last stage)", dynamic_ncols=True)
        stage.train()
        start = time.perf_counter()
        for step, batch in zip(range(total), loader):
            inputs = list(batch["input_ids"].split(mb))
            m = len(inputs)
            n_target = max(1, count_target_tokens(batch["labels"]))
            targets = [(labels.to(device), n_target) for labels in batch["labels"].split(mb)] if last else None
            optimizer.zero_grad(set_to_none=True)
            result = runner.run(schedule_actions(args.model_parallel_mode, rank, world_size, m),
                                inputs if first else None, targets)
            sync_tied(tied)
            optimizer.step()
            tokens += int(batch["attention_mask"].sum())
            peak_in_flight = max(peak_in_flight, result.peak_in_flight)
            peak_bytes = max(peak_bytes, result.peak_activation_bytes)
            if m == args.n_chunk or not timeline:
                timeline = [dict(stage=rank, kind=k, micro_batch=i, start=a, end=b) for k, i, a, b in result.events]
            if last:
                losses.append(sum(result.losses.values()))
                if bar is not None:
                    bar.update(1)
                    bar.set_postfix(loss=f"{losses[-1]:.3f}", tok_s=f"{tokens / (time.perf_counter() - start):.0f}")
        elapsed = time.perf_counter() - start
        if bar is not None:
            bar.close()
        box = [losses]
        dist.broadcast_object_list(box, src=world_size - 1)
        losses = box[0]

        # Evaluation: gather every stage's weights, evaluate the full model data-parallel.
        pieces: list = [None] * world_size
        dist.all_gather_object(pieces, {k: v.cpu() for k, v in named_stage_parameters(model, stage).items()})
        params = dict(model.named_parameters())
        with torch.no_grad():
            for piece in pieces:
                for name, value in piece.items():
                    params[name].copy_(value)
        model.to(device)
        validation_loss, bleu, translations = evaluate(
            model, data, args, device, lambda m_, b: m_(input_ids=b["input_ids"]).logits, rank, world_size)
        payload = {
            "validation_loss": validation_loss, "bleu": bleu, "training_time": elapsed,
            "tokens_per_sec": tokens / elapsed, "train_loss": sum(losses) / max(1, len(losses)),
            "train_losses": losses, "steps": total, "tokens": tokens, "timeline": timeline,
            "timeline_note": "forward and backward of every micro-batch of the epoch's last full batch on this stage",
            "peak_in_flight": peak_in_flight, "peak_activation_bytes": peak_bytes,
            "param_sha256": parameter_fingerprint(model),
            "config": _config(args, world_size, schedule=args.model_parallel_mode, stage_rank=rank,
                              stage_layers=len(stage)),
        }
        written.append(_write(args, rank, epoch, payload, translations))
    return {"results": written}
