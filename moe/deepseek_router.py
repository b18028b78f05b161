"""DeepSeek-V3's router: sigmoid affinities, a bias for selection only, group-limited routing, shared experts.

DeepSeek-V3 technical report (DeepSeek-AI 2024, arXiv 2412.19437), Sec. 2.1.2; DeepSeekMoE (Dai et
al. 2024) for the shared experts. For T tokens, E routed experts and k choices per token:

* **Affinities** (eq. 15): ``s_{t,i} = sigmoid(u_t . e_i)``, each expert scored on its own (not a
  softmax over the experts), in float32.
* **Selection with a bias** (eq. 16 with the "Auxiliary-Loss-Free Load Balancing" paragraph): the k
  experts of token t are the k largest ``s_{t,i} + b_i``. The bias ``b`` only decides *which*
  experts; the gate of a chosen expert is computed from its unbiased ``s_{t,i}``.
* **Gates** (eq. 13): the chosen affinities divided by their sum over the **k chosen** experts
  (``normalize``), then multiplied by the routed scaling factor (2.5 in DeepSeek-V3's released
  configuration; ``transformers``' ``routed_scaling_factor``).
* **Node-limited routing** ("Node-Limited Routing", Sec. 2.1.2; the released code's ``n_group`` /
  ``topk_group``): the E experts form ``n_group`` equal groups (the experts of one node); each
  group is scored by the sum of its two largest biased affinities, a token keeps its ``topk_group``
  best groups, and its k experts are chosen inside them. A token's rows then travel to at most
  ``topk_group`` nodes.
* **Bias update** (Sec. 2.1.2, "Auxiliary-Loss-Free Load Balancing"): at the end of each step, with
  ``c_i`` the tokens expert i received in that step, ``b_i`` is decreased by gamma if expert i is
  overloaded and increased by gamma if it is underloaded: ``b_i += gamma * sign(mean(c) - c_i)``.
* **Sequence-wise balance loss** (eq. 17-20), a small complement: ``sum_i f_i P_i`` with
  ``f_i = E / (k T) * #{t : i chosen by t}`` and ``P_i = (1/T) sum_t s_{t,i} / sum_j s_{t,j}``, over
  the tokens of one sequence, averaged over sequences (weighted by ``MoEConfig.aux_loss_coef``).
  "Chosen" is the k experts a token is actually routed to, after the bias and the group limit. Eq. 18
  read literally counts instead the k largest *unbiased* affinities over all experts
  (``1(s_{i,t} in Topk({s_{j,t}}, K_r))``), as Megatron-Core's ``compute_routing_scores_for_aux_loss``
  does; the two agree while the bias is zero and ``n_group = 1``. Counted as routed here because f_i
  stands for expert i's share of the tokens — the load the loss balances, which ``updated_bias`` counts
  and the all-to-all carries. f_i is a count (no gradient), so the choice moves which ``P_i`` the loss
  pushes down, not its form.
* **Shared experts** (DeepSeekMoE, eq. 3; DeepSeek-V3 eq. 12): every token also passes through the
  shared experts, whose output is added to the gate-weighted sum of its routed experts' outputs.

``transformers``' ``DeepseekV3TopkRouter`` and ``DeepseekV3MoE`` compute the same (tests/moe).
"""
from __future__ import annotations

import torch
from torch import nn

from course.collectives import all_reduce
from moe.router import Routing


