"""Expert capacity and token dropping (Fedus et al. 2021, Switch Transformer, Sec. 2.2; Lepikhin et al.
2020, GShard, Sec. 2.2 and Algorithm 1).

An expert runs on a buffer of a fixed size, its *capacity*, so that the work of a step is known
before the router has decided anything (every expert's matrix product has the same shape):

    capacity = ceil(capacity_factor * T * k / E)

for T tokens that each make k choices among E experts: a factor of 1 leaves room for exactly
an even share. A token's choice that finds its expert's buffer full is **dropped**: that
expert does not process the token, and in a transformer the token goes on through the residual
connection alone. Choices queue in the order GShard fills the buffers: every token's first
choice, in token order, before any second choice (so a token loses its second expert before
another token loses its first). *Dropless* routing (``capacity_factor`` None; Gale et al.
2023, MegaBlocks) keeps every choice and lets the experts' buffers differ in size.
"""
from __future__ import annotations

import math

import torch


def expert_capacity(num_tokens: int, num_experts: int, top_k: int, capacity_factor: float | None) -> int | None:
    """Tokens each expert may take: ``ceil(capacity_factor * num_tokens * top_k / num_experts)``.

    Args:
        num_tokens: T, the tokens routed together (one rank's batch).
        num_experts: E.
        top_k: choices per token, k.
        capacity_factor: > 0; None: dropless (returns None).

    Returns:
        The capacity (tokens per expert), or None when dropless.
    """
    if capacity_factor is None:
        return None
    capacity = None
    # BEGIN ASSIGN5_8_1
    capacity = math.ceil(capacity_factor * num_tokens * top_k / num_experts)
    # END ASSIGN5_8_1
    return capacity


def capacity_mask(experts: torch.Tensor, num_experts: int, capacity: int | None) -> torch.Tensor:
    """Which choices fit in their expert's buffer.

    Args:
        experts: (T, k) int64, the experts each token chose (column 0: its first choice).
        num_experts: E.
        capacity: tokens per expert (:func:`expert_capacity`); None keeps every choice.

    Returns:
        (T, k) bool, True where the choice is kept. An expert keeps the first ``capacity``
        choices that name it in the order: every token's first choice in token order, then every
        token's second choice in token order, and so on.
    """
    if capacity is None:
        return torch.ones_like(experts, dtype=torch.bool)
    kept = None
    # BEGIN ASSIGN5_8_1
    queue = experts.t().reshape(-1)                                # choice-major: all first choices, then seconds
    one_hot = torch.nn.functional.one_hot(queue, num_experts)      # (k*T, E)
    position = (one_hot.cumsum(dim=0) * one_hot).sum(dim=1) - 1    # place of each choice in its expert's queue
    kept = (position < capacity).view(experts.shape[1], experts.shape[0]).t()
    # END ASSIGN5_8_1
    return kept
