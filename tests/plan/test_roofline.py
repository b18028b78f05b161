"""The planner's kernels, prices and memory rules (project/planner/kernels.py, pricing.py, memory.py), each
against a count done by hand: the activation inventory equal to ``memory.accounting``'s for GPT-2's blocks,
recomputation and causal FlashAttention in the FLOPs, grouped-query sizes in memory and communication, tile and
wave quantization, the roofline, the links' achievable bandwidth, and the memory rules of the runner (GPipe's
logits, ZB-H1's graphs, the embedding's mask, the allocator's headroom). Sums of a few products of integers:
exact, or to 1e-12 relative where a division rounds. No processes start."""
import math

import pytest

from course.hardware import HARDWARE
from memory.accounting import layer_activation_bytes
from project.planner.communication import call_seconds, stage_communication
from project.planner.config import PlanConfig
from project.planner.kernels import stage_flops, stage_kernels
from project.planner.layout import sizes
from project.planner.memory import ALLOCATOR_HEADROOM, layer_activations, stage_memory
from project.planner.pricing import Kernel, kernel_seconds, tile_utilisation
from project.planner.step import predict

REL = 1e-12


def plan(**values):
    base = dict(preset="gpt2", hardware="h100", vocab_size=5000, model_max_length=256, batch_size=8,
                micro_batches=1, precision="bf16")
    return PlanConfig.for_test(**(base | values))


@pytest.mark.parametrize("values", [dict(), dict(tp=4), dict(tp=4, sequence_parallel=True), dict(dropout=0.1),
                                    dict(activation_model="course", tp=2, sequence_parallel=True, dropout=0.1),
                                    dict(activation_checkpointing=True, tp=2), dict(cp=2)],
                         ids=["plain", "tp", "sp", "dropout", "course", "checkpointing", "cp"])
def test_the_inventory_of_gpt2s_block_is_korthikantis(values):
    """Part by part, one block's activations on one rank are ``memory.accounting.layer_activation_bytes`` (Table 2
    of Korthikanti et al. 2022 and the course's variant) for GPT-2's block with the unfused attention; with context
    parallelism the blockwise attention keeps its fp32 log-sum-exp instead of the scores."""
    config = plan(attention_kernel="eager", **values)
    z = sizes(config)
    want = layer_activation_bytes(z.s, z.b, z.h, z.a, z.t, sequence_parallel=config.sequence_parallel,
                                  checkpointing=config.activation_checkpointing, element_bytes=z.e,
                                  dropout=config.dropout > 0, mask_bytes=z.mask, attention_scores=config.cp == 1,
                                  implementation=config.activation_model)
    got = layer_activations(config)
    lse = 0 if config.cp == 1 or config.activation_checkpointing else 4.0 * z.b * z.a_t * z.s
    assert math.isclose(sum(got.values()), want + lse, rel_tol=REL)


def test_flash_attention_keeps_no_scores_and_counts_causal_flops():
    eager, flash = plan(attention_kernel="eager"), plan(attention_kernel="flash")
    z = sizes(flash)
    assert layer_activations(eager)["scores"] == z.b * z.a * z.s * z.s * z.e / z.t  # the softmax's output
    assert layer_activations(flash)["scores"] == 4.0 * z.b * z.a * z.s                  # the log-sum-exp only
    forward, backward = [k for k in stage_kernels(flash, 0) if k.kind == "attention"]
    full = 4.0 * z.b * z.a * z.s * z.S * z.d
    assert math.isclose(forward.flops, full * (0.5 + 128 / (2 * z.S)), rel_tol=REL)  # 128-row blocks on the diagonal
    assert math.isclose(backward.flops, 2.5 * forward.flops, rel_tol=REL) and forward.count == z.L


@pytest.mark.parametrize("policy", ["none", "attention", "matmuls", "full"])
def test_each_recomputation_policy_recomputes_what_it_says(policy):
    """Hardware FLOPs less model FLOPs (eager attention: the model FLOPs count the whole s x s, as it runs): none;
    the attention core's two products (selective, Korthikanti et al. 2022, Sec. 5); the 2nd and 4th products of
    GPT-2's block (torchtitan's policy: every other one); every block's forward (full)."""
    values = {"activation_checkpointing": policy == "full",
              "selective_checkpointing": policy if policy in ("attention", "matmuls") else "none"}
    config = plan(attention_kernel="eager", **values)
    z = sizes(config)
    tokens = z.b * z.s * z.L
    extra = stage_flops(config, 0) - stage_flops(config, 0, model_only=True)
    core = 2 * 2.0 * z.s * z.d * z.a * tokens                       # q k^T and p v, forward
    products = {"proj": 2.0 * z.h * z.h, "fc_proj": 2.0 * z.f * z.h}  # the 2nd and 4th, forward, per token
    blocks = 2.0 * (4 * z.h * z.h + 2 * z.h * z.f) * tokens + core
    want = {"none": 0.0, "attention": core, "matmuls": sum(products.values()) * tokens, "full": blocks}[policy]
    assert math.isclose(extra, want, rel_tol=REL)
    with_flash = plan(attention_kernel="flash", **values)
    if policy == "attention":  # FlashAttention recomputes the scores in its own backward: nothing more
        assert stage_flops(with_flash, 0) == sum(k.flops * k.count for k in stage_kernels(plan(attention_kernel="flash"), 0))


