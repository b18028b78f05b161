"""The router: which ``top_k`` experts each token goes to, and with what weight (its *gates*).

A linear layer without bias scores every expert for every token (the router *logits*); a
softmax over all experts turns the scores into probabilities, and each token keeps the k
largest (Shazeer et al. 2017, Sec. 2.1; Fedus et al. 2021, Switch Transformer, Sec. 2.1, eq. 1;
Lepikhin et al. 2020, GShard, Algorithm 1; Jiang et al. 2024, Mixtral, Sec. 2.1).

The softmax is taken **before** the top-k, over all experts, and in float32 (Switch
Transformer, Sec. 2.4, "selective precision"): the probabilities of every expert feed the
load-balancing loss (:mod:`moe.losses`), and with k = 1 and un-normalised gates the gate is
that probability, through which the router learns. (For normalised gates, softmax over the k
chosen logits gives the same numbers as normalising the k chosen probabilities, which is why
Mixtral's reference code and ``transformers``' ``MixtralTopKRouter`` agree.)
"""
from __future__ import annotations

from typing import NamedTuple

import torch
from torch import nn


class Routing(NamedTuple):
    """What the router decided for T tokens.

    Attributes:
        logits: (T, E) router scores, in the input's dtype (for the z-loss).
        probs: (T, E) float32 softmax over all E experts (for the load-balancing loss); from the
            DeepSeek router (:mod:`moe.deepseek_router`), each expert's sigmoid score instead.
        gates: (T, k) float32 weights of the chosen experts, largest first.
        experts: (T, k) int64 chosen experts, in the order of ``gates``.
    """

    logits: torch.Tensor
    probs: torch.Tensor
    gates: torch.Tensor
    experts: torch.Tensor


def route(logits: torch.Tensor, top_k: int, normalize_gates: bool = True) -> Routing:
    """Top-k softmax gating of router logits.

    Args:
        logits: (T, E) router scores.
        top_k: experts per token, k (1 <= k <= E).
        normalize_gates: divide each token's k probabilities by their sum (GShard, Mixtral);
            otherwise the gates are the softmax probabilities themselves (Switch Transformer).

    Returns:
        :class:`Routing` with ``probs = softmax(logits.float())`` over all E experts, and the
        k largest of them per token as ``gates`` (normalised or not) with their ``experts``.
    """
    probs = gates = experts = None
    # BEGIN ASSIGN5_8_1
    probs = torch.softmax(logits.float(), dim=-1)
    gates, experts = torch.topk(probs, top_k, dim=-1)
    if normalize_gates:
        gates = gates / gates.sum(dim=-1, keepdim=True)
    # END ASSIGN5_8_1
    return Routing(logits, probs, gates, experts)


class TopKRouter(nn.Module):
    """The router of one MoE layer: ``logits = x W^T`` (no bias), then :func:`route`.

    Args:
        hidden_size: width of the tokens (h).
        num_experts: E.
        top_k: k.
        normalize_gates: see :func:`route`.
        generator: draws the initial weight (normal, std 0.02); None: the global generator.

    Shapes: ``forward(x)``: x (T, h) -> :class:`Routing` of (T, E) and (T, k) tensors.
    """

    def __init__(self, hidden_size: int, num_experts: int, top_k: int, normalize_gates: bool = True,
                 generator: torch.Generator | None = None):
        super().__init__()
        self.top_k, self.normalize_gates = top_k, normalize_gates
        # drawn on the host from a host generator; the module moves with .to(device)
        self.weight = nn.Parameter(torch.randn(num_experts, hidden_size, generator=generator, device="cpu") * 0.02)

    def forward(self, x: torch.Tensor) -> Routing:
        return route(nn.functional.linear(x, self.weight), self.top_k, self.normalize_gates)
