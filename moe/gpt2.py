"""GPT-2 with mixture-of-experts MLPs: every other block's MLP becomes an MoE layer of E GPT-2 MLPs.

As in GShard (Lepikhin et al. 2020, Sec. 2.1) and Switch Transformer (Fedus et al. 2021,
Sec. 2), the feed-forward layer of every other transformer block — blocks 1, 3, 5, ... — is
replaced by an MoE layer (:class:`moe.layer.MoELayer`) whose experts have the shape of the MLP
they replace (:class:`moe.experts.MLPExperts`); attention, layer norms, embeddings and the other
MLPs stay as they are (*dense*). The blocks are ``transformers``' ``GPT2Block`` s, with the MLP
swapped for :class:`MoEMLP`.

Per token, an MoE block runs k experts, so with k = 1 the model computes what the dense GPT-2
computes (plus the router's h x E product), while it holds E times the MLP parameters of those
blocks: parameters grow, FLOPs per token do not (:func:`parameter_counts`).

Every rank builds every expert from the same seed, whatever ``ep``, and keeps its ep rank's
share, so a run at any ep starts from the weights of the one-process model.
"""
from __future__ import annotations

import copy
import math

import torch
from torch import nn

from course.collectives import group_rank, group_size
from moe.config import MoEConfig
from moe.experts import MLPExperts
from moe.layer import MoELayer


def moe_block_indices(n_layer: int, every: int = 2) -> list[int]:
    """The blocks whose MLP is an MoE layer: ``every - 1, 2 * every - 1, ...`` (1, 3, ... for every = 2)."""
    return [i for i in range(n_layer) if i % every == every - 1]


class MoEMLP(nn.Module):
    """Takes the place of a GPT-2 block's MLP: the MoE layer, then the block's residual dropout.

    ``token_mask`` (batch, seq) bool, set by :class:`MoEGPT2` before each forward pass, keeps padding
    out of the routing.
    """

    def __init__(self, moe: MoELayer, dropout: float):
        super().__init__()
        self.moe, self.dropout = moe, nn.Dropout(dropout)
        self.token_mask: torch.Tensor | None = None

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return self.dropout(self.moe(hidden_states, self.token_mask).output)


class MoEGPT2(nn.Module):
    """A ``transformers`` GPT-2 whose MLPs in :func:`moe_block_indices` are MoE layers.

    Args:
        hf_model: a ``GPT2LMHeadModel`` (:func:`course.model.build_gpt2`); modified in place.
        config: the MoE layers' :class:`moe.config.MoEConfig`.
        group: the expert-parallel group (the run's ``mesh.ep_group``); None: the world (one process:
            every expert on this rank).
        seed: the experts and routers are drawn from generators seeded with ``seed`` and the block
            index: the same on every rank and for every ep.
        every: one MoE block in ``every`` blocks.

    Shapes: ``forward(input_ids, attention_mask)``: (batch, seq) -> an output whose ``logits`` are
    (batch, seq, vocab), as ``GPT2LMHeadModel``'s.

    Raises:
        ValueError: no block would hold an MoE layer (``n_layer < every``); the config's checks
            (:meth:`moe.config.MoEConfig.check`).
    """

    def __init__(self, hf_model, config: MoEConfig, group=None, seed: int = 0, every: int = 2):
        super().__init__()
        c = hf_model.config
        self.blocks = moe_block_indices(c.n_layer, every)
        if not self.blocks:
            raise ValueError(f"a GPT-2 of {c.n_layer} blocks with one MoE block in every {every} has no MoE block; "
                             f"use a preset with at least {every} blocks")
        ep = group_size(group)
        config.check(ep)
        self.model, self.config, self.group, self.ep = hf_model, config, group, ep
        rank = group_rank(group) if ep > 1 else 0
        inner = c.n_inner or 4 * c.n_embd
        for i in self.blocks:
            generator = torch.Generator().manual_seed(seed * 1000 + i)
            experts = MLPExperts(config.num_experts, c.n_embd, inner, c.n_layer, generator=generator)
            shared = None
            if config.shared_experts:  # dense: the same on every rank, averaged over dp x cp with the rest
                shared = MLPExperts(1, c.n_embd, inner * config.shared_experts, c.n_layer, generator=generator)
            layer = MoELayer(c.n_embd, config, experts.shard(rank, ep) if ep > 1 else experts, group, generator,
                             shared)
            hf_model.transformer.h[i].mlp = MoEMLP(layer, c.resid_pdrop)

    @property
    def moe_layers(self) -> list[MoELayer]:
        return [self.model.transformer.h[i].mlp.moe for i in self.blocks]

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None):
        mask = attention_mask.bool() if attention_mask is not None else None
        for i in self.blocks:
            self.model.transformer.h[i].mlp.token_mask = mask
        return self.model(input_ids=input_ids, attention_mask=attention_mask)

    def router_loss(self) -> torch.Tensor:
        """The sum over the MoE layers of their weighted router losses (:meth:`moe.layer.MoELayer.router_loss`)."""
        return sum(layer.router_loss() for layer in self.moe_layers)

    def expert_parameters(self) -> list[nn.Parameter]:
        """The parameters of this rank's experts (different on each rank of an ep group)."""
        return [p for layer in self.moe_layers for p in layer.experts.parameters()]

    def dense_parameters(self) -> list[nn.Parameter]:
        """Every other parameter (the same on every rank: attention, norms, embeddings, dense MLPs, routers)."""
        experts = {id(p) for p in self.expert_parameters()}
        return [p for p in self.parameters() if id(p) not in experts]

    def gathered(self) -> "MoEGPT2":
        """A copy of the model holding every expert, for this rank alone (a collective in the ep group).

        Evaluation and greedy decoding run this copy: each rank then decodes its own sentences for as
        many steps as they need, instead of keeping every rank of the ep group in step for every
        all-to-all. It costs the memory of all the experts (fine at the course's sizes).
        """
        if self.ep == 1:
            return self
        memo = {id(self.group): None}  # not copied: the group, and the last losses (non-leaf tensors)
        memo.update({id(t): None for layer in self.moe_layers for t in (layer.aux_loss, layer.z_loss)})
        full = copy.deepcopy(self, memo=memo)
        full.group, full.ep = None, 1
        # ep = 1: every expert is here and the layers never communicate, so their group is never read
        for layer, mine in zip(full.moe_layers, self.moe_layers):
            layer.experts, layer.group, layer.ep = mine.experts.gather(self.group), None, 1
        return full