def test_grouped_query_attention_sizes_memory_and_the_context_parallel_exchange():
    for cp_comm in ("ring", "all_gather"):
        config = PlanConfig.for_test(preset="llama3-8b", hardware="h100", dp=2, cp=4, model_max_length=8192,
                                     batch_size=2, cp_comm=cp_comm)
        z = sizes(config)
        kv = 2 * z.b * z.s * z.kv * z.d * z.e                       # this rank's K and V: 8 heads of 128, not 32
        calls = [c for c in stage_communication(config, 0) if c.group == "cp"]
        if cp_comm == "ring":
            assert [(c.kind, c.bytes, c.count) for c in calls] == [("send", kv, 3 * 3 * z.L)]
        else:
            assert [(c.kind, c.bytes, c.count) for c in calls] == [("all_gather", 4 * kv, 2 * z.L),
                                                                   ("reduce_scatter", 4 * kv, z.L)]
        assert layer_activations(config)["q k v"] == z.e * z.b * z.s * (z.a + 2 * z.kv) * z.d


def test_tiles_run_in_waves_over_the_multiprocessors():
    assert tile_utilisation(128 * 12, 256 * 11, 1, 132) == 1.0          # 132 tiles: one full wave
    assert tile_utilisation(128 * 12 + 1, 256 * 11, 1, 132) < 0.7       # one row more: a second, emptier wave
    assert tile_utilisation(100, 100, 1, 132) == 100 * 100 / (132 * 128 * 128)  # one small tile of one wave
    assert tile_utilisation(4096, 4096, 1, 0) == 1.0                     # SMs not modelled


def test_the_roofline_takes_the_slower_of_compute_and_memory():
    h100 = HARDWARE["h100"]
    bandwidth = h100.memory_bandwidth * h100.memory_efficiency
    memory_bound = Kernel("norm", "memory", "F", 0.0, 1e9)
    assert math.isclose(kernel_seconds(memory_bound, h100, "bf16"), 1e9 / bandwidth, rel_tol=REL)
    skinny = Kernel("skinny", "gemm", "F", 2.0 * 8192 * 8192 * 8, 2 * (2 * 8192 * 8 + 8192 * 8192), (8192, 8192, 8, 1))
    assert math.isclose(kernel_seconds(skinny, h100, "bf16"), skinny.bytes / bandwidth, rel_tol=REL)  # K = 8
    assert kernel_seconds(skinny.times(3), h100, "bf16") == pytest.approx(3 * kernel_seconds(skinny, h100, "bf16"))


def test_collectives_run_at_the_bandwidth_nccl_tests_reach():
    """An all-reduce of 1 GiB over the 8 GPUs of a node: NCCL's base and per-step latencies, and the ring's
    2 x 7/8 of the bytes at 81 % of NVLink 4's 450 GB/s (nccl-tests' bus bandwidth)."""
    config = plan(tp=8, preset="llama3-8b")
    n, link = 2**30, HARDWARE["h100"].intra
    want = link.base + 14 * link.alpha + 2 * 7 / 8 * n / (450e9 * 0.81)
    assert math.isclose(call_seconds(HARDWARE["h100"], config, "tp", "all_reduce", n), want, rel_tol=REL)


@pytest.mark.needs_solution  # the planner replays the schedules' action lists (assignment 5.2.4)
def test_gpipes_last_stage_holds_every_micro_batchs_logits_and_zb_h1_holds_until_w():
    """GPipe's last stage keeps all m micro-batches (their blocks, head input and fp32 logits) until the backward
    passes; ZB-H1 keeps a micro-batch's graph until its W, min(p, m) on every stage; the first stage keeps each
    micro-batch's embedding dropout mask for as long as the micro-batch."""
    p, m = 4, 8
    gpipe = plan(pp=p, micro_batches=m, batch_size=m, schedule="gpipe", dropout=0.1)
    for stage in (0, p - 1):
        memory = stage_memory(gpipe, stage)
        assert memory.in_flight == m and math.isclose(memory.activations, m * sum(memory.parts.values()), rel_tol=REL)
    assert "logits (fp32)" in stage_memory(gpipe, p - 1).parts and "embedding dropout mask" in stage_memory(gpipe, 0).parts
    zb = plan(pp=p, micro_batches=m, batch_size=m, schedule="zb-h1")
    assert [stage_memory(zb, s).in_flight for s in range(p)] == [min(p, m)] * p


def test_a_plan_fits_only_within_the_allocators_headroom():
    h100 = HARDWARE["h100"]
    out = predict(plan(), h100)
    assert out.usable_memory_bytes == h100.memory_bytes * (1 - ALLOCATOR_HEADROOM)
    assert out.fits == (out.memory_bytes <= out.usable_memory_bytes)


@pytest.mark.needs_solution  # the planner replays the schedules' action lists (assignment 5.2.4)
def test_a_llama_step_splits_into_its_parts():
    config = PlanConfig.for_test(preset="llama3-8b", hardware="h100", dp=2, pp=2, tp=4, batch_size=16,
                                 micro_batches=8, model_max_length=4096, zero=1, selective_checkpointing="matmuls",
                                 sequence_parallel=True)
    out = predict(config, HARDWARE["h100"])
    assert math.isclose(out.step_s, out.compute_s + out.bubble_s + out.comm_s + out.optimizer_s, rel_tol=REL)
    assert math.isclose(sum(out.shares().values()), 1.0, rel_tol=REL)
    assert out.hardware_flops > out.model_flops * 0.5 and out.mfu < 1 and out.fits
