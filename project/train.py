"""Train loop and evaluation shared by every run script.

* :func:`lm_loss` — next-token cross-entropy on target tokens.
* :func:`train_epoch` — one pass over a DataLoader with an ``after_backward`` hook (where
  data parallelism averages gradients) and a tqdm progress bar.
* :func:`evaluate_loss` — validation loss, summed over the ranks of a process group.
* :func:`greedy_translate` and :func:`corpus_bleu` — greedy translations and sacrebleu
  corpus BLEU, with the sentences shared out over the ranks.
"""
from __future__ import annotations

import time
from typing import Callable

import torch
import torch.distributed as dist
import torch.nn.functional as F

from project.collate import IGNORE_INDEX


def lm_loss(logits: torch.Tensor, labels: torch.Tensor, reduction: str = "mean") -> torch.Tensor:
    """Next-token cross-entropy over the positions whose label is not -100.

    Args:
        logits: (batch, seq, vocab) — position t scores token t+1.
        labels: (batch, seq) — token ids, -100 where no loss is taken.
        reduction: ``mean`` (over counted tokens) or ``sum``.

    Returns:
        A scalar tensor (nats per token for ``mean``).
    """
    shifted_logits = logits[:, :-1, :].reshape(-1, logits.size(-1)).float()
    shifted_labels = labels[:, 1:].reshape(-1)
    return F.cross_entropy(shifted_logits, shifted_labels, ignore_index=IGNORE_INDEX, reduction=reduction)


def count_target_tokens(labels: torch.Tensor) -> int:
    """Number of tokens :func:`lm_loss` averages over."""
    return int((labels[:, 1:] != IGNORE_INDEX).sum())


def default_loss_fn(model, batch: dict) -> torch.Tensor:
    """``lm_loss`` of a model that maps ``(input_ids, attention_mask)`` to an output with ``.logits``."""
    out = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"])
    logits = out.logits if hasattr(out, "logits") else out
    return lm_loss(logits, batch["labels"])


def to_device(batch: dict, device) -> dict:
    return {k: v.to(device, non_blocking=True) if torch.is_tensor(v) else v for k, v in batch.items()}


def _progress(loader, total, desc, show):
    """``iter(loader)``, wrapped in a tqdm bar when ``show``.

    The loader is iterated exactly once here: handing tqdm the DataLoader itself draws from
    a shuffling loader's generator an extra time, so the rank with the bar would see a
    different batch order than the others.
    """
    batches = iter(loader)
    if not show:
        return batches
    from tqdm.auto import tqdm

    return tqdm(batches, total=total, desc=desc, dynamic_ncols=True, leave=True)


def train_epoch(model, loader, optimizer, device, *, loss_fn: Callable | None = None,
                after_backward: Callable | None = None, max_batches: int | None = None,
                desc: str = "train", show_progress: bool = True) -> dict:
    """One epoch of training.

    For every batch: ``loss = loss_fn(model, batch)``, ``loss.backward()``,
    ``after_backward(model)`` (e.g. gradient averaging), ``optimizer.step()``.

    Args:
        loader: yields dicts of (batch, seq) tensors (see :class:`project.collate.Collate`).
        max_batches: stop after this many batches (None: the whole loader).

    Returns:
        dict with ``loss`` (mean of batch losses), ``losses`` (per batch), ``tokens``
        (non-padding input tokens processed), ``steps`` and ``time`` (seconds).
    """
    loss_fn = loss_fn or default_loss_fn
    model.train()
    total = len(loader) if max_batches is None else min(len(loader), max_batches)
    losses, tokens = [], 0
    start = time.perf_counter()
    bar = _progress(loader, total, desc, show_progress)
    for step, batch in enumerate(bar):
        if step >= total:
            break
        batch = to_device(batch, device)
        optimizer.zero_grad(set_to_none=True)
        loss = loss_fn(model, batch)
        loss.backward()
        if after_backward is not None:
            after_backward(model)
        optimizer.step()
        losses.append(loss.item())
        tokens += int(batch["attention_mask"].sum())
        if show_progress:
            bar.set_postfix(loss=f"{losses[-1]:.3f}", tok_s=f"{tokens / (time.perf_counter() - start):.0f}")
    if show_progress and hasattr(bar, "close"):
        bar.close()
    elapsed = time.perf_counter() - start
    return {"loss": sum(losses) / max(1, len(losses)), "losses": losses, "tokens": tokens,
            "steps": len(losses), "time": elapsed}


def _all_reduce_sum(values: list[float], device) -> list[float]:
    if not dist.is_initialized():
        return values
    t = torch.tensor(values, dtype=torch.float64, device=device)
    dist.all_reduce(t)
    return t.tolist()


