"""Assignment 5.8.4 — the DeepSeek-style MoE layer (graded; DeepSeek-V3 report, Sec. 2.1.2).

* Routing: with the router weight and selection bias copied into ``transformers``'
  ``DeepseekV3TopkRouter`` (a tiny ``DeepseekV3Config``, no download), the chosen experts, their gates
  and the router logits equal its, for several (tokens, experts, k, n_group, topk_group) shapes, with
  and without normalisation, with a routed scaling factor.
* The layer: with SwiGLU experts and shared experts whose weights are copied from ``DeepseekV3MoE``,
  its output and every gradient equal the block's.
* The bias chooses, the gates do not see it; group-limited routing never picks an expert outside the
  token's chosen groups; the bias update on a hand-worked case; shared experts' output added.
* Expert parallelism (2 ranks): the layer with its experts over the ep group and the dispatch of
  assignment 5.8.2 unchanged equals the single-process layer.
"""
from __future__ import annotations

import functools

import pytest
import torch

from tests.moe.support import DEEPSEEK_EP, DEEPSEEK_TOKENS, HIDDEN, deepseek_parallel_worker, make_layer, \
    run_single, tokens

pytestmark = pytest.mark.a5_8_4

# float32 throughout, same matrix product on both sides (bitwise equal logits and scores): the gates take
# a sigmoid, a sum of k <= 6 terms, a division and a product, <= 10 roundings of values of order 1, so
# 10 * eps(float32) = 1.2e-6; the layer's output and gradients add the experts' products (h = 16 terms,
# order-1 values, summed in another order by the two codes: ~16 eps each), hence 1e-5 there.
GATE_TOL = dict(rtol=1.2e-6, atol=1.2e-6)
LAYER_TOL = dict(rtol=1e-5, atol=1e-5)

# (tokens, experts, k, n_group, topk_group, normalise, scaling factor)
ROUTER_CASES = [
    (7, 8, 2, 1, 1, True, 1.0),
    (13, 8, 2, 4, 2, True, 2.5),
    (11, 16, 4, 4, 1, True, 2.5),
    (9, 12, 3, 3, 2, False, 1.5),
    (20, 16, 6, 8, 3, True, 2.5),
    (17, 32, 8, 8, 4, True, 2.5),
]


@pytest.fixture(scope="module")
def deepseek():
    from transformers import DeepseekV3Config
    from transformers.models.deepseek_v3 import modeling_deepseek_v3

    return DeepseekV3Config, modeling_deepseek_v3


def hf_config(config_cls, hidden, experts, k, n_group, topk_group, normalise, scaling, shared=1, inner=8):
    return config_cls(hidden_size=hidden, moe_intermediate_size=inner, n_routed_experts=experts,
                      num_experts_per_tok=k, n_group=n_group, topk_group=topk_group, norm_topk_prob=normalise,
                      routed_scaling_factor=scaling, n_shared_experts=shared, hidden_act="silu")


def by_expert(experts, gates):
    """The (T, k) choices and gates ordered by expert index (the two codes order the k choices differently)."""
    order = experts.argsort(dim=-1)
    return experts.gather(1, order), gates.gather(1, order)


def draw(shape, seed, scale=1.0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)) * scale


