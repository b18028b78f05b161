"""A mixture-of-experts layer: router, capacity, permutation, experts, gate-weighted combine.

``MoELayer(hidden_size, config, experts, group=None)`` maps tokens (..., h) to (..., h) and returns
them with the routing's losses and statistics (:class:`MoEOutput`):

1. the router scores the E experts and picks k per token (:mod:`moe.router`);
2. the capacity drops the choices that do not fit (:mod:`moe.capacity`);
3. the kept choices are grouped by expert (:mod:`moe.permutation`);
4. the experts run — here, or, with an ep group of more than one rank, on the ranks that hold
   them (:mod:`moe.expert_parallel`);
5. each token's output is the gate-weighted sum of its experts' outputs.

``forward`` returns a :class:`MoEOutput`: the output with the two router losses of this call
(:mod:`moe.losses`; ``router_loss`` weights them) and what the router did (``stats``: tokens per
expert before dropping, choices dropped), as ``transformers``' MoE blocks return their router
logits with their output. The layer also keeps the last call's ``aux_loss``, ``z_loss`` and
``stats`` as attributes (:meth:`MoELayer.router_loss`), which a model of several layers sums
(:class:`moe.gpt2.MoEGPT2`). With Mixtral's settings (``top_k=2``, normalised gates, dropless) and
:class:`moe.experts.GatedExperts` its output is ``transformers``' ``MixtralSparseMoeBlock``'s (tests/moe).

With ``config.router == "deepseek"`` the router is DeepSeek-V3's (:mod:`moe.deepseek_router`:
sigmoid scores, a selection-only bias, group-limited routing), the auxiliary loss is its
sequence-wise balance loss, and with ``shared`` experts their output is added to every token's;
with DeepSeek-V3's settings and :class:`moe.experts.GatedExperts` it is ``transformers``'
``DeepseekV3MoE``. Capacity, permutation and expert-parallel dispatch are the same code either way.

Sources: Shazeer et al. 2017 (Sec. 2); Lepikhin et al. 2020 (GShard); Fedus et al. 2021
(Switch Transformer); Jiang et al. 2024 (Mixtral, Sec. 2.1).
"""
from __future__ import annotations

from typing import NamedTuple

import torch
from torch import nn

from course.collectives import group_size
from moe.capacity import capacity_mask, expert_capacity
from moe.config import MoEConfig
from moe.deepseek_router import DeepSeekRouter, add_shared_experts, sequence_balance_loss
from moe.expert_parallel import combine, dispatch
from moe.experts import GroupedExperts
from moe.losses import load_balancing_loss, router_z_loss
from moe.permutation import permute, unpermute
from moe.router import TopKRouter


class MoEOutput(NamedTuple):
    """What :meth:`MoELayer.forward` returns.

    Attributes:
        output: (..., h), the tokens' outputs (zero where ``token_mask`` is False).
        aux_loss: () the load-balancing loss of this call (:func:`moe.losses.load_balancing_loss`).
        z_loss: () the router z-loss of this call (:func:`moe.losses.router_z_loss`).
        router_loss: () ``aux_loss_coef * aux_loss + z_loss_coef * z_loss``: add it to the training loss.
        stats: ``tokens`` routed (int), choices ``dropped`` (() int64), ``per_expert`` (E,) int64 choices
            per expert before dropping.
    """

    output: torch.Tensor
    aux_loss: torch.Tensor
    z_loss: torch.Tensor
    router_loss: torch.Tensor
    stats: dict