@torch.no_grad()
def evaluate_loss(model, loader, device, *, logits_fn: Callable | None = None,
                  max_batches: int | None = None) -> float:
    """Mean target-token loss over ``loader``, summed over all ranks if a group is running.

    ``logits_fn(model, batch)`` returns (batch, seq, vocab) logits; by default
    ``model(input_ids, attention_mask).logits``. Each rank passes its own shard of the
    validation set; the result is the mean over every rank's tokens.
    """
    model.eval()
    loss_sum, count = 0.0, 0
    for step, batch in enumerate(loader):
        if max_batches is not None and step >= max_batches:
            break
        batch = to_device(batch, device)
        logits = logits_fn(model, batch) if logits_fn else model(
            input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
        loss_sum += lm_loss(logits, batch["labels"], reduction="sum").item()
        count += count_target_tokens(batch["labels"])
    loss_sum, count = _all_reduce_sum([loss_sum, float(count)], device)
    return loss_sum / max(1.0, count)


@torch.no_grad()
def greedy_translate(model, tokenizer, sources: list[list[int]], device, *, max_new_tokens: int = 48,
                     max_length: int = 128, batch_size: int = 32, logits_fn: Callable | None = None) -> list[str]:
    """Greedy continuation of ``source <eos_src>`` until ``<eos_tgt>``.

    The same hand-rolled loop serves every model of the course (plain, piped, tensor
    parallel), so BLEU is comparable between them: sequences are right-padded and the
    next token of sentence i is read at its own last position (causal attention makes
    the padding after it irrelevant).

    Args:
        sources: token ids of each source sentence (without special tokens).
        logits_fn: ``(model, {"input_ids", "attention_mask"}) -> (batch, seq, vocab)``.

    Returns:
        The decoded target sentences.
    """
    model.eval()
    logits_fn = logits_fn or (lambda m, b: m(input_ids=b["input_ids"], attention_mask=b["attention_mask"]).logits)
    outputs: list[str] = []
    for start in range(0, len(sources), batch_size):
        prompts = [list(s)[: max_length // 2] + [tokenizer.eos_src_id] for s in sources[start:start + batch_size]]
        lengths = torch.tensor([len(p) for p in prompts])
        width = min(max_length, int(lengths.max()) + max_new_tokens)
        ids = torch.full((len(prompts), width), tokenizer.pad_id, dtype=torch.long)
        for row, p in enumerate(prompts):
            ids[row, : len(p)] = torch.tensor(p)
        done = torch.zeros(len(prompts), dtype=torch.bool)
        generated: list[list[int]] = [[] for _ in prompts]
        while not done.all() and int(lengths[~done].max()) < width:
            cur = int(lengths.max())
            mask = (torch.arange(cur)[None, :] < lengths[:, None]).long()
            batch = {"input_ids": ids[:, :cur].to(device), "attention_mask": mask.to(device)}
            logits = logits_fn(model, batch).float().cpu()
            next_ids = logits[torch.arange(len(prompts)), lengths - 1].argmax(-1)
            for row in range(len(prompts)):
                if done[row] or lengths[row] >= width:
                    done[row] = True
                    continue
                token = int(next_ids[row])
                if token == tokenizer.eos_tgt_id:
                    done[row] = True
                    continue
                generated[row].append(token)
                ids[row, lengths[row]] = token
                lengths[row] += 1
        outputs.extend(tokenizer.decode(g) for g in generated)
    return outputs


def corpus_bleu(hypotheses: list[str], references: list[str]) -> float:
    """sacrebleu corpus BLEU (0-100) of ``hypotheses`` against one reference each."""
    import sacrebleu

    return float(sacrebleu.corpus_bleu(hypotheses, [references]).score)


def gather_translations(model, tokenizer, examples: list[dict], device, **kwargs) -> tuple[list[str], list[str], list[str]]:
    """Translate ``examples`` (from :func:`project.collate.encode_pairs`) with the work shared out over ranks.

    Rank r translates examples r, r + world_size, ...; the results are gathered so every
    rank returns ``(sources, hypotheses, references)`` in the original order.
    """
    rank = dist.get_rank() if dist.is_initialized() else 0
    world_size = dist.get_world_size() if dist.is_initialized() else 1
    mine = list(range(rank, len(examples), world_size))
    hyps = greedy_translate(model, tokenizer, [examples[i]["src_ids"] for i in mine], device, **kwargs)
    pieces = [list(zip(mine, hyps))]
    if world_size > 1:
        gathered: list = [None] * world_size
        dist.all_gather_object(gathered, pieces[0])
        pieces = gathered
    by_index = dict(pair for piece in pieces for pair in piece)
    hypotheses = [by_index[i] for i in range(len(examples))]
    return [e["src"] for e in examples], hypotheses, [e["tgt"] for e in examples]