@pytest.mark.parametrize("case", ROUTER_CASES, ids=lambda c: "T{}-E{}-k{}-g{}-tg{}-n{}-s{}".format(*c))
def test_routing_equals_the_deepseek_v3_router(deepseek, case):
    from moe.config import MoEConfig
    from moe.deepseek_router import DeepSeekRouter

    num_tokens, experts, k, n_group, topk_group, normalise, scaling = case
    config_cls, modeling = deepseek
    hidden = 16
    ref = modeling.DeepseekV3TopkRouter(hf_config(config_cls, hidden, experts, k, n_group, topk_group, normalise,
                                                  scaling))
    mine = DeepSeekRouter(hidden, MoEConfig(experts, k, router="deepseek", n_group=n_group, topk_group=topk_group,
                                            routed_scaling_factor=scaling, normalize_gates=normalise))
    seed = sum(case[:5])
    with torch.no_grad():
        ref.weight.copy_(draw((experts, hidden), seed, 0.3))
        ref.e_score_correction_bias.copy_(draw((experts,), seed + 1, 0.2))  # moves the choice (scores' spread)
        mine.weight.copy_(ref.weight)
        mine.e_score_correction_bias.copy_(ref.e_score_correction_bias)
    x = draw((num_tokens, hidden), seed + 2)
    ref_logits, ref_gates, ref_experts = ref(x)
    routing = mine(x)
    assert routing.experts.shape == (num_tokens, k) and routing.gates.shape == (num_tokens, k)
    torch.testing.assert_close(routing.logits.float(), ref_logits, **GATE_TOL, msg="router logits")
    got_experts, got_gates = by_expert(routing.experts, routing.gates)
    want_experts, want_gates = by_expert(ref_experts, ref_gates)
    assert torch.equal(got_experts, want_experts), "the chosen experts differ from DeepseekV3TopkRouter's"
    torch.testing.assert_close(got_gates, want_gates, **GATE_TOL, msg="gates of the chosen experts")
    unbiased = torch.topk(torch.sigmoid(ref_logits), k, dim=-1).indices.sort(dim=-1).values
    assert not torch.equal(unbiased, want_experts) or n_group > 1, "the case must let the bias change a choice"


# (shared experts, n_group, topk_group, --routed_scaling_factor as given (None: left out), the factor it means)
LAYER_CASES = [(1, 1, 1, None, 2.5), (2, 4, 2, 1.5, 1.5)]


@pytest.mark.parametrize("case", LAYER_CASES, ids=lambda c: "shared{}-g{}-tg{}-factor{}".format(*c))
def test_layer_equals_the_deepseek_v3_moe_block(deepseek, case):
    """The layer of ``project/run_moe.py --router deepseek`` (its options through ``MoEConfig.of_run``) against
    ``DeepseekV3MoE`` with the same routed scaling factor: left out, DeepSeek-V3's 2.5; given, the value given."""
    from moe.config import MoEConfig
    from moe.experts import GatedExperts
    from moe.layer import MoELayer
    from project.options.run_moe import MoERunConfig

    shared, n_group, topk_group, option, factor = case
    config_cls, modeling = deepseek
    hidden, inner, experts, k = 16, 8, 8, 2
    block = modeling.DeepseekV3MoE(hf_config(config_cls, hidden, experts, k, n_group, topk_group, True, factor,
                                             shared, inner))
    torch.manual_seed(shared + n_group)
    with torch.no_grad():
        for p in block.parameters():
            p.normal_(0.0, 0.3)
        block.gate.e_score_correction_bias.copy_(draw((experts,), 5, 0.2))
    run = MoERunConfig.for_test(dp=2, ep=2, num_experts=experts, top_k=k, router="deepseek", shared_experts=shared,
                                n_group=n_group, topk_group=topk_group, aux_loss_coef=0.0,
                                routed_scaling_factor=option)
    config = MoEConfig.of_run(run)
    assert config.routed_scaling_factor == factor, (
        f"--routed_scaling_factor {option}: the layers get {config.routed_scaling_factor}, not {factor}")
    layer = MoELayer(hidden, config, GatedExperts(experts, hidden, inner),
                     shared=GatedExperts(1, hidden, inner * shared))
    se = block.shared_experts
    with torch.no_grad():
        layer.router.weight.copy_(block.gate.weight)
        layer.router.e_score_correction_bias.copy_(block.gate.e_score_correction_bias)
        layer.experts.gate_up_proj.copy_(block.experts.gate_up_proj)
        layer.experts.down_proj.copy_(block.experts.down_proj)
        layer.shared.gate_up_proj[0].copy_(torch.cat([se.gate_proj.weight, se.up_proj.weight]))
        layer.shared.down_proj[0].copy_(se.down_proj.weight)
    x = draw((3, 7, hidden), 1)
    grad_out = draw((3, 7, hidden), 2)

    x_ref = x.clone().requires_grad_(True)
    ref = block(x_ref)
    (ref * grad_out).sum().backward()
    x_mine = x.clone().requires_grad_(True)
    out = layer(x_mine).output
    (out * grad_out).sum().backward()

    torch.testing.assert_close(out, ref, **LAYER_TOL, msg="output = DeepseekV3MoE's")
    torch.testing.assert_close(x_mine.grad, x_ref.grad, **LAYER_TOL, msg="input gradient")
    torch.testing.assert_close(layer.router.weight.grad, block.gate.weight.grad, **LAYER_TOL, msg="router gradient")
    torch.testing.assert_close(layer.experts.gate_up_proj.grad, block.experts.gate_up_proj.grad, **LAYER_TOL,
                               msg="experts' gate/up gradient")
    torch.testing.assert_close(layer.shared.down_proj.grad[0], se.down_proj.weight.grad, **LAYER_TOL,
                               msg="shared experts' down gradient")


