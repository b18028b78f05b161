"""Everything a rank needs before it trains: corpus, tokenizer, encoded splits, collate, model.

Run scripts call :func:`prepare_data` inside each worker (rank 0 trains the tokenizer,
the others wait), then build their model with :func:`build_model`.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from course.collate import Collate, EncodedPairs, make_collate
from course.data import load_translation_dataset
from course.model import build_gpt2
from course.tokenizer import CourseTokenizer, get_tokenizer


@dataclass
class Data:
    """The splits (:class:`course.collate.EncodedPairs`: each pair tokenized when first read) and their collate."""

    tokenizer: CourseTokenizer
    train: EncodedPairs
    validation: EncodedPairs
    test: EncodedPairs
    collate: Collate


def prepare_data(config) -> Data:
    """Load the corpus, get the (cached) tokenizer, and make every split a dataset tokenized as it is read.

    ``config`` is the run's configuration (:class:`course.config.RunConfig`).
    """
    Path(config.workdir).mkdir(parents=True, exist_ok=True)
    corpus = load_translation_dataset(config.dataset, config.data_dir, config.src_lang, config.tgt_lang)
    first = config.max_train_examples
    if first is not None and first < len(corpus["train"]):  # quick runs and tests: a slice of the training pairs
        corpus["train"] = corpus["train"].select(range(first))
    tokenizer = get_tokenizer(corpus, config.workdir, config.vocab_size, config.src_lang, config.tgt_lang, config.dataset,
                              train_examples=first)
    splits = {name: EncodedPairs(corpus[name], tokenizer, config.src_lang, config.tgt_lang)
              for name in ("train", "validation", "test")}
    return Data(tokenizer, splits["train"], splits["validation"], splits["test"],
                make_collate(tokenizer, config.model_max_length))


def build_model(config, vocab_size: int, **overrides):
    """The GPT-2 of ``config.preset`` (dropout ``config.dropout``) with the same initial weights on every rank (seeded)."""
    return build_gpt2(config.preset, vocab_size, n_positions=config.model_max_length, dropout=config.dropout,
                      seed=config.seed, **overrides)


def worker_env_quiet() -> None:
    """Silence library chatter that would repeat once per rank."""
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
