"""Long training sequences from short translation pairs: several pairs packed into one sequence.

A Multi30k pair is about 30-40 tokens — far too short for context parallelism to matter. The
context-parallel run therefore packs pairs, in a shuffled order, one after another into
sequences of ``seq_len`` tokens::

    src_1 <eos_src> tgt_1 <eos_tgt> src_2 <eos_src> tgt_2 <eos_tgt> ... <pad> <pad>

as GPT-2/GPT-3 pre-training packs documents (Brown et al. 2020, Sec. 2.2: sequences of 2048
tokens, documents separated by an end-of-text token, no mask between them). The loss is still
taken on the target tokens only (``labels`` as :class:`course.collate.Collate` builds them), and
attention is causal over the whole sequence: a pair's tokens also see the pairs packed before
it. That is what makes the sequence long — the attention of every token spans up to
``seq_len`` tokens — and it is honest about it: a later pair's loss is conditioned on unrelated
earlier pairs, which the model learns to ignore (the ``<eos_tgt>`` before each pair marks where
it starts). The position ids restart at every pair (``position_ids``: 0, 1, ... within each pair),
so every pair sits at the positions a single pair has at evaluation (validation loss and BLEU run
on single pairs, as in the other modes); the causal mask follows the tokens' places in the
sequence, not the position ids.

Every sequence is padded on the right to exactly ``seq_len`` tokens (a multiple of the layout's
chunk count), so it shards evenly over the cp group.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from course.collate import IGNORE_INDEX, Collate


def pack_pairs(examples: list[dict], collate: Collate, seq_len: int,
               seed: int) -> list[tuple[list[int], list[int], list[int]]]:
    """Pack ``examples`` (:func:`course.collate.encode_pairs` dicts), shuffled with ``seed``, greedily into
    sequences of at most ``seq_len`` tokens (a pair that does not fit starts the next sequence).

    Returns:
        ``[(input_ids, labels, position_ids), ...]``: token ids, labels (-100 off the targets) and position
        ids (restarting at 0 with every pair) of each sequence, unpadded; every pair appears once (cut by
        ``collate.build`` if longer than its maximum).

    Raises:
        ValueError: ``seq_len`` shorter than the collate's ``model_max_length`` (a pair would not fit).
    """
    if seq_len < collate.model_max_length:
        raise ValueError(f"seq_len {seq_len} is shorter than one pair may be ({collate.model_max_length} tokens, "
                         "--model_max_length); use a longer --seq_len")
    order = torch.randperm(len(examples), generator=torch.Generator().manual_seed(seed), device="cpu").tolist()
    sequences: list[tuple[list[int], list[int], list[int]]] = []
    ids: list[int] = []
    labels: list[int] = []
    positions: list[int] = []
    for i in order:
        pair_ids, pair_labels = collate.build(examples[i]["src_ids"], examples[i]["tgt_ids"])
        if ids and len(ids) + len(pair_ids) > seq_len:
            sequences.append((ids, labels, positions))
            ids, labels, positions = [], [], []
        ids, labels, positions = ids + pair_ids, labels + pair_labels, positions + list(range(len(pair_ids)))
    if ids:
        sequences.append((ids, labels, positions))
    return sequences


@dataclass
class PackedCollate:
    """``collate_fn`` for :func:`pack_pairs` sequences: (batch, seq_len) ``input_ids`` (padded with
    ``pad_id``), ``attention_mask`` (1 on tokens), ``labels`` (-100 on padding) and ``position_ids``
    (padding continues from the last pair), every row exactly ``seq_len`` long."""

    pad_id: int
    seq_len: int

    def __call__(self, sequences: list[tuple[list[int], list[int], list[int]]]) -> dict[str, torch.Tensor]:
        input_ids = torch.full((len(sequences), self.seq_len), self.pad_id, dtype=torch.long, device="cpu")
        labels = torch.full((len(sequences), self.seq_len), IGNORE_INDEX, dtype=torch.long, device="cpu")
        attention_mask = torch.zeros((len(sequences), self.seq_len), dtype=torch.long, device="cpu")
        position_ids = torch.zeros((len(sequences), self.seq_len), dtype=torch.long, device="cpu")
        for row, (ids, lab, pos) in enumerate(sequences):
            input_ids[row, : len(ids)] = torch.tensor(ids, device="cpu")
            labels[row, : len(lab)] = torch.tensor(lab, device="cpu")
            attention_mask[row, : len(ids)] = 1
            position_ids[row, : len(pos)] = torch.tensor(pos, device="cpu")
            last = pos[-1] if pos else -1
            tail = torch.arange(last + 1, last + 1 + self.seq_len - len(pos), device="cpu")
            position_ids[row, len(pos):] = tail.clamp(max=self.seq_len - 1)
        return {"input_ids": input_ids, "attention_mask": attention_mask, "labels": labels,
                "position_ids": position_ids}