class MoELayer(nn.Module):
    """A mixture-of-experts layer (see the module docstring).

    Args:
        hidden_size: token width h.
        config: :class:`moe.config.MoEConfig`.
        experts: this rank's experts: all E of them, or with an ep group of ep ranks the
            ``E / ep`` of its ep rank (:meth:`moe.experts.GroupedExperts.shard`).
        group: the expert-parallel group (the run's ``mesh.ep_group``); None: the world, as everywhere in
            the course (docs/architecture.md, "The parallel functions' API"). Without expert
            parallelism in a run of several ranks, pass a group of one rank (``mesh.ep_group`` when
            ep = 1); in one process None is that group.
        generator: draws the router's initial weight (None: the global generator).
        shared: the shared experts, as one expert (:func:`moe.deepseek_router.add_shared_experts`),
            the same on every rank; None: none. Required when ``config.shared_experts`` > 0.

    Shapes: ``forward(x, token_mask=None)``: x (..., h) -> :class:`MoEOutput` whose ``output`` is
    (..., h); ``token_mask`` (...) bool marks the tokens to route (padding left out: it gets a zero
    output, takes no room in the experts' buffers and does not count in the losses).

    Raises:
        ValueError: ``config.num_experts`` not divisible by the ep group's size, or ``experts``
            not holding ``num_experts / ep`` experts; ``shared`` missing though
            ``config.shared_experts`` > 0, or given though it is 0.
    """

    def __init__(self, hidden_size: int, config: MoEConfig, experts: GroupedExperts, group=None,
                 generator: torch.Generator | None = None, shared: GroupedExperts | None = None):
        super().__init__()
        ep = group_size(group)
        config.check(ep)
        if experts.num_experts * ep != config.num_experts:
            which = "the world (group=None)" if group is None else "the ep group"
            raise ValueError(f"this rank holds {experts.num_experts} experts, but {config.num_experts} experts over "
                             f"the {ep} ranks of {which} means {config.num_experts // ep} each; pass the experts "
                             f"of this ep rank (experts.shard(ep_rank, ep)) and the ep group they are shared in "
                             f"(a group of this rank alone, e.g. mesh.ep_group with ep = 1, for no expert "
                             f"parallelism)")
        self.config, self.group, self.ep = config, group, ep
        if (shared is None) != (config.shared_experts == 0):
            raise ValueError(f"shared_experts={config.shared_experts} but shared experts "
                             f"{'missing' if shared is None else 'given'}: pass shared= exactly when it is > 0")
        if config.router == "deepseek":
            self.router = DeepSeekRouter(hidden_size, config, generator)
        else:
            self.router = TopKRouter(hidden_size, config.num_experts, config.top_k, config.normalize_gates, generator)
        self.experts, self.shared = experts, shared
        self.sequence: torch.Tensor | None = None  # (T,) sequence of each routed token (the balance loss)
        self.aux_loss = self.z_loss = None
        self.stats: dict = {}

    def forward(self, x: torch.Tensor, token_mask: torch.Tensor | None = None) -> MoEOutput:
        shape = x.shape
        x = x.reshape(-1, shape[-1])
        rows = torch.arange(x.shape[0], device=x.device) // (shape[-2] if len(shape) > 2 else x.shape[0] or 1)
        if token_mask is None:
            self.sequence = rows
            out = self._moe(x).view(shape)
        else:
            index = token_mask.reshape(-1).nonzero().squeeze(1)
            self.sequence = rows[index]
            out = x.new_zeros(x.shape).index_copy(0, index, self._moe(x[index])).view(shape)
        return MoEOutput(out, self.aux_loss, self.z_loss, self.router_loss(), self.stats)

    def _moe(self, x: torch.Tensor) -> torch.Tensor:
        """The layer on (T, h) tokens that are all routed."""
        cfg, num_tokens = self.config, x.shape[0]
        routing = self.router(x)
        kept = capacity_mask(routing.experts, cfg.num_experts,
                             expert_capacity(num_tokens, cfg.num_experts, cfg.top_k, cfg.capacity_factor))
        if num_tokens and cfg.router == "deepseek":  # sigmoid scores: no z-loss
            self.aux_loss = sequence_balance_loss(routing.probs, routing.experts, self.sequence,
                                                  int(self.sequence.max()) + 1)
            self.z_loss = routing.probs.sum() * 0.0
        elif num_tokens:
            self.aux_loss = load_balancing_loss(routing.probs, routing.experts, cfg.num_experts)
            self.z_loss = router_z_loss(routing.logits)
        else:  # no token here (all padding): nothing to balance, but the graph stays connected
            self.aux_loss = self.z_loss = routing.probs.sum() * 0.0
        self.stats = {"tokens": num_tokens, "dropped": (~kept).sum().detach(),
                      "per_expert": torch.bincount(routing.experts.reshape(-1), minlength=cfg.num_experts).detach()}
        permuted = permute(x, routing.experts, kept, cfg.num_experts)
        if self.ep == 1:
            y = self.experts(permuted.tokens, permuted.counts)
        else:
            rows, local_counts, state = dispatch(permuted.tokens, permuted.counts, self.group)
            y = combine(self.experts(rows, local_counts), state, self.group)
        out = unpermute(y, permuted.source, routing.gates, num_tokens)
        return out if self.shared is None else add_shared_experts(out, x, self.shared)

    def router_loss(self) -> torch.Tensor:
        """``aux_loss_coef * load-balancing loss + z_loss_coef * z-loss`` of the last forward pass.

        Raises:
            RuntimeError: before any forward pass.
        """
        if self.aux_loss is None:
            raise RuntimeError("router_loss() needs a forward pass first")
        return self.config.aux_loss_coef * self.aux_loss + self.config.z_loss_coef * self.z_loss
