"""Assignment 5.8.1, part one — the router, the capacity and the two router losses (graded).

Checked against ``transformers`` wherever it has the same thing, to 1e-6:

* top-2 gating with normalised gates = ``MixtralTopKRouter`` (scores and indices);
* top-1 gating with the probability as gate = ``SwitchTransformersTop1Router`` (Switch
  Transformer): the gate is the softmax over **all** experts, so the router learns through it;
* token dropping at a capacity = ``SwitchTransformersTop1Router``'s dispatch mask; with top-2,
  every token's first choice queues before any second choice (GShard);
* the load-balancing loss = Mixtral's and Switch Transformer's ``load_balancing_loss_func``
  (value and gradient, with and without padding);
* the z-loss = Switch Transformer's ``router_z_loss_func`` (value and gradient).

``transformers`` is imported in this process only (no ranks are started here).
"""
from __future__ import annotations

import math

import pytest
import torch

pytestmark = pytest.mark.a5_8_1

TOL = dict(rtol=1e-6, atol=1e-6)


@pytest.fixture(scope="module")
def hf():
    from transformers import MixtralConfig, SwitchTransformersConfig
    from transformers.models.mixtral import modeling_mixtral
    from transformers.models.switch_transformers import modeling_switch_transformers

    return {"MixtralConfig": MixtralConfig, "mixtral": modeling_mixtral, "SwitchConfig": SwitchTransformersConfig,
            "switch": modeling_switch_transformers}


def logits(tokens=37, experts=8, seed=0, scale=2.0):
    return torch.randn(tokens, experts, generator=torch.Generator().manual_seed(seed)) * scale


@pytest.mark.parametrize("experts,k", [(4, 2), (8, 2), (8, 3)])
def test_top_k_gating_with_normalised_gates_equals_the_mixtral_router(hf, experts, k):
    from moe.router import TopKRouter

    config = hf["MixtralConfig"](hidden_size=16, num_local_experts=experts, num_experts_per_tok=k)
    theirs = hf["mixtral"].MixtralTopKRouter(config)
    mine = TopKRouter(16, experts, k, normalize_gates=True)
    with torch.no_grad():
        theirs.weight.normal_(0.0, 1.0, generator=torch.Generator().manual_seed(experts))
        mine.weight.copy_(theirs.weight)
    x = torch.randn(29, 16, generator=torch.Generator().manual_seed(1))
    ref_logits, ref_scores, ref_index = theirs(x)
    routing = mine(x)
    torch.testing.assert_close(routing.logits, ref_logits, **TOL, msg="router logits = x W^T")
    torch.testing.assert_close(routing.probs, torch.softmax(ref_logits.float(), -1), **TOL,
                               msg="probs: the softmax over all experts")
    assert torch.equal(routing.experts, ref_index), "chosen experts differ from Mixtral's (top-k of the softmax)"
    torch.testing.assert_close(routing.gates, ref_scores, **TOL, msg="gates: the top-k probabilities, normalised")


def test_top_1_gate_is_the_softmax_probability_as_in_switch_transformer(hf):
    """With k = 1 and un-normalised gates the gate is the probability of the chosen expert among all
    experts (a softmax taken after the top-1 would make every gate 1 and the router unlearnable)."""
    from moe.router import route

    config = hf["SwitchConfig"](d_model=16, num_experts=8, expert_capacity=64, router_jitter_noise=0.0,
                                router_dtype="float32")
    theirs = hf["switch"].SwitchTransformersTop1Router(config)
    with torch.no_grad():
        theirs.classifier.weight.normal_(0.0, 0.2, generator=torch.Generator().manual_seed(3))
    x = torch.randn(1, 40, 16, generator=torch.Generator().manual_seed(4))
    dispatch, ref_probs, ref_logits = theirs(x)
    routing = route(ref_logits[0], 1, normalize_gates=False)
    assert torch.equal(routing.experts[:, 0], dispatch[0].argmax(-1)), "top-1 expert differs from Switch's argmax"
    torch.testing.assert_close(routing.gates, ref_probs[0], **TOL, msg="gate = softmax probability of the top expert")
    assert (routing.gates < 0.999).all(), "a top-1 gate must not be normalised to 1"


