"""The router's two auxiliary losses: load balancing (Switch Transformer) and the z-loss (ST-MoE).

**Load balancing** (Fedus et al. 2021, Switch Transformer, Sec. 2.2, eqs. 4-6). Left alone, a
router tends to send most tokens to the few experts that happen to learn first, which then
learn faster still; the others idle, and with a capacity their tokens are dropped. For T tokens,
E experts and k choices per token,

    loss = E * sum_i f_i * P_i,

    f_i = (choices that name expert i) / T        (the fraction of tokens dispatched to i;
                                                    the f_i sum to k)
    P_i = (1/T) sum_t softmax(logits_t)_i          (the mean router probability of i).

f_i comes from an arg-top-k and has no gradient; through P_i the loss pushes probability away
from the experts that get many tokens. With every expert equally loaded and equally likely it is
k (its minimum for a router that spreads its probability evenly); the Switch Transformer paper
(k = 1) scales it by alpha = 0.01. The normalisation, f counting every choice, is that of
``transformers``' ``load_balancing_loss_func`` (Mixtral); Megatron-Core divides by k as well.

**z-loss** (Zoph et al. 2022, ST-MoE, Sec. 3.1, eq. 5): the mean over tokens of
``(log sum_j exp(logits_tj))^2``. It keeps the router's logits small, where the float32
softmax and exponentials stay accurate (ST-MoE uses a weight of 0.001).
"""
from __future__ import annotations

import torch


def load_balancing_loss(probs: torch.Tensor, experts: torch.Tensor, num_experts: int) -> torch.Tensor:
    """Switch Transformer's auxiliary loss ``E * sum_i f_i * P_i`` (see the module docstring).

    Args:
        probs: (T, E) float32 router probabilities (softmax over all experts).
        experts: (T, k) int64 chosen experts (before any dropping).
        num_experts: E.

    Returns:
        A float32 scalar; its gradient flows through ``probs`` only.
    """
    loss = None
    # BEGIN ASSIGN5_8_1
    num_tokens = probs.shape[0]
    f = torch.bincount(experts.reshape(-1), minlength=num_experts).to(probs.dtype) / num_tokens
    p = probs.mean(dim=0)
    loss = num_experts * (f * p).sum()
    # END ASSIGN5_8_1
    return loss


def router_z_loss(logits: torch.Tensor) -> torch.Tensor:
    """ST-MoE's z-loss: the mean over the T tokens of ``logsumexp(logits_t)^2``.

    Args:
        logits: (T, E) router scores (computed in float32).

    Returns:
        A float32 scalar.
    """
    loss = None
    # BEGIN ASSIGN5_8_1
    loss = torch.logsumexp(logits.float(), dim=-1).square().mean()
    # END ASSIGN5_8_1
    return loss
