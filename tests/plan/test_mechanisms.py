"""What the planner adds to the kernels' roofline because it is there in every run (project/planner/pricing.py,
kernels.py, step.py): the clock a power limit holds, the SMs a hidden collective takes from the computation beside
it, the norms and GeLU as the frameworks run them, the precision the gradients are reduced in, and the table of
each mechanism's effect on the published rows (published_runs.mechanism_effects). Each against a count by hand:
products and sums of a few numbers, exact or to 1e-12 relative. No processes start."""
import math
from dataclasses import replace

import pytest

from course.config import ConfigError
from course.hardware import HARDWARE, NCCL_CTAS
from project.planner.communication import stage_communication
from project.planner.config import PlanConfig
from project.planner.kernels import norm_bytes, stage_kernels
from project.planner.layout import sizes
from project.planner.pricing import Kernel, clock_factor, contention_seconds, kernel_seconds
from project.planner.step import predict

REL = 1e-12


def plan(**values):
    base = dict(preset="gpt2", hardware="h100", vocab_size=5000, model_max_length=256, batch_size=8,
                micro_batches=1, precision="bf16")
    return PlanConfig.for_test(**(base | values))


def test_a_power_limit_slows_compute_bound_kernels_by_the_cube_root_and_leaves_memory_alone():
    capped, full = HARDWARE["h100-96gb"], HARDWARE["h100"]
    assert math.isclose(clock_factor(capped), (500 / 700) ** (1 / 3), rel_tol=REL)
    assert clock_factor(full) == 1.0 and clock_factor(HARDWARE["a100"]) == 1.0
    assert clock_factor(replace(full, power_w=0.0)) == 1.0            # not modelled: no change
    assert clock_factor(replace(full, power_w=900.0)) == 1.0          # above the reference: no faster than measured
    same_memory = replace(capped, memory_bandwidth=full.memory_bandwidth)
    gemm = Kernel("fc", "gemm", "F", 2.0 * 8192 * 8192 * 8192, 1.0, (8192, 8192, 8192, 1))
    assert math.isclose(kernel_seconds(gemm, same_memory, "bf16") * clock_factor(capped),
                        kernel_seconds(gemm, full, "bf16"), rel_tol=REL)
    norm = Kernel("norm", "memory", "F", 0.0, 1e9)
    assert kernel_seconds(norm, same_memory, "bf16") == kernel_seconds(norm, full, "bf16")


def test_hidden_collectives_cost_the_share_of_the_sms_they_hold():
    h100 = HARDWARE["h100"]
    assert h100.comm_sms == NCCL_CTAS == 24 and h100.sms == 132
    assert math.isclose(contention_seconds(1.0, h100), 24 / 132, rel_tol=REL)
    assert contention_seconds(1.0, replace(h100, comm_sms=0)) == 0.0 and contention_seconds(0.0, h100) == 0.0
    assert HARDWARE["l4"].comm_sms == 0  # PCIe rings: not modelled
    config = plan(dp=8, zero=3, batch_size=16)
    out, without = predict(config, h100), predict(config, replace(h100, comm_sms=0))
    hidden = sum(t for g, t in out.hidden_s.items() if g != "pp")
    assert hidden > 0
    assert math.isclose(out.compute_by_class["contention"], hidden * 24 / 132, rel_tol=REL)
    assert math.isclose(out.step_s - without.step_s, out.compute_by_class["contention"], rel_tol=1e-9)
    assert math.isclose(out.step_s, out.compute_s + out.bubble_s + out.comm_s + out.optimizer_s, rel_tol=REL)
    assert math.isclose(sum(out.shares().values()), 1.0, rel_tol=REL)
    exposed = predict(plan(dp=8, zero=3, batch_size=16, dp_overlap="off"), h100)  # nothing hidden, nothing lost
    assert exposed.compute_by_class["contention"] == 0.0


def test_rmsnorm_written_as_pytorch_operations_moves_its_bytes_as_counted():
    llama = dict(preset="llama3.2-3b", vocab_size=None)
    eager, compiled = plan(**llama), plan(fused_kernels=True, **llama)
    e = sizes(eager).e
    assert (eager.norms, compiled.norms, plan().norms) == ("composite", "fused", "fused")  # GPT-2: LayerNorm
    assert norm_bytes(eager) == (4 * e + 28, 8 * e + 60) and norm_bytes(compiled) == (2 * e, 3 * e)
    fused = plan(norm_kernel="fused", **llama)  # nanotron's Triton RMSNorm
    assert fused.norms == "fused" and norm_bytes(fused) == (2 * e, 3 * e)
    z = sizes(eager)
    x = z.tokens * z.h
    got = {k.name: k.bytes for k in stage_kernels(eager, 0) if k.name.startswith(("norms", "final norm"))}
    assert got == {"norms": 2 * (4 * e + 28) * x, "norms (backward)": 2 * (8 * e + 60) * x,
                   "final norm": (4 * e + 28) * x, "final norm (backward)": (8 * e + 60) * x}
    with pytest.raises(ConfigError, match="--norm_kernel composite"):
        plan(norm_kernel="composite")


def test_gelu_is_eight_operations_only_in_the_course_blocks():
    z = sizes(plan())
    f = z.tokens * z.f_t
    for config, per_element in ((plan(), (2, 3)), (plan(activation_model="course"), (18, 30)),
                                (plan(activation_model="course", fused_kernels=True), (2, 3))):
        got = {k.name: k.bytes for k in stage_kernels(config, 0) if k.name.startswith("gelu")}
        assert got == {"gelu": per_element[0] * z.e * f, "gelu (backward)": per_element[1] * z.e * f}


def test_gradients_reduce_in_the_precision_asked():
    def reduced(config):
        return [c.bytes for c in stage_communication(config, 0) if c.kind == "reduce_scatter"]

    bf16, fp32 = plan(dp=8, zero=3, batch_size=16), plan(dp=8, zero=3, batch_size=16, reduce_dtype="fp32")
    assert (bf16.gradient_bytes, fp32.gradient_bytes, plan(precision="fp32").gradient_bytes) == (2, 4, 4)
    assert [2 * b for b in reduced(bf16)] == reduced(fp32)
    with pytest.raises(ConfigError, match="--reduce_dtype bf16 with --precision fp32"):
        plan(precision="fp32", reduce_dtype="bf16")


@pytest.mark.needs_solution  # the rows replay pipeline schedules (assignment 5.2.4's 1F1B)
def test_each_mechanisms_effect_is_the_error_with_it_less_the_error_without():
    from project.planner import published_runs as P

    titan = [r for r in P.torchtitan_rows() if r.config.dp == 8 and not r.config.fused_kernels]
    effects = P.mechanism_effects(titan)[0]
    assert [n for n, *_ in P.MECHANISMS] == [k for k in effects if k not in ("run", "error")]
    row = titan[0]
    without_cap = P.with_change(row, None, lambda hw: replace(hw, power_w=hw.reference_power_w))
    assert math.isclose(effects["clock under a power limit"], row.error - (without_cap / row.published - 1),
                        rel_tol=REL)
    # each is a cost: taking it out makes the prediction faster, so the error falls with it
    for name in ("SMs held by hidden collectives", "clock under a power limit", "RMSNorm as 8 eager kernels",
                 "gradients reduced in fp32"):
        assert effects[name] < 0, name
    assert effects["nanotron's fused RMSNorm"] is None and effects["GeLU as one kernel"] is None  # not in this run
