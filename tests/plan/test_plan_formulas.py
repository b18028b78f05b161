"""The planner's formulas (project/planner/), each against a count or a published formula it must equal:
Adam's bytes per parameter, the built model's parameters, model FLOPs split over tp and pp, the schedule
registry's bubble, the ring alpha-beta times, Korthikanti et al.'s activation table, and clear errors for
bad input. No processes start here (tests/plan/test_plan_measured.py checks against runs)."""
import math

import pytest

from communication.alpha_beta import collective_seconds, per_step_alpha_beta
from course.hardware import HARDWARE, Hardware, Link
from course.model import build_gpt2, count_parameters, model_flops_per_token
from memory.accounting import layer_activation_bytes, model_state_bytes
from project.planner.cli import main
from project.planner.config import PlanConfig
from project.planner.kernels import stage_flops
from project.planner.layout import pipeline_actions, stage_layout
from project.planner.memory import in_flight, stage_memory
from project.planner.step import predict, replay_step

# a device with round figures: 1 GFLOP/s, 10 us and 1 ns per byte per ring step, no base latency
# (no memory bandwidth, no SMs: every kernel at its FLOPs and the peak)
TOY = Hardware("toy", {"fp32": 1e9, "bf16": 4e9}, 1e12, Link("toy", 1e-5, 1e-9), None, 64)


def plan(**values):
    base = dict(preset="tiny", hardware="h100", vocab_size=1000, model_max_length=64, batch_size=16,
                micro_batches=1, precision="fp32", attention_kernel="eager")
    return PlanConfig.for_test(**(base | values))


@pytest.mark.parametrize("precision,per_param", [("fp32", (4, 4, 8)), ("bf16", (2, 2, 12))])
def test_adam_bytes_per_parameter_and_zero_sharding(precision, per_param):
    n, dp = 1000, 4
    p, g, k = (x * n for x in per_param)
    want = {0: (p, g, k), 1: (p, g, k / dp), 2: (p, g / dp, k / dp), 3: (p / dp, g / dp, k / dp)}
    for stage, (wp, wg, wk) in want.items():
        got = model_state_bytes(stage, n, dp, precision)
        assert (got["params"], got["grads"], got["optimizer"]) == (wp, wg, wk), (precision, stage)


def test_one_rank_holds_the_built_models_parameters():
    config = plan()
    model = build_gpt2("tiny", 1000, n_positions=64, seed=0)
    assert stage_layout(config, 0).dense_params == count_parameters(model)
    memory = stage_memory(config, 0)
    assert memory.params == 4 * count_parameters(model) and memory.optimizer == 8 * count_parameters(model)


@pytest.mark.parametrize("mesh", [dict(dp=2), dict(tp=2), dict(pp=2, micro_batches=4), dict(dp=2, pp=2, tp=2,
                                                                                              micro_batches=2)])
@pytest.mark.needs_solution  # calls reference code the student release stubs
def test_model_flops_are_shared_out_over_the_mesh(mesh):
    """Every rank's FLOPs summed over the mesh are the model's FLOPs (6 N + 12 L h s per token): a
    formula that forgets to divide by tp or to split the blocks over pp computes more."""
    config = plan(**mesh)
    per_rank = sum(stage_flops(config, s, model_only=True) for s in range(config.pp))
    total = per_rank * config.tp * config.dp
    want = model_flops_per_token("tiny", 1000, 64) * config.batch_size * 64
    assert math.isclose(total, want, rel_tol=1e-12)
    assert math.isclose(predict(config, TOY).model_flops, want, rel_tol=1e-12)


def test_checkpointing_recomputes_one_forward():
    on, off = plan(activation_checkpointing=True), plan()
    assert stage_flops(on, 0, model_only=True) == stage_flops(off, 0)
    extra = stage_flops(on, 0) - stage_flops(off, 0)
    head_forward = 2 * 1000 * 128 * 16 * 64  # the head is not recomputed
    assert math.isclose(extra, (stage_flops(off, 0) / 3 - head_forward), rel_tol=1e-12)