def test_gates_carry_the_gradient_of_the_softmax_over_all_experts():
    from moe.router import route

    z = logits(11, 6, seed=5).requires_grad_(True)
    g = route(z, 2, normalize_gates=False).gates
    (g * torch.arange(1.0, 3.0)).sum().backward()
    ref_z = z.detach().clone().requires_grad_(True)
    ref = torch.topk(torch.softmax(ref_z, -1), 2, dim=-1).values
    (ref * torch.arange(1.0, 3.0)).sum().backward()
    torch.testing.assert_close(z.grad, ref_z.grad, **TOL, msg="d gates / d logits")


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("normalize", [True, False])
def test_softmax_of_low_precision_logits_is_taken_in_float32(dtype, normalize):
    """bf16 / fp16 router logits (a model trained in mixed precision): the softmax is taken in float32
    (Switch Transformer, Sec. 2.4, "selective precision"; ``route``'s docstring), so ``probs`` and
    ``gates`` are float32 and equal the float32 softmax of the logits' values; the logits stay as given.

    Tolerance: the 16-bit logits are exactly representable in float32, so the float32 softmax over 8
    experts (an exp, a sum of 8, a division) is within a few float32 ulps of the exact one, relative
    error below 1e-6. A softmax taken in the logits' dtype and cast afterwards is rounded to 8 (bf16) or
    11 (fp16) significant bits, relative error up to 2**-9 = 2e-3 or 2**-11 = 4.9e-4 in its largest
    probabilities: far outside."""
    from moe.router import route

    z = logits(23, 8, seed=9, scale=3.0).to(dtype)
    routing = route(z, 2, normalize_gates=normalize)
    assert routing.logits.dtype == dtype, "Routing.logits are the logits as given, in their own dtype"
    assert routing.probs.dtype == torch.float32, (
        f"probs are {routing.probs.dtype} for {dtype} logits: take the softmax in float32 (logits.float())")
    assert routing.gates.dtype == torch.float32, f"gates are {routing.gates.dtype}; they are float32"
    want = torch.softmax(z.float(), dim=-1)
    torch.testing.assert_close(routing.probs, want, **TOL,
                               msg=lambda m: f"probs of {dtype} logits differ from the float32 softmax: {m}")
    top = torch.topk(want, 2, dim=-1).values
    if normalize:
        top = top / top.sum(dim=-1, keepdim=True)
    torch.testing.assert_close(routing.gates, top, **TOL,
                               msg=lambda m: f"gates of {dtype} logits differ from the float32 softmax's top 2: {m}")


@pytest.mark.parametrize("tokens,experts,k,factor", [(10, 4, 2, 1.0), (10, 4, 2, 1.25), (64, 8, 1, 1.0),
                                                     (64, 8, 1, 0.5), (7, 3, 2, 2.0), (100, 16, 2, 1.1)])
def test_expert_capacity_is_the_factor_times_an_even_share_rounded_up(tokens, experts, k, factor):
    from moe.capacity import expert_capacity

    assert expert_capacity(tokens, experts, k, factor) == math.ceil(factor * tokens * k / experts)
    assert expert_capacity(tokens, experts, k, None) is None, "no capacity factor: dropless"


@pytest.mark.parametrize("capacity", [1, 3, 5, 40])
def test_top_1_token_dropping_equals_switch_transformer(hf, capacity):
    from moe.capacity import capacity_mask

    config = hf["SwitchConfig"](d_model=16, num_experts=4, expert_capacity=capacity, router_jitter_noise=0.0,
                                router_dtype="float32")
    theirs = hf["switch"].SwitchTransformersTop1Router(config)
    with torch.no_grad():
        theirs.classifier.weight.normal_(0.0, 1.0, generator=torch.Generator().manual_seed(capacity))
    x = torch.randn(1, 40, 16, generator=torch.Generator().manual_seed(6))
    dispatch, _, ref_logits = theirs(x)
    experts = ref_logits[0].argmax(-1, keepdim=True)
    kept = capacity_mask(experts, 4, capacity)
    assert kept.shape == (40, 1) and kept.dtype == torch.bool
    assert torch.equal(kept[:, 0], dispatch[0].sum(-1).bool()), (
        f"capacity {capacity}: the first {capacity} tokens of each expert (in token order) are kept, the rest dropped")


def test_first_choices_queue_before_second_choices():
    from moe.capacity import capacity_mask

    experts = torch.tensor([[0, 1], [0, 1], [1, 0], [1, 0]])
    # expert 0's queue: t0 (1st), t1 (1st), t2 (2nd), t3 (2nd); expert 1's: t2 (1st), t3 (1st), t0 (2nd), t1 (2nd)
    kept = capacity_mask(experts, 2, 3)
    assert kept.tolist() == [[True, True], [True, False], [True, True], [True, False]], kept.tolist()
    assert capacity_mask(experts, 2, 2).tolist() == [[True, False], [True, False], [True, False], [True, False]]
    assert capacity_mask(experts, 2, None).all(), "dropless keeps every choice"
    many = torch.randint(0, 5, (50, 2), generator=torch.Generator().manual_seed(0))
    for capacity in (1, 7, 12):
        kept = capacity_mask(many, 5, capacity)
        per_expert = torch.zeros(5, dtype=torch.long).index_add_(0, many[kept], torch.ones(int(kept.sum()), dtype=torch.long))
        wanted = torch.bincount(many.reshape(-1), minlength=5).clamp(max=capacity)
        assert torch.equal(per_expert, wanted), f"capacity {capacity}: each expert keeps min(load, capacity) choices"


