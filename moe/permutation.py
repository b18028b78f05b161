"""Grouping tokens by expert before the experts run, and the gate-weighted sum after.

The router gives each token t a list of k experts. To run every expert once on all of its tokens,
the kept (token, choice) pairs are put in order of their expert — a *permutation* of copies of
the tokens (Megatron-Core's ``permute`` / ``unpermute``; the dispatch and combine tensors of
GShard, Sec. 2.2, written as an index instead of a one-hot einsum). After the experts, each
token's output is the sum over its kept choices of ``gate * expert output`` (Shazeer et al. 2017,
eq. 1); a dropped choice adds nothing.

Pairs are numbered choice-major, ``p = c * T + t`` (token t's c-th choice, of T tokens): the
permutation lists the kept pairs by expert, and within an expert in increasing p — every first
choice in token order, then every second choice — the order in which the capacity filled the
expert's buffer (:mod:`moe.capacity`) and in which ``transformers``' ``MixtralExperts`` takes
an expert's tokens.
"""
from __future__ import annotations

from typing import NamedTuple

import torch


class Permuted(NamedTuple):
    """The kept (token, choice) pairs grouped by expert.

    Attributes:
        tokens: (N, h) a copy of the token of each kept pair, grouped by expert.
        counts: (E,) int64 rows per expert (on the tokens' device); they sum to N.
        source: (N,) int64 the pair ``p = c * T + t`` each row came from (its token: ``p % T``).
    """

    tokens: torch.Tensor
    counts: torch.Tensor
    source: torch.Tensor


def permute(x: torch.Tensor, experts: torch.Tensor, kept: torch.Tensor, num_experts: int) -> Permuted:
    """Copies of the tokens of the kept choices, grouped by expert (expert 0's rows first).

    Args:
        x: (T, h) tokens.
        experts: (T, k) int64 chosen experts.
        kept: (T, k) bool, False for a dropped choice (:func:`moe.capacity.capacity_mask`).
        num_experts: E.

    Returns:
        :class:`Permuted`; differentiable with respect to ``x``.
    """
    tokens = counts = source = None
    # BEGIN ASSIGN5_8_1
    flat = experts.t().reshape(-1)                              # choice-major: p = c * T + t
    pairs = kept.t().reshape(-1).nonzero().squeeze(1)           # kept pairs, in increasing p
    source = pairs[torch.argsort(flat[pairs], stable=True)]     # ... grouped by expert
    tokens = x[source % x.shape[0]]
    counts = torch.bincount(flat[pairs], minlength=num_experts)
    # END ASSIGN5_8_1
    return Permuted(tokens, counts, source)


def unpermute(y: torch.Tensor, source: torch.Tensor, gates: torch.Tensor, num_tokens: int) -> torch.Tensor:
    """The gate-weighted sum of each token's expert outputs.

    Args:
        y: (N, h) expert outputs, row i for pair ``source[i]``.
        source: (N,) int64 pairs ``c * T + t`` (:func:`permute`).
        gates: (T, k) the router's gates.
        num_tokens: T.

    Returns:
        (T, h): ``out[t] = sum over kept c of gates[t, c] * y[row of (t, c)]``; zero for a token
        whose choices were all dropped.
    """
    out = None
    # BEGIN ASSIGN5_8_1
    weights = gates.t().reshape(-1)[source].to(y.dtype)
    out = y.new_zeros(num_tokens, y.shape[1]).index_add(0, source % num_tokens, y * weights[:, None])
    # END ASSIGN5_8_1
    return out