@pytest.mark.parametrize("schedule,virtual,work", [("gpipe", 1, 1), ("1f1b", 1, 1), ("interleaved", 2, 2),
                                                   ("zb-h1", 1, 3)])
@pytest.mark.needs_solution  # calls reference code the student release stubs
def test_the_replayed_bubble_is_the_schedules_with_equal_stages(schedule, virtual, work):
    """The planner replays the schedule's action lists; with equal stages (a forward 1, a backward 2 — for ZB-H1
    its input and weight gradients 1 each — split over the chunks) the replay's idle share is the registry's
    formula (p - 1) / (w m + p - 1) (sums of a few small integers and halves: exact in floats up to 1e-12)."""
    from pipeline.metrics import measured_bubble_fraction

    p, m = 2, 4
    config = plan(pp=p, micro_batches=m, schedule=schedule, virtual_stages=virtual)
    cost = {"F": 1 / virtual, "B": 2 / virtual} if schedule != "zb-h1" else {"F": 1, "B": 1, "W": 1}
    events = replay_step(pipeline_actions(config), [cost] * p, 0.0)
    assert math.isclose(measured_bubble_fraction(events), (p - 1) / (work * m + p - 1), rel_tol=1e-12)


@pytest.mark.parametrize("schedule,virtual", [("gpipe", 1), ("1f1b", 1), ("interleaved", 2), ("zb-h1", 1)])
@pytest.mark.needs_solution  # calls reference code the student release stubs
def test_the_step_is_compute_bubble_and_exposed_communication(schedule, virtual):
    p, m = 2, 4
    config = plan(pp=p, micro_batches=m, schedule=schedule, virtual_stages=virtual)
    out = predict(config, TOY)
    # the tiny model's stages differ (the head is on the last): the replay's bubble is near the formula's, not
    # equal to it; both are fractions of a step (the planner's of its step, the formula's of an ideal one)
    assert 0 < out.bubble < 2 * out.bubble_theory
    assert math.isclose(out.bubble_s / out.step_s, out.bubble, rel_tol=1e-12)
    assert math.isclose(out.step_s, out.compute_s + out.bubble_s + out.comm_s + out.optimizer_s, rel_tol=1e-12)
    assert math.isclose(out.compute_s, sum(out.compute_by_class.values()), rel_tol=1e-12)
    assert math.isclose(sum(out.shares().values()), 1.0, rel_tol=1e-12)
    assert math.isclose(out.comm_s, sum(out.exposed_s.values()), rel_tol=1e-12)
    assert out.exposed_s["pp"] > 0  # every hand-over between the stages costs a send
    assert math.isclose(out.mfu, out.model_flops / (out.step_s * 2 * TOY.peak_flops["fp32"]), rel_tol=1e-12)


def test_no_pipeline_no_bubble():
    out = predict(plan(dp=2), TOY)
    assert out.bubble == 0 and out.bubble_s == 0


@pytest.mark.needs_solution  # calls reference code the student release stubs
def test_micro_batches_in_flight():
    """GPipe keeps every micro-batch; 1F1B at most p on the first stage and 1 on the last; ZB-H1 holds each
    micro-batch's graph until its weight gradient (W), so a stage holds more than 1F1B's; one stage with gradient
    accumulation holds one micro-batch at a time."""
    assert [in_flight(plan(pp=4, micro_batches=8, schedule="gpipe"), s) for s in range(4)] == [8] * 4
    assert [in_flight(plan(pp=4, micro_batches=8), s) for s in range(4)] == [4, 3, 2, 1]
    assert [in_flight(plan(pp=4, micro_batches=2), s) for s in range(4)] == [2, 2, 2, 1]
    zb = [in_flight(plan(pp=4, micro_batches=8, schedule="zb-h1"), s) for s in range(4)]
    assert all(z >= o for z, o in zip(zb, [4, 3, 2, 1])) and zb[-1] > 1
    assert in_flight(plan(micro_batches=4), 0) == 1


