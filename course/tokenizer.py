"""Byte-level BPE tokenizer trained with the ``tokenizers`` library on the training split.

Special tokens: ``<eos_{src}>`` ends the source sentence, ``<eos_{tgt}>`` ends the target
sentence, ``<pad>`` pads. The tokenizer is trained once — by rank 0 when a process
group is running, while the other ranks wait at a barrier — and cached as one JSON file
in the run's work directory.
"""
from __future__ import annotations

import os
from pathlib import Path

import torch.distributed as dist

PAD = "<pad>"


def special_tokens(src_lang: str, tgt_lang: str) -> list[str]:
    """``[<eos_src>, <eos_tgt>, <pad>]`` for a language pair."""
    return [f"<eos_{src_lang}>", f"<eos_{tgt_lang}>", PAD]


class CourseTokenizer:
    """A trained ``tokenizers.Tokenizer`` plus the ids of the course's special tokens."""

    def __init__(self, tokenizer, src_lang: str, tgt_lang: str):
        self.tokenizer = tokenizer
        self.src_lang, self.tgt_lang = src_lang, tgt_lang
        eos_src, eos_tgt, pad = special_tokens(src_lang, tgt_lang)
        self.eos_src_id = tokenizer.token_to_id(eos_src)
        self.eos_tgt_id = tokenizer.token_to_id(eos_tgt)
        self.pad_id = tokenizer.token_to_id(pad)
        if None in (self.eos_src_id, self.eos_tgt_id, self.pad_id):
            raise ValueError(f"tokenizer lacks the special tokens {special_tokens(src_lang, tgt_lang)}")

    @property
    def vocab_size(self) -> int:
        """Number of token ids (including special tokens)."""
        return self.tokenizer.get_vocab_size()

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text`` (no special tokens added)."""
        return self.tokenizer.encode(text).ids

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        """Token ids of each text (fast, batched in Rust)."""
        return [e.ids for e in self.tokenizer.encode_batch(texts)]

    def decode(self, ids: list[int]) -> str:
        """Text of ``ids``; special tokens are dropped."""
        return self.tokenizer.decode(list(ids), skip_special_tokens=True)

    @classmethod
    def load(cls, path: str | os.PathLike, src_lang: str, tgt_lang: str) -> "CourseTokenizer":
        from tokenizers import Tokenizer

        return cls(Tokenizer.from_file(str(path)), src_lang, tgt_lang)


def train_tokenizer(texts, vocab_size: int, src_lang: str, tgt_lang: str, path: str | os.PathLike):
    """Train a byte-level BPE on ``texts`` and save it to ``path`` (written atomically)."""
    from tokenizers import ByteLevelBPETokenizer

    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(texts, vocab_size=vocab_size, min_frequency=2,
                            special_tokens=special_tokens(src_lang, tgt_lang), show_progress=False)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    bpe.save(str(tmp))
    os.replace(tmp, path)
    return path


def tokenizer_path(workdir: str | os.PathLike, dataset: str, vocab_size: int, src_lang: str, tgt_lang: str,
                   train_examples: int | None = None) -> Path:
    """Where the tokenizer for this corpus and vocabulary size is cached (one trained on the first
    ``train_examples`` pairs only has a name that says so)."""
    name = dataset.replace("/", "_") + (f"_first{train_examples}" if train_examples is not None else "")
    return Path(workdir) / f"tokenizer_{name}_{src_lang}-{tgt_lang}_{vocab_size}.json"


def verify_cached_tokenizer(path: Path, src_lang: str, tgt_lang: str) -> None:
    """Check a cached tokenizer file, if there is one, before any process starts.

    Raises:
        ValueError: the file cannot be loaded or lacks the course's special tokens; says to delete it
            (the run then trains a new one).
    """
    if not Path(path).exists():
        return
    try:
        CourseTokenizer.load(path, src_lang, tgt_lang)
    except Exception as exc:  # noqa: BLE001 - tokenizers raises plain Exceptions for bad JSON
        raise ValueError(f"the cached tokenizer {path} cannot be used ({str(exc).splitlines()[0][:200]}); delete it "
                         "and the run will train a new one") from None


def get_tokenizer(dataset_dict, workdir: str | os.PathLike, vocab_size: int = 5000, src_lang: str = "de",
                  tgt_lang: str = "en", dataset: str = "multi30k", train_examples: int | None = None) -> CourseTokenizer:
    """The cached tokenizer for this corpus, trained on its ``train`` split if missing.

    In a process group only rank 0 trains; every rank waits at a barrier, then loads
    the same file, so all ranks share one vocabulary.

    Raises:
        ValueError: ``vocab_size`` too small to hold the byte alphabet and special tokens.
    """
    if vocab_size < 300:
        raise ValueError(f"vocab_size {vocab_size} is too small for a byte-level BPE (use >= 300)")
    path = tokenizer_path(workdir, dataset, vocab_size, src_lang, tgt_lang, train_examples)
    rank = dist.get_rank() if dist.is_initialized() else 0
    if rank == 0 and not path.is_file():
        pairs = dataset_dict["train"]["translation"]
        texts = [p[src_lang] for p in pairs] + [p[tgt_lang] for p in pairs]
        train_tokenizer(texts, vocab_size, src_lang, tgt_lang, path)
    if dist.is_initialized():
        dist.barrier()
    return CourseTokenizer.load(path, src_lang, tgt_lang)
