"""The planner's time model (project/planner/step.py) on hand-worked cases: communication fully hidden, partly hidden
and not hidden behind the backward pass; ZeRO-3's prefetched all-gathers; the hierarchical all-reduce of a
group that spans nodes against its arithmetic; where each group of the mesh lands on DGX nodes; and the L4
profile's published figures. No processes start; every number is a sum of a few products of round figures,
so each comparison holds to 1e-12 relative (a handful of float roundings)."""
import math

import pytest

from communication.alpha_beta import collective_seconds, hierarchical_seconds
from course.hardware import HARDWARE, IB_NDR, NVLINK4, Hardware, Link
from project.planner.config import PlanConfig
from project.planner.step import exposed_gathers, predict, reduction_finish

REL = 1e-12


# ---- the gradient reduction behind the last backward ----------------------------------------------------

def test_a_reduction_shorter_than_the_backward_is_hidden_but_its_last_bucket():
    # last backward from t = 0 to 10; 4 s of reduction in buckets, the last of 1 s: 3 s run during the backward
    assert reduction_finish(0.0, 10.0, 4.0, 1.0, overlap=True) == 11.0


def test_a_reduction_longer_than_the_backward_is_partly_hidden():
    # 15 s of reduction, last bucket 1 s, backward 10 s: exposed max(0, 15 - 1 - 10) + 1 = 5 s
    assert reduction_finish(0.0, 10.0, 15.0, 1.0, overlap=True) == 15.0


def test_without_overlap_the_reduction_follows_the_backward():
    assert reduction_finish(0.0, 10.0, 4.0, 1.0, overlap=False) == 14.0
    # one bucket (the gradients fit in one): nothing can start before the backward ends
    assert reduction_finish(0.0, 10.0, 4.0, 4.0, overlap=True) == 14.0


def test_zero3_gathers_hide_behind_the_previous_block():
    assert exposed_gathers(2.0, 3.0, 4, overlap=True) == 2.0            # only the first: 3 s of compute hides 2 s
    assert exposed_gathers(5.0, 3.0, 4, overlap=True) == 5.0 + 3 * 2.0  # each later one sticks out by 2 s
    assert exposed_gathers(2.0, 3.0, 4, overlap=False) == 8.0           # blocking: all four


# ---- hierarchical collectives ------------------------------------------------------------------------------

def test_a_group_inside_a_node_uses_nvlink_only():
    n = 2**30
    want = collective_seconds("all_reduce", n, 8, NVLINK4.alpha, NVLINK4.beta, NVLINK4.base)
    assert hierarchical_seconds("all_reduce", n, 8, 8, NVLINK4, IB_NDR) == want
    assert want == NVLINK4.base + 14 * NVLINK4.alpha + 2 * 7 / 8 * n * NVLINK4.beta


def test_hierarchical_all_reduce_is_intra_reduce_scatter_inter_all_reduce_intra_all_gather():
    """16 ranks on 2 DGX H100 nodes, 8 per node, 1 GiB: by hand, reduce-scatter over NVLink (7 steps, 7/8 of N),
    all-reduce of N/8 over InfiniBand between the 2 nodes (2 steps, 2 x 1/2 of N/8), all-gather over NVLink."""
    n = 2**30
    a_i, b_i, base = 3.4e-6, 1 / 450e9, 8.4e-6
    a_e, b_e = 9.6e-6, 1 / 50e9
    by_hand = ((base + 7 * a_i + 7 / 8 * n * b_i) + (base + 2 * a_e + 2 * 1 / 2 * n / 8 * b_e)
               + (base + 7 * a_i + 7 / 8 * n * b_i))
    got = hierarchical_seconds("all_reduce", n, 16, 8, NVLINK4, IB_NDR)
    assert math.isclose(got, by_hand, rel_tol=REL)
    # a flat ring over the network would be slower: 2 x 15/16 of N over InfiniBand
    flat = collective_seconds("all_reduce", n, 16, IB_NDR.alpha, IB_NDR.beta, IB_NDR.base)
    assert got < flat / 4
    # one member per node: the network's flat ring
    assert hierarchical_seconds("all_reduce", n, 16, 1, NVLINK4, IB_NDR) == flat


