"""Turn translation pairs into GPT-2 training batches.

One pair becomes one sequence ``source <eos_src> target <eos_tgt>`` (a decoder-only
model translates by continuing the source). The loss is next-token cross-entropy on the
target tokens and ``<eos_tgt>`` only: ``labels`` is -100 on the source, ``<eos_src>``
and padding.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

IGNORE_INDEX = -100


class EncodedPairs(Sequence):
    """The pairs of a split as a map-style dataset whose examples are tokenized when first read, then kept.

    A short run (``--max_batches``, a test) reads a few hundred of Multi30k's 29,000 training pairs;
    encoding all of them up front cost each rank seconds. ``dataset[i]`` is the dict of
    :func:`encode_pairs`; ``dataset[a:b]`` a list of them; a ``DataLoader`` reads a batch at once
    through ``__getitems__`` (one batched call to the tokenizer); iterating encodes in chunks.

    Args:
        split: rows with a ``translation`` column ``{src_lang: str, tgt_lang: str}``
            (a ``datasets.Dataset`` or a list of such rows).
        tokenizer: a :class:`course.tokenizer.CourseTokenizer` (``encode_batch``).
    """

    CHUNK = 1024  # pairs encoded together while iterating

    def __init__(self, split, tokenizer, src_lang: str = "de", tgt_lang: str = "en"):
        pairs = split["translation"] if hasattr(split, "column_names") else [row["translation"] for row in split]
        self.src = [p[src_lang] for p in pairs]
        self.tgt = [p[tgt_lang] for p in pairs]
        self.tokenizer = tokenizer
        self._encoded: dict[int, dict] = {}

    def __len__(self) -> int:
        return len(self.src)

    def __getitem__(self, index):
        if isinstance(index, slice):
            return self.__getitems__(range(*index.indices(len(self))))
        return self.__getitems__([index])[0]

    def __getitems__(self, indices) -> list[dict]:
        """The examples at ``indices`` (a list; negative indices count from the end).

        Raises:
            IndexError: an index outside the split.
        """
        n = len(self)
        wanted = []
        for i in indices:
            if not -n <= i < n:
                raise IndexError(f"pair {i} is outside the split's {n} pairs")
            wanted.append(i % n)
        missing = sorted({i for i in wanted if i not in self._encoded})
        if missing:
            src_ids = self.tokenizer.encode_batch([self.src[i] for i in missing])
            tgt_ids = self.tokenizer.encode_batch([self.tgt[i] for i in missing])
            for i, s_ids, t_ids in zip(missing, src_ids, tgt_ids):
                self._encoded[i] = {"src_ids": s_ids, "tgt_ids": t_ids, "src": self.src[i], "tgt": self.tgt[i]}
        return [self._encoded[i] for i in wanted]

    def __iter__(self):
        for start in range(0, len(self), self.CHUNK):
            yield from self.__getitems__(range(start, min(start + self.CHUNK, len(self))))


def encode_pairs(split, tokenizer, src_lang: str = "de", tgt_lang: str = "en") -> list[dict]:
    """Tokenize every pair of a split now (:class:`EncodedPairs` tokenizes each pair when first read).

    Args:
        split: rows with a ``translation`` column ``{src_lang: str, tgt_lang: str}``
            (a ``datasets.Dataset`` or a list of such rows).

    Returns:
        A list (usable as a map-style dataset) of dicts with ``src_ids``, ``tgt_ids``
        (lists of token ids) and the raw ``src``/``tgt`` strings.
    """
    return list(EncodedPairs(split, tokenizer, src_lang, tgt_lang))


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