def deepseek_route(logits: torch.Tensor, bias: torch.Tensor, top_k: int, n_group: int = 1, topk_group: int = 1,
                   routed_scaling_factor: float = 1.0, normalize: bool = True) -> Routing:
    """DeepSeek-V3's top-k sigmoid gating with a selection bias and group-limited routing.

    Args:
        logits: (T, E) router scores ``u_t . e_i``.
        bias: (E,) float32 selection bias b (no gradient; added for the choice only).
        top_k: k, experts per token.
        n_group: groups of ``E / n_group`` consecutive experts (1: no groups).
        topk_group: groups a token may choose from (``n_group``: no limit).
        routed_scaling_factor: multiplies the gates.
        normalize: divide the k chosen affinities by their sum (DeepSeek-V3) before scaling.

    Returns:
        :class:`moe.router.Routing` with ``probs`` the (T, E) float32 sigmoid affinities (unbiased),
        ``gates`` (T, k) float32 and ``experts`` (T, k) int64, ordered by biased affinity, largest first.
        The gates are differentiable with respect to ``logits``.
    """
    scores = gates = experts = None
    # BEGIN ASSIGN5_8_4
    scores = torch.sigmoid(logits.float())
    choice = scores.detach() + bias.float()
    if n_group > 1:
        num_tokens, num_experts = choice.shape
        grouped = choice.view(num_tokens, n_group, num_experts // n_group)
        group_scores = grouped.topk(min(2, grouped.shape[-1]), dim=-1).values.sum(dim=-1)   # (T, n_group)
        best_groups = group_scores.topk(topk_group, dim=-1).indices
        allowed = torch.zeros_like(group_scores, dtype=torch.bool).scatter_(1, best_groups, True)
        choice = choice.masked_fill(~allowed.repeat_interleave(num_experts // n_group, dim=1), float("-inf"))
    experts = choice.topk(top_k, dim=-1).indices
    gates = scores.gather(1, experts)
    if normalize:
        gates = gates / gates.sum(dim=-1, keepdim=True)
    gates = gates * routed_scaling_factor
    # END ASSIGN5_8_4
    return Routing(logits, scores, gates, experts)


def updated_bias(bias: torch.Tensor, load: torch.Tensor, gamma: float) -> torch.Tensor:
    """The selection bias after one step of auxiliary-loss-free balancing (DeepSeek-V3, Sec. 2.1.2).

    Args:
        bias: (E,) float32 the bias b before the step.
        load: (E,) tokens each expert received during the step (summed over every rank that routed
            tokens with this bias, so that every rank computes the same update).
        gamma: the bias update speed (DeepSeek-V3: 0.001 for most of training).

    Returns:
        (E,) float32 ``b + gamma * sign(mean(load) - load)``: overloaded experts lose gamma,
        underloaded ones gain it, experts exactly at the mean keep their bias.
    """
    new = None
    # BEGIN ASSIGN5_8_4
    load = load.to(torch.float32)
    new = bias.float() + gamma * torch.sign(load.mean() - load)
    # END ASSIGN5_8_4
    return new


def add_shared_experts(routed: torch.Tensor, x: torch.Tensor, shared) -> torch.Tensor:
    """The MoE output of T tokens: their routed experts' combined output plus the shared experts' output.

    Args:
        routed: (T, h) gate-weighted sum of each token's routed experts' outputs.
        x: (T, h) the tokens.
        shared: :class:`moe.experts.GroupedExperts` holding the shared experts as one expert (N
            shared experts of width f are one of width N f: their outputs' sum is its output).

    Returns:
        (T, h).
    """
    out = None
    # BEGIN ASSIGN5_8_4
    out = routed + shared(x, [x.shape[0]])
    # END ASSIGN5_8_4
    return out


def sequence_balance_loss(scores: torch.Tensor, experts: torch.Tensor, sequence: torch.Tensor,
                          num_sequences: int) -> torch.Tensor:
    """DeepSeek-V3's complementary sequence-wise balance loss (eq. 17-20), averaged over sequences.

    Args:
        scores: (T, E) float32 sigmoid affinities s (the gradient flows through them).
        experts: (T, k) int64 chosen experts.
        sequence: (T,) int64 the sequence (0 .. num_sequences - 1) of each token.
        num_sequences: S.

    ``f_i`` counts the experts in ``experts`` (those the tokens were routed to, bias and group limit
    included), not eq. 18's top-k of the unbiased scores: see the module docstring.

    Returns:
        A float32 scalar, ``(1/S') sum_seq sum_i f_i P_i`` over the S' sequences that hold tokens
        (1 for a perfectly balanced sequence, up to E / k for one that sends everything to k experts).
    """
    num_tokens, num_experts = scores.shape
    k = experts.shape[1]
    per_seq = torch.bincount(sequence, minlength=num_sequences).to(scores.dtype)                      # (S,)
    chosen = torch.bincount((sequence[:, None] * num_experts + experts).reshape(-1),
                            minlength=num_sequences * num_experts).view(num_sequences, num_experts).to(scores.dtype)
    held = per_seq > 0
    f = chosen[held] * num_experts / (k * per_seq[held, None])
    normalised = scores / scores.sum(dim=-1, keepdim=True)
    p = scores.new_zeros(num_sequences, num_experts).index_add(0, sequence, normalised)[held] / per_seq[held, None]
    return (f * p).sum(dim=-1).mean()


class DeepSeekRouter(nn.Module):
    """The router of one DeepSeek-style MoE layer: ``logits = x W^T`` (no bias term), then :func:`deepseek_route`.

    Args:
        hidden_size: h.
        config: :class:`moe.config.MoEConfig` with ``router="deepseek"``.
        generator: draws the initial weight (normal, std 0.02); None: the global generator.

    Holds the selection bias as a buffer ``e_score_correction_bias`` (E,) float32 (the name
    ``transformers`` and DeepSeek's checkpoints use), and ``load`` (E,) float64, the tokens each
    expert received in training mode (with a bias update speed) since the last :meth:`update_bias` (None: none yet).

    Shapes: ``forward(x)``: x (T, h) -> :class:`moe.router.Routing` of (T, E) and (T, k) tensors.
    """

    def __init__(self, hidden_size: int, config, generator: torch.Generator | None = None):
        super().__init__()
        self.config = config
        self.weight = nn.Parameter(torch.randn(config.num_experts, hidden_size, generator=generator, device="cpu")
                                   * 0.02)
        self.register_buffer("e_score_correction_bias",
                             torch.zeros(config.num_experts, dtype=torch.float32, device="cpu"))
        self.load: torch.Tensor | None = None  # float64 whatever the module's dtype: counts stay exact

    def forward(self, x: torch.Tensor) -> Routing:
        c = self.config
        routing = deepseek_route(nn.functional.linear(x, self.weight), self.e_score_correction_bias, c.top_k,
                                 c.n_group, c.topk_group, c.routed_scaling_factor, c.normalize_gates)
        if self.training and c.router_bias_update > 0:
            counts = torch.bincount(routing.experts.reshape(-1), minlength=c.num_experts).to(torch.float64)
            self.load = counts if self.load is None else self.load + counts
        return routing

    @torch.no_grad()
    def update_bias(self, group=None) -> None:
        """One step of auxiliary-loss-free balancing with ``config.router_bias_update`` as gamma.

        Sums ``load`` over ``group`` (the ranks that routed this step's tokens: dp x cp; an
        all-reduce, so every rank applies the same update), updates the bias, and resets ``load``.
        """
        bias = self.e_score_correction_bias
        load = self.load if self.load is not None else torch.zeros(bias.shape, dtype=torch.float64,
                                                                     device=bias.device)
        load = all_reduce(load, group=group)
        bias.copy_(updated_bias(bias, load, self.config.router_bias_update))
        self.load = None