def test_hierarchical_reduce_scatter_and_all_gather():
    n, g, nodes = 2**28, 4, 4
    ring = lambda kind, nbytes, p, link: collective_seconds(kind, nbytes, p, link.alpha, link.beta, link.base)
    assert math.isclose(hierarchical_seconds("reduce_scatter", n, 16, g, NVLINK4, IB_NDR),
                        ring("reduce_scatter", n, g, NVLINK4) + ring("reduce_scatter", n / g, nodes, IB_NDR),
                        rel_tol=REL)
    assert math.isclose(hierarchical_seconds("all_gather", n, 16, g, NVLINK4, IB_NDR),
                        ring("all_gather", n / g, nodes, IB_NDR) + ring("all_gather", n, g, NVLINK4), rel_tol=REL)
    with pytest.raises(ValueError, match="divide"):
        hierarchical_seconds("all_reduce", n, 12, 8, NVLINK4, IB_NDR)


def test_where_each_group_lands_on_dgx_nodes():
    """Mesh order pp, dp, cp, tp (tp fastest), 8 GPUs per node: tp 8 fills a node; a dp group then has one
    member per node; with tp 2, four dp ranks share a node; pp crosses nodes once dp cp tp >= 8."""
    h100 = HARDWARE["h100"]
    assert h100.placement(8, 1) == (8, 1)      # tp 8
    assert h100.placement(16, 8) == (1, 16)    # dp 16 over tp 8
    assert h100.placement(16, 2) == (4, 4)     # dp 16 over tp 2
    assert h100.placement(4, 64) == (1, 4)     # pp 4 over dp 16 x tp 4
    assert h100.placement(2, 2) == (2, 1)      # dp 2 x tp 2: one node


# ---- the whole step ------------------------------------------------------------------------------------

# two nodes' worth of round figures: compute 100 TFLOP/s, NVLink 1 us + 1 ns/B per step... network slower (no memory
# bandwidth or SMs given: every kernel at its FLOPs and the peak)
TWO_LEVEL = Hardware("two-level", {"bf16": 100e12, "fp32": 100e12}, 1e12, Link("fast", 1e-6, 1e-11),
                     Link("slow", 1e-5, 1e-10), 8, matmul_efficiency=1.0)


def plan(**values):
    base = dict(preset="gpt2", hardware="h100", vocab_size=5000, model_max_length=128, batch_size=64,
                micro_batches=1, precision="bf16", attention_kernel="eager")
    return PlanConfig.for_test(**(base | values))


def test_overlap_hides_the_data_parallel_reduction_behind_the_backward():
    """dp 16 with tp 1 (two nodes): 248 MB of bf16 gradients in 25 MiB buckets. With overlap the exposed dp time
    is max(0, C - C_last - B) + C_last (B: the backward of the one micro-batch); without, C."""
    on, off = predict(plan(dp=16, dp_overlap="on"), TWO_LEVEL), predict(plan(dp=16, dp_overlap="off"), TWO_LEVEL)
    total = off.comm_total_s["dp"]
    assert math.isclose(off.exposed_s["dp"], total, rel_tol=REL)
    stage = on.stages[0]
    backward = stage.backward_s
    grads = [c for c in stage.comm if c.group == "dp" and c.kind == "all_reduce" and c.bytes > 8][0]
    last = grads.seconds * 25 * 2**20 / grads.bytes
    want = max(0.0, total - last - backward) + last
    assert math.isclose(on.exposed_s["dp"], want, rel_tol=1e-9)
    assert on.step_s < off.step_s
    assert math.isclose(on.hidden_s["dp"], total - want, rel_tol=1e-9)
    for out in (on, off):
        assert math.isclose(out.step_s, out.compute_s + out.bubble_s + out.comm_s + out.optimizer_s, rel_tol=REL)


def test_tensor_parallel_traffic_is_exposed_and_costs_more_across_nodes():
    inside, across = predict(plan(tp=4, dp=2), TWO_LEVEL), predict(plan(tp=4, dp=2, devices_per_node=2), TWO_LEVEL)
    for out in (inside, across):  # nothing of it hidden (up to the rounding of summing it per micro-batch)
        assert out.hidden_s["tp"] <= REL * out.comm_total_s["tp"]
    assert across.exposed_s["tp"] > 3 * inside.exposed_s["tp"]  # a network 10x slower carries half of it
    assert "tp across nodes" in across.limit or across.limit.startswith("exposed tp")


def test_l4_is_the_datasheets():
    l4 = HARDWARE["l4"]
    assert l4.peak_flops["bf16"] == 121e12 and l4.memory_bytes == 24e9  # 242 TFLOP/s with sparsity, halved
    assert l4.intra.name == "pcie" and math.isclose(l4.intra.bandwidth, 32e9)     # no NVLink: PCIe Gen4 x16 per direction
    assert l4.devices_per_node == 8 and math.isclose(l4.inter.bandwidth, 100e9 / 8 / 8)
