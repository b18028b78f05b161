"""The training objective of the course: next-token cross-entropy on the target tokens.

A translation pair is one sequence ``source <eos_src> target <eos_tgt>``
(:mod:`course.collate`); ``labels`` is -100 on the source, ``<eos_src>`` and padding, so
the loss is taken on the target tokens and ``<eos_tgt>`` only.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from course.collate import IGNORE_INDEX


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


def model_loss(model, batch: dict) -> torch.Tensor:
    """``lm_loss`` of a model that maps ``(input_ids, attention_mask)`` to an output with ``.logits``."""
    out = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"])
    logits = out.logits if hasattr(out, "logits") else out
    return lm_loss(logits, batch["labels"])