def test_ring_alpha_beta():
    a, b, n = 1e-5, 1e-9, 1 << 20
    for p in (2, 4, 8):
        assert math.isclose(collective_seconds("all_reduce", n, p, a, b), 2 * (p - 1) * (a + b * n / p))
        assert math.isclose(collective_seconds("all_gather", n, p, a, b), (p - 1) * (a + b * n / p))
        alpha, beta = per_step_alpha_beta(3e-4, 2e-9, p)
        assert math.isclose(collective_seconds("all_reduce", n, p, alpha, beta), 3e-4 + 2e-9 * n)
    assert collective_seconds("all_reduce", n, 1, a, b) == 0


@pytest.mark.parametrize("zero,kinds", [(0, {"all_reduce": 1}), (2, {"reduce_scatter": 1, "all_gather": 1})])
def test_data_parallel_time_is_the_gradients_ring(zero, kinds):
    """Without overlap (the course's own steps reduce after the backward pass) the dp ring adds in full."""
    dp = 4
    config = plan(dp=dp, zero=zero, dp_overlap="off")
    grads = stage_layout(config, 0).dense_params * 4
    want = sum(collective_seconds(k, grads, dp, TOY.intra.alpha, TOY.intra.beta) * c for k, c in kinds.items())
    out = predict(config, TOY)
    assert math.isclose(out.comm_s, want, rel_tol=1e-12)
    assert math.isclose(out.step_s, out.compute_s + want + out.optimizer_s, rel_tol=1e-12)


def test_activations_are_korthikantis_table_2():
    s, b, h, a = 1024, 4, 1600, 25
    for t in (1, 2, 4):
        assert math.isclose(layer_activation_bytes(s, b, h, a, t), s * b * h * (10 + 24 / t + 5 * a * s / (h * t)))
        assert math.isclose(layer_activation_bytes(s, b, h, a, t, sequence_parallel=True),
                            s * b * h / t * (34 + 5 * a * s / h))
    assert layer_activation_bytes(s, b, h, a, 2, checkpointing=True) == 2 * s * b * h


def test_tensor_parallelism_splits_the_weights_and_activations():
    one, two = stage_memory(plan(hardware="cpu"), 0), stage_memory(plan(hardware="cpu", tp=2), 0)
    assert 0.5 < two.params / one.params < 0.6  # layer norms and some biases stay whole
    assert 0.5 < two.activations / one.activations < 0.75


def test_published_figures():
    h100, a100 = HARDWARE["h100"], HARDWARE["a100"]
    assert (h100.peak_flops["bf16"], a100.peak_flops["bf16"]) == (989e12, 312e12)  # dense, per datasheets
    assert (h100.intra.bandwidth, a100.intra.bandwidth) == (450e9, 300e9)       # NVLink per direction
    assert h100.memory_bytes == a100.memory_bytes == 80e9


def test_a_mesh_that_does_not_divide_the_world_is_a_clear_message(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["--preset", "tiny", "--dp", "4", "--n_devices", "6", "--vocab_size", "1000"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "6" in err and "Traceback" not in err


def test_a_tp_that_does_not_divide_the_heads_is_a_clear_message(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["--preset", "tiny", "--tp", "3", "--vocab_size", "1000"])
    assert exit_.value.code == 2 and "--tp 3" in capsys.readouterr().err


@pytest.mark.needs_solution  # calls reference code the student release stubs
def test_a_model_that_does_not_fit_says_what_to_change(capsys):
    code = main(["--preset", "gpt3-6.7b", "--hardware", "a100", "--dp", "1", "--vocab_size", "50257",
                 "--model_max_length", "2048", "--batch_size", "8"])
    err = capsys.readouterr().err
    assert code == 2 and "does not fit" in err and "--zero" not in err and "--activation_checkpointing" in err
    assert main(["--preset", "gpt3-6.7b", "--hardware", "a100", "--tp", "8", "--pp", "4", "--dp", "2", "--zero", "1",
                 "--vocab_size", "50257", "--model_max_length", "2048", "--batch_size", "64",
                 "--micro_batches", "16"]) == 0