@pytest.mark.parametrize("experts,k", [(4, 1), (4, 2), (8, 2), (6, 3)])
@pytest.mark.parametrize("padded", [False, True], ids=["all-tokens", "padding-left-out"])
def test_load_balancing_loss_equals_the_mixtral_one(hf, experts, k, padded):
    from moe.losses import load_balancing_loss
    from moe.router import route

    z = logits(48, experts, seed=experts * 10 + k)
    z[:20] += torch.linspace(0, 3, experts)  # unbalanced: some experts more likely
    mask = (torch.arange(48) % 7 != 3) if padded else torch.ones(48, dtype=torch.bool)
    ref_z = z.clone().requires_grad_(True)
    ref = hf["mixtral"].load_balancing_loss_func((ref_z,), experts, k, mask[None, :] if padded else None)
    ref.backward()
    mine_z = z.clone().requires_grad_(True)
    kept = mine_z[mask]
    routing = route(kept, k)
    loss = load_balancing_loss(routing.probs, routing.experts, experts)
    loss.backward()
    torch.testing.assert_close(loss, ref, **TOL, msg="E * sum_i f_i P_i, f_i counting every choice")
    torch.testing.assert_close(mine_z.grad, ref_z.grad, **TOL, msg="gradient through the mean probabilities only")


def test_load_balancing_loss_equals_switch_transformers_for_top_1(hf):
    from moe.losses import load_balancing_loss

    z = logits(40, 8, seed=9)
    probs = torch.softmax(z, -1)
    experts = probs.argmax(-1, keepdim=True)
    ref = hf["switch"].load_balancing_loss_func(probs[None], experts[None, :, 0])
    torch.testing.assert_close(load_balancing_loss(probs, experts, 8), ref, **TOL)


@pytest.mark.parametrize("k", [1, 2, 4])
def test_even_routing_gives_a_load_balancing_loss_of_k(k):
    from moe.losses import load_balancing_loss

    experts = 8
    probs = torch.full((16, experts), 1.0 / experts)
    chosen = (torch.arange(16)[:, None] * k + torch.arange(k)) % experts  # every expert chosen equally often
    assert load_balancing_loss(probs, chosen, experts).item() == pytest.approx(k, abs=1e-6)


def test_z_loss_equals_switch_transformers(hf):
    from moe.losses import router_z_loss

    z = logits(33, 8, seed=2, scale=4.0)
    ref_z = z.clone().requires_grad_(True)
    ref = hf["switch"].router_z_loss_func(ref_z[None])
    ref.backward()
    mine_z = z.clone().requires_grad_(True)
    loss = router_z_loss(mine_z)
    loss.backward()
    torch.testing.assert_close(loss, ref, **TOL, msg="mean over tokens of logsumexp(logits)^2")
    torch.testing.assert_close(mine_z.grad, ref_z.grad, **TOL)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_z_loss_of_low_precision_logits_is_taken_in_float32(dtype):
    """bf16 / fp16 router logits: the z-loss is a float32 scalar (``router_z_loss``'s docstring), equal to the z-loss
    of the logits' float32 values. Tolerance: the 16-bit logits are exact in float32, so both sides are float32
    logsumexps of the same values (an exp, a sum of 8, a log per token, then a square and a mean of 33): within
    1e-6 relative. A logsumexp taken in the logits' dtype is rounded to 8 (bf16) or 11 (fp16) significant bits
    before squaring: up to 2**-8 = 4e-3 or 2**-11 = 5e-4 relative, far outside."""
    from moe.losses import router_z_loss

    z = logits(33, 8, seed=2, scale=4.0).to(dtype)
    loss = router_z_loss(z)
    assert loss.dtype == torch.float32, f"the z-loss of {dtype} logits is {loss.dtype}: take it in float32"
    torch.testing.assert_close(loss, torch.logsumexp(z.float(), dim=-1).square().mean(), **TOL,
                               msg=lambda m: f"z-loss of {dtype} logits differs from their float32 values': {m}")
