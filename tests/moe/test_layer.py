"""Assignment 5.8.1, part two — the single-process MoE layer (graded).

* With Mixtral's routing (top-2, normalised gates, dropless) and SwiGLU experts whose weights are
  copied from ``transformers``' ``MixtralSparseMoeBlock`` (built from a tiny ``MixtralConfig``, no
  download), the layer's output, router logits, load-balancing loss and every gradient (input,
  router, experts) equal the block's, to 1e-6.
* With a capacity, every token's output is the sum over its **kept** choices of gate x expert
  output — checked against a loop over tokens that queues the choices itself (first choices
  before second ones, token order within each); a token whose choices were all dropped gets 0.
* Padding (``token_mask`` False) gets a zero output, takes no room in the experts and does not
  count in the losses: the real tokens' outputs and losses are those of the layer on them alone.
"""
from __future__ import annotations

import pytest
import torch

from tests.moe.support import HIDDEN, make_layer, tokens

pytestmark = pytest.mark.a5_8_1

TOL = dict(rtol=1e-6, atol=1e-6)


@pytest.fixture(scope="module")
def mixtral():
    from transformers import MixtralConfig
    from transformers.models.mixtral import modeling_mixtral

    return MixtralConfig, modeling_mixtral


@pytest.mark.parametrize("experts,k", [(4, 2), (8, 2), (8, 1)])
def test_layer_with_mixtral_routing_equals_the_mixtral_block(mixtral, experts, k):
    from moe.config import MoEConfig
    from moe.experts import GatedExperts
    from moe.layer import MoELayer

    config_cls, modeling = mixtral
    hidden, inner = 16, 24
    config = config_cls(hidden_size=hidden, intermediate_size=inner, num_local_experts=experts,
                        num_experts_per_tok=k, router_jitter_noise=0.0)
    torch.manual_seed(experts + k)
    block = modeling.MixtralSparseMoeBlock(config)
    with torch.no_grad():
        for p in block.parameters():
            p.normal_(0.0, 0.3)
    layer = MoELayer(hidden, MoEConfig(experts, k, None, normalize_gates=True), GatedExperts(experts, hidden, inner))
    with torch.no_grad():
        layer.router.weight.copy_(block.gate.weight)
        layer.experts.gate_up_proj.copy_(block.experts.gate_up_proj)
        layer.experts.down_proj.copy_(block.experts.down_proj)
    x = torch.randn(3, 7, hidden, generator=torch.Generator().manual_seed(1))
    grad_out = torch.randn(3, 7, hidden, generator=torch.Generator().manual_seed(2))

    seen = []
    hook = block.gate.register_forward_hook(lambda module, args, out: seen.append(out[0]))
    x_ref = x.clone().requires_grad_(True)
    ref = block(x_ref)
    hook.remove()
    ref_aux = modeling.load_balancing_loss_func((seen[0],), experts, k)
    (ref * grad_out).sum().add(0.1 * ref_aux).backward()

    x_mine = x.clone().requires_grad_(True)
    logits = []
    layer.router.register_forward_hook(lambda module, args, out: logits.append(out.logits))
    out = layer(x_mine).output
    (out * grad_out).sum().add(0.1 * layer.aux_loss).backward()

    assert out.shape == x.shape
    torch.testing.assert_close(out, ref, **TOL, msg="output = MixtralSparseMoeBlock's")
    torch.testing.assert_close(logits[0], seen[0], **TOL, msg="router logits")
    torch.testing.assert_close(layer.aux_loss, ref_aux, **TOL, msg="aux loss = load_balancing_loss_func")
    torch.testing.assert_close(x_mine.grad, x_ref.grad, **TOL, msg="input gradient")
    torch.testing.assert_close(layer.router.weight.grad, block.gate.weight.grad, **TOL, msg="router gradient")
    torch.testing.assert_close(layer.experts.gate_up_proj.grad, block.experts.gate_up_proj.grad, **TOL,
                               msg="experts' gate/up gradient")
    torch.testing.assert_close(layer.experts.down_proj.grad, block.experts.down_proj.grad, **TOL,
                               msg="experts' down gradient")