class DenseGPT2(nn.Module):
    """The dense counterpart of :class:`MoEGPT2`: the same blocks, with the MLP of each would-be MoE block
    ``top_k`` times as wide, so a token meets the same number of parameters in both (the routers
    aside). With ``top_k = 1`` it is the GPT-2 itself.

    It has the interface of :class:`MoEGPT2` (no router loss, no experts), so the same training step
    trains both.

    Args:
        hf_model: a ``GPT2LMHeadModel``; its MLPs in :func:`moe_block_indices` are replaced when top_k > 1.
        top_k: k of the MoE model it stands beside.
        every: as in :class:`MoEGPT2`.
    """

    def __init__(self, hf_model, top_k: int = 1, every: int = 2):
        super().__init__()
        c = hf_model.config
        self.model, self.blocks, self.ep, self.top_k = hf_model, moe_block_indices(c.n_layer, every), 1, top_k
        if top_k > 1:
            from transformers.models.gpt2.modeling_gpt2 import GPT2MLP

            for i in self.blocks:
                mlp = GPT2MLP(top_k * (c.n_inner or 4 * c.n_embd), c)
                with torch.no_grad():  # GPT-2's initialisation (as MLPExperts)
                    mlp.c_proj.weight.normal_(0.0, 0.02 / math.sqrt(2 * c.n_layer))
                hf_model.transformer.h[i].mlp = mlp
        self.moe_layers: list[MoELayer] = []

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None):
        return self.model(input_ids=input_ids, attention_mask=attention_mask)

    def router_loss(self) -> torch.Tensor:
        return torch.zeros((), device=self.model.transformer.wte.weight.device)

    def expert_parameters(self) -> list[nn.Parameter]:
        return []

    def dense_parameters(self) -> list[nn.Parameter]:
        return list(self.parameters())

    def gathered(self) -> "DenseGPT2":
        return self


def parameter_counts(model) -> dict[str, int]:
    """Parameters of the whole model (all E experts, over every rank), and those one token uses
    (:class:`MoEGPT2` or :class:`DenseGPT2`).

    Returns:
        ``{"total", "active_per_token", "experts", "router"}``: ``total`` counts each expert once
        (this rank's experts times ep); ``active_per_token`` counts k experts per MoE layer (a
        token's forward pass touches those, the routers and the dense parameters).
    """
    dense = sum(p.numel() for p in model.dense_parameters())
    if not model.moe_layers:  # a dense model: a token meets every parameter
        return {"total": dense, "experts": 0, "router": 0, "active_per_token": dense}
    mine = sum(p.numel() for p in model.expert_parameters())
    experts = mine * model.ep
    per_expert = experts // (model.config.num_experts * len(model.blocks))
    router = sum(layer.router.weight.numel() for layer in model.moe_layers)
    return {"total": dense + experts, "experts": experts, "router": router,
            "active_per_token": dense + model.config.top_k * len(model.blocks) * per_expert}