def test_the_bias_chooses_and_the_gates_ignore_it():
    from moe.deepseek_router import deepseek_route

    # 1 token, 4 experts, k = 2: scores sigmoid([2, 1, 0, -1]); a bias of +3 on expert 3 makes it a choice
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0]])
    bias = torch.tensor([0.0, 0.0, 0.0, 3.0])
    routing = deepseek_route(logits, bias, 2, routed_scaling_factor=2.5)
    s = torch.sigmoid(logits[0])
    experts, gates = by_expert(routing.experts, routing.gates)
    assert experts.tolist() == [[0, 3]], "chosen by score + bias: experts 0 and 3"
    want = torch.stack([s[0], s[3]]) / (s[0] + s[3]) * 2.5  # unbiased scores, normalised over the chosen two
    torch.testing.assert_close(gates[0], want, **GATE_TOL, msg="gates from the unbiased sigmoid scores")
    torch.testing.assert_close(routing.probs, torch.sigmoid(logits), **GATE_TOL, msg="probs: the sigmoid scores")


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("n_group,topk_group,normalize", [(1, 1, True), (4, 2, False)])
def test_sigmoid_of_low_precision_logits_is_taken_in_float32(dtype, n_group, topk_group, normalize):
    """bf16 / fp16 router logits (a model trained in mixed precision): the affinities are float32 sigmoids
    (``deepseek_route``'s docstring; the softmax of assignment 5.8.1 likewise), so ``probs``, ``gates`` and the
    balance statistics made of them are float32 and equal what the logits' float32 values give; the logits stay
    as given.

    Tolerance: the 16-bit logits are exactly representable in float32, so both sides run the same float32
    arithmetic on the same values (GATE_TOL). A sigmoid taken in the logits' dtype, cast or not, is rounded to 8
    (bf16) or 11 (fp16) significant bits: up to 2**-9 = 2e-3 or 2**-12 = 2.4e-4 of an affinity near 1, far outside."""
    from moe.deepseek_router import deepseek_route, sequence_balance_loss

    num_tokens, experts, k = 23, 8, 2
    logits = draw((num_tokens, experts), 9, 3.0).to(dtype)
    bias = draw((experts,), 10, 0.2)
    routing = deepseek_route(logits, bias, k, n_group, topk_group, 2.5, normalize)
    want = deepseek_route(logits.float(), bias, k, n_group, topk_group, 2.5, normalize)
    assert routing.logits.dtype == dtype, "Routing.logits are the logits as given, in their own dtype"
    assert routing.probs.dtype == torch.float32, (
        f"affinities are {routing.probs.dtype} for {dtype} logits: take the sigmoid in float32 (logits.float())")
    assert routing.gates.dtype == torch.float32, f"gates are {routing.gates.dtype} for {dtype} logits; they are float32"
    torch.testing.assert_close(routing.probs, torch.sigmoid(logits.float()), **GATE_TOL,
                               msg=lambda m: f"affinities of {dtype} logits differ from the float32 sigmoid: {m}")
    got_experts, got_gates = by_expert(routing.experts, routing.gates)
    want_experts, want_gates = by_expert(want.experts, want.gates)
    assert torch.equal(got_experts, want_experts), f"{dtype} logits: other experts than their float32 values choose"
    torch.testing.assert_close(got_gates, want_gates, **GATE_TOL,
                               msg=lambda m: f"gates of {dtype} logits differ from their float32 values': {m}")
    sequence = torch.arange(num_tokens) // 8
    balance = sequence_balance_loss(routing.probs, routing.experts, sequence, 3)
    assert balance.dtype == torch.float32, f"the sequence-wise balance loss is {balance.dtype}; it is float32"
    torch.testing.assert_close(balance, sequence_balance_loss(want.probs, want.experts, sequence, 3), **GATE_TOL,
                               msg="sequence-wise balance loss of the affinities")


