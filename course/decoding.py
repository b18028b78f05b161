"""Greedy decoding and corpus BLEU, the same for every model of the course.

One hand-rolled loop serves the plain, piped and tensor-parallel models, so their BLEU
scores are comparable. BLEU is sacrebleu's corpus BLEU (Post 2018) of the greedy
translations against one reference each.
"""
from __future__ import annotations

from typing import Callable

import torch
import torch.distributed as dist

from course.collectives import group_rank, group_size


def default_logits(model, batch: dict) -> torch.Tensor:
    """``model(input_ids, attention_mask).logits``: (batch, seq, vocab)."""
    return model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits


@torch.no_grad()
def greedy_translate(model, tokenizer, sources: list[list[int]], device, *, max_new_tokens: int = 48,
                     max_length: int = 128, batch_size: int = 32, logits_fn: Callable | None = None) -> list[str]:
    """Greedy continuation of ``source <eos_src>`` until ``<eos_tgt>``.

    Sequences are right-padded and the next token of sentence i is read at its own last
    position (causal attention makes the padding after it irrelevant).

    Args:
        sources: token ids of each source sentence (without special tokens).
        logits_fn: ``(model, {"input_ids", "attention_mask"}) -> (batch, seq, vocab)``
            (default :func:`default_logits`).

    Returns:
        The decoded target sentences.
    """
    model.eval()
    logits_fn = logits_fn or default_logits
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


def translate(model, tokenizer, examples: list[dict], device, group=None,
              **kwargs) -> tuple[list[str], list[str], list[str]]:
    """Greedy translations of ``examples`` (from :func:`course.collate.encode_pairs`).

    With ``group``, the work is shared out over its ranks: group rank r translates examples
    r, r + size, ...; the results are gathered in ``group`` so every rank returns all of
    them. Without, every rank translates every example (tensor parallelism: all ranks of a
    tp group take part in every forward pass).

    Returns:
        ``(sources, hypotheses, references)`` in the order of ``examples``.
    """
    rank, size = (group_rank(group), group_size(group)) if group is not None else (0, 1)
    mine = list(range(rank, len(examples), size))
    hyps = greedy_translate(model, tokenizer, [examples[i]["src_ids"] for i in mine], device, **kwargs)
    pieces = [list(zip(mine, hyps))]
    if size > 1:
        gathered: list = [None] * size
        dist.all_gather_object(gathered, pieces[0], group=group)
        pieces = gathered
    by_index = dict(pair for piece in pieces for pair in piece)
    hypotheses = [by_index[i] for i in range(len(examples))]
    return [e["src"] for e in examples], hypotheses, [e["tgt"] for e in examples]