def naive_moe(layer, x):
    """The layer, one token at a time: softmax over all experts, top-k, gates, the capacity queue
    (all first choices in token order, then all second choices, ...), sum of gate x expert(x_t)."""
    cfg = layer.config
    probs = torch.softmax(x @ layer.router.weight.t(), -1)
    gates, chosen = torch.topk(probs, cfg.top_k, -1)
    if cfg.normalize_gates:
        gates = gates / gates.sum(-1, keepdim=True)
    T = x.shape[0]
    capacity = None if cfg.capacity_factor is None else -(-cfg.capacity_factor * T * cfg.top_k // cfg.num_experts)
    load = [0] * cfg.num_experts
    kept = torch.zeros(T, cfg.top_k, dtype=torch.bool)
    for c in range(cfg.top_k):
        for t in range(T):
            e = int(chosen[t, c])
            if capacity is None or load[e] < capacity:
                load[e] += 1
                kept[t, c] = True
    out = torch.zeros_like(x)
    for t in range(T):
        for c in range(cfg.top_k):
            if kept[t, c]:
                out[t] += gates[t, c] * layer.experts.expert(int(chosen[t, c]), x[t:t + 1])[0]
    return out, kept


@pytest.mark.parametrize("k,normalize,factor", [(1, False, 0.5), (1, False, None), (2, True, 0.75), (2, True, 1.0),
                                                (2, False, 1.25), (3, True, 0.5)])
def test_layer_keeps_only_the_choices_that_fit_and_weights_them_by_their_gates(k, normalize, factor):
    from moe.config import MoEConfig

    layer = make_layer(MoEConfig(6, k, factor, normalize_gates=normalize))
    x = tokens(0, 23) - 0.6
    with torch.no_grad():
        ref, kept = naive_moe(layer, x)
        out = layer(x).output
    if factor is not None and factor < 1:
        assert not kept.all(), "the case must drop choices"
    torch.testing.assert_close(out, ref, **TOL, msg="sum over kept choices of gate x expert output")
    assert int(layer.stats["dropped"]) == int((~kept).sum()), "stats['dropped'] counts the dropped choices"
    fully = ~kept.any(dim=1)
    assert torch.all(out[fully] == 0), "a token whose choices were all dropped gets a zero output"


@pytest.mark.parametrize("factor", [None, 1.0])
def test_experts_that_no_token_chooses_keep_their_place(factor):
    """The last experts get no token (their router rows far below the others'): every expert still has its count,
    0 for those (an expert with no rows is an empty group, not a missing one), and each token's output is the sum of
    its kept choices' gate x expert output."""
    from moe.config import MoEConfig

    layer = make_layer(MoEConfig(6, 2, factor), router="last-unused")
    x = tokens(0, 23)
    with torch.no_grad():
        ref, kept = naive_moe(layer, x)
        out = layer(x).output
    per_expert = layer.stats["per_expert"]
    assert per_expert.shape == (6,) and int(per_expert[-1]) == 0, (
        f"the case must leave the last expert without tokens: tokens per expert {per_expert.tolist()}")
    torch.testing.assert_close(out, ref, **TOL, msg="sum over kept choices of gate x expert output")


def test_router_learns_through_a_top_1_gate():
    from moe.config import MoEConfig

    layer = make_layer(MoEConfig(4, 1, None, normalize_gates=False, aux_loss_coef=0.0, z_loss_coef=0.0))
    layer(tokens(0, 9)).output.sum().backward()
    assert layer.router.weight.grad.abs().max() > 1e-4, "the gate (a softmax probability) carries the router's gradient"


def test_padding_is_not_routed():
    from moe.config import MoEConfig

    layer = make_layer(MoEConfig(4, 2, 1.0))
    x = tokens(0, 2 * 9).view(2, 9, HIDDEN)
    mask = torch.ones(2, 9, dtype=torch.bool)
    mask[0, 6:] = False
    mask[1, 4:] = False
    out = layer(x, mask).output
    aux, z = layer.aux_loss.item(), layer.z_loss.item()
    alone = layer(x[mask]).output
    assert torch.all(out[~mask] == 0), "padding gets a zero output"
    torch.testing.assert_close(out[mask], alone, **TOL, msg="real tokens: as if the padding were not there")
    assert aux == pytest.approx(layer.aux_loss.item(), abs=1e-6) and z == pytest.approx(layer.z_loss.item(), abs=1e-6), \
        "the losses count real tokens only"


def test_forward_returns_the_output_with_its_losses_and_stats():
    """``MoELayer.forward`` returns a ``MoEOutput``: the output and this call's router losses and stats,
    as ``transformers``' MoE blocks return their router logits (the attributes keep the last call's)."""
    from moe.config import MoEConfig
    from moe.layer import MoEOutput

    layer = make_layer(MoEConfig(4, 2, 1.0))
    result = layer(tokens(0, 9))
    assert isinstance(result, MoEOutput) and result.output.shape == (9, HIDDEN)
    assert result.aux_loss is layer.aux_loss and result.z_loss is layer.z_loss and result.stats is layer.stats
    torch.testing.assert_close(result.router_loss, layer.router_loss(), rtol=0, atol=0)  # the same two ops