def test_group_limited_routing_stays_in_the_chosen_groups():
    from moe.deepseek_router import deepseek_route

    num_tokens, experts, n_group, topk_group, k = 64, 16, 4, 2, 4
    per = experts // n_group
    logits, bias = draw((num_tokens, experts), 11), draw((experts,), 12, 0.2)
    limited = deepseek_route(logits, bias, k, n_group, topk_group).experts
    free = deepseek_route(logits, bias, k).experts
    choice = torch.sigmoid(logits) + bias
    group_score = choice.view(num_tokens, n_group, per).topk(2, dim=-1).values.sum(-1)  # sum of each group's top 2
    best = group_score.topk(topk_group, dim=-1).indices
    for t in range(num_tokens):
        groups = set((limited[t] // per).tolist())
        assert groups <= set(best[t].tolist()), f"token {t}: experts {limited[t].tolist()} outside its best groups"
        allowed = torch.cat([torch.arange(g * per, (g + 1) * per) for g in sorted(best[t].tolist())])
        want = allowed[choice[t, allowed].topk(k).indices].sort().values
        assert limited[t].sort().values.tolist() == want.tolist(), f"token {t}: the k best inside its groups"
    assert not torch.equal(limited.sort(-1).values, free.sort(-1).values), "the case must need the group limit"


def test_bias_update_on_a_hand_worked_case():
    from moe.config import MoEConfig
    from moe.deepseek_router import DeepSeekRouter, updated_bias

    # loads 5, 1, 3, 3 (mean 3): expert 0 overloaded (-gamma), expert 1 underloaded (+gamma), 2 and 3 unchanged
    bias = torch.tensor([0.1, -0.2, 0.0, 0.05])
    new = updated_bias(bias, torch.tensor([5, 1, 3, 3]), 0.01)
    torch.testing.assert_close(new, torch.tensor([0.09, -0.19, 0.0, 0.05]), rtol=0, atol=1e-7)  # one rounding
    # through the router: 3 tokens routed to (0, 1), (0, 2), (0, 1) -> loads 3, 2, 1, 0 (mean 1.5)
    router = DeepSeekRouter(2, MoEConfig(4, 2, router="deepseek", router_bias_update=0.5))
    with torch.no_grad():
        router.weight.copy_(torch.tensor([[4.0, 4.0], [2.0, 0.0], [0.0, 2.0], [-4.0, -4.0]]))
    router.train()
    router(torch.tensor([[1.0, 0.5], [0.5, 1.0], [1.0, 0.0]]))
    router.update_bias()
    torch.testing.assert_close(router.e_score_correction_bias, torch.tensor([-0.5, -0.5, 0.5, 0.5]), rtol=0, atol=0)


def test_bias_update_with_no_load_keeps_every_bias():
    """A step that routed no token (every expert at the mean load, 0): every bias stays, finite."""
    from moe.config import MoEConfig
    from moe.deepseek_router import DeepSeekRouter, updated_bias

    bias = torch.tensor([0.1, -0.2, 0.0, 0.05])
    for load in (torch.zeros(4, dtype=torch.int64), torch.zeros(4, dtype=torch.float64)):
        new = updated_bias(bias, load, 0.01)
        assert new.dtype == torch.float32 and bool(torch.isfinite(new).all()), f"no load: bias {new.tolist()}"
        torch.testing.assert_close(new, bias, rtol=0, atol=0, msg="no load: no expert is over or under the mean")
    router = DeepSeekRouter(2, MoEConfig(4, 2, router="deepseek", router_bias_update=0.5))
    router.train()
    router(torch.zeros(0, 2))  # a rank whose step held no token
    router.update_bias()
    torch.testing.assert_close(router.e_score_correction_bias, torch.zeros(4), rtol=0, atol=0,
                               msg="update_bias after a step without tokens")


def test_bias_update_when_one_expert_takes_every_token():
    """DeepSeek-V3, Sec. 2.1.2: the overloaded expert's bias drops by gamma, each underloaded one's rises by gamma —
    by gamma whatever the size of the imbalance — until the bias moves tokens to the other experts."""
    from moe.config import MoEConfig
    from moe.deepseek_router import DeepSeekRouter, updated_bias

    new = updated_bias(torch.zeros(4), torch.tensor([64, 0, 0, 0]), 0.01)
    torch.testing.assert_close(new, torch.tensor([-0.01, 0.01, 0.01, 0.01]), rtol=0, atol=1e-9,
                               msg="loads 64, 0, 0, 0: expert 0 loses gamma, every other gains gamma")
    # top-1 through the router: expert 0's affinity sigmoid(2) = 0.88 beats the others' sigmoid(0) = 0.5 for every
    # token; the bias must close the gap of 0.38 at 2 gamma = 0.1 per step, so after 4 steps a token moves
    gamma, x = 0.05, torch.ones(16, 2)
    router = DeepSeekRouter(2, MoEConfig(4, 1, router="deepseek", router_bias_update=gamma))
    with torch.no_grad():
        router.weight.copy_(torch.tensor([[1.0, 1.0], [0.0, 0.0], [0.0, 0.0], [0.0, 0.0]]))
    router.train()
    bias = torch.zeros(4)
    for step in range(5):
        load = torch.bincount(router(x).experts.reshape(-1), minlength=4)
        router.update_bias()
        if load[0] < 16:
            break
        bias = bias + gamma * torch.tensor([-1.0, 1.0, 1.0, 1.0])
        got = router.e_score_correction_bias
        assert bool(torch.isfinite(got).all()), f"step {step}: bias {got.tolist()}"
        torch.testing.assert_close(got, bias, rtol=0, atol=1e-6,
                                   msg=f"step {step}: every token on expert 0: it loses gamma, the others gain it")
    assert step == 4 and load[0] == 0, f"after {step} steps expert 0 still takes {int(load[0])} of 16 tokens"


def test_shared_experts_output_is_added():
    from moe.config import MoEConfig

    with_shared = make_layer(MoEConfig(8, 2, router="deepseek", shared_experts=2, n_group=2, topk_group=1))
    without = make_layer(MoEConfig(8, 2, router="deepseek", n_group=2, topk_group=1))
    x = tokens(0, 10)
    with torch.no_grad():
        shared = with_shared.shared(x, [10])
        torch.testing.assert_close(with_shared(x).output, without(x).output + shared, **LAYER_TOL,
                                   msg="output = routed experts' + shared experts'")
    assert shared.abs().max() > 0.1


@functools.lru_cache(maxsize=None)
def parallel_runs(planted=None):
    from course.launch import launch

    return launch(deepseek_parallel_worker, 2, planted, timeout=90, collective_timeout=60)


@pytest.mark.timeout(150)
def test_expert_parallel_deepseek_layer_equals_one_process():
    from moe.config import MoEConfig

    full = make_layer(MoEConfig(**DEEPSEEK_EP))
    runs = parallel_runs()
    for rank in range(2):
        ref = run_single(full, tokens(rank, DEEPSEEK_TOKENS[rank]), rank)
        shared_ref = {n: p.grad.clone() for n, p in full.shared.named_parameters()}
        got = runs[rank]
        torch.testing.assert_close(got["out"], ref["out"], **LAYER_TOL, msg=f"rank {rank}: output")
        torch.testing.assert_close(got["x_grad"], ref["x_grad"], **LAYER_TOL, msg=f"rank {rank}: input gradient")
        torch.testing.assert_close(got["router"], ref["router"], **LAYER_TOL, msg=f"rank {rank}: router gradient")
        for name, grad in got["shared"].items():
            torch.testing.assert_close(grad, shared_ref[name], **LAYER_TOL, msg=f"rank {rank}: shared {name} gradient")
        assert "all_to_all" in got["comm"].get("ep", {}), "tokens travel to their experts by all-to-all"
