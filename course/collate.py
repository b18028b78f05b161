"""Turn translation pairs into GPT-2 training batches.

One pair becomes one sequence ``source <eos_src> target <eos_tgt>`` (a decoder-only
model translates by continuing the source). The loss is next-token cross-entropy on the
target tokens and ``<eos_tgt>`` only: ``labels`` is -100 on the source, ``<eos_src>``
and padding.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

IGNORE_INDEX = -100


def encode_pairs(split, tokenizer, src_lang: str = "de", tgt_lang: str = "en") -> list[dict]:
    """Tokenize a split once.

    Args:
        split: rows with a ``translation`` column ``{src_lang: str, tgt_lang: str}``
            (a ``datasets.Dataset`` or a list of such rows).

    Returns:
        A list (usable as a map-style dataset) of dicts with ``src_ids``, ``tgt_ids``
        (lists of token ids) and the raw ``src``/``tgt`` strings.
    """
    pairs = split["translation"] if hasattr(split, "column_names") else [row["translation"] for row in split]
    src = [p[src_lang] for p in pairs]
    tgt = [p[tgt_lang] for p in pairs]
    return [{"src_ids": s_ids, "tgt_ids": t_ids, "src": s, "tgt": t}
            for s, t, s_ids, t_ids in zip(src, tgt, tokenizer.encode_batch(src), tokenizer.encode_batch(tgt))]


@dataclass
class Collate:
    """``collate_fn`` for a DataLoader over :func:`encode_pairs` examples.

    Returns a dict of LongTensors, each (batch, seq) with seq = longest sequence in the
    batch (at most ``model_max_length``), padded on the right:

    * ``input_ids``: ``source <eos_src> target <eos_tgt> <pad>...``
    * ``attention_mask``: 1 on real tokens, 0 on padding
    * ``labels``: the target tokens and ``<eos_tgt>`` where they stand in ``input_ids``;
      -100 elsewhere (ignored by the loss).

    Sequences longer than ``model_max_length`` are cut: the source to at most half of it,
    then the whole sequence.
    """

    pad_id: int
    eos_src_id: int
    eos_tgt_id: int
    model_max_length: int = 128

    def build(self, src_ids: list[int], tgt_ids: list[int]) -> tuple[list[int], list[int]]:
        src = list(src_ids)[: self.model_max_length // 2] + [self.eos_src_id]
        tgt = list(tgt_ids) + [self.eos_tgt_id]
        ids = (src + tgt)[: self.model_max_length]
        labels = ([IGNORE_INDEX] * len(src) + tgt)[: self.model_max_length]
        return ids, labels

    def __call__(self, examples: list[dict]) -> dict[str, torch.Tensor]:
        built = [self.build(e["src_ids"], e["tgt_ids"]) for e in examples]
        width = max(len(ids) for ids, _ in built)
        input_ids = torch.full((len(built), width), self.pad_id, dtype=torch.long)
        labels = torch.full((len(built), width), IGNORE_INDEX, dtype=torch.long)
        attention_mask = torch.zeros((len(built), width), dtype=torch.long)
        for row, (ids, lab) in enumerate(built):
            input_ids[row, : len(ids)] = torch.tensor(ids)
            labels[row, : len(lab)] = torch.tensor(lab)
            attention_mask[row, : len(ids)] = 1
        return {"input_ids": input_ids, "attention_mask": attention_mask, "labels": labels}


def make_collate(tokenizer, model_max_length: int = 128) -> Collate:
    """The :class:`Collate` for a :class:`course.tokenizer.CourseTokenizer`."""
    if model_max_length < 4:
        raise ValueError(f"model_max_length {model_max_length} is too short (use >= 4)")
    return Collate(tokenizer.pad_id, tokenizer.eos_src_id, tokenizer.eos_tgt_id, model_max_length)
