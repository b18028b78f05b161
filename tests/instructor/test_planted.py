"""The graded tests reject the planted wrong solutions (tests/instructor/planted.py; instructor-only).

Each test runs a key's graded checks with one wrong solution planted — in this process, or in the ranks
through the worker's ``planted`` argument — and sees them fail where they should; where an older check
let the wrong solution through, it is run too and seen to pass, so the new check is what catches it.
"""
from __future__ import annotations

import contextlib
from unittest import mock

import pytest
import torch

from course.launch import RankFailure, launch
from tests.instructor.planted import ALTERNATIVES, PLANTED, plant


def planted_for(key: str) -> list[str]:
    return [name for name, p in PLANTED.items() if p.key == key]


@pytest.mark.timeout(300)
def test_ulysses_without_scale_fails_the_scaled_cases():
    from tests.context_parallel.test_ulysses import CASES, TOL
    from tests.context_parallel.workers import assert_equals_reference, read_case, ulysses_worker

    results = launch(ulysses_worker, 4, "ulysses without scale", device="cpu", timeout=150)
    for name in CASES:
        if name.endswith("-scaled"):
            with pytest.raises(AssertionError, match="output"):
                assert_equals_reference(read_case(results, name, 0), name, 0, TOL)
        else:  # the default scale: the wrong solution passes these
            for rank in range(4):
                assert_equals_reference(read_case(results, name, rank), name, rank, TOL)


@pytest.mark.parametrize("name", ["router softmax in the logits' dtype", "router softmax cast afterwards"])
def test_router_softmax_in_low_precision_is_rejected(name):
    from tests.moe import test_router_and_losses as graded

    with plant(name):
        for dtype in (torch.bfloat16, torch.float16):
            for normalize in (True, False):
                with pytest.raises(AssertionError, match="float32"):
                    graded.test_softmax_of_low_precision_logits_is_taken_in_float32(dtype, normalize)
        graded.test_gates_carry_the_gradient_of_the_softmax_over_all_experts()  # float32 logits: no difference


@pytest.mark.timeout(300)
@pytest.mark.parametrize("name", [n for n in planted_for("a5_8_2") if n != "rows sent in float32"])  # that one: CLASSES
def test_wrong_split_sizes_fail_on_the_counts_before_the_collective(name):
    from tests.moe.support import expert_parallel_worker

    with pytest.raises(RankFailure, match="all-to-all split sizes disagree between the ranks"):
        launch(expert_parallel_worker, 4, torch.float32, name, timeout=120, collective_timeout=60)


def deepseek_failures(modeling) -> dict[str, str]:
    """Run the DeepSeek layer's single-process graded checks in this process: {test: first line of its failure}."""
    from tests.moe import test_deepseek_moe as graded

    calls = {f"router {c}": (lambda c=c: graded.test_routing_equals_the_deepseek_v3_router(modeling, c))
             for c in graded.ROUTER_CASES}
    calls.update({f"block {c}": (lambda c=c: graded.test_layer_equals_the_deepseek_v3_moe_block(modeling, c))
                  for c in graded.LAYER_CASES})
    calls.update({f"test_sigmoid_of_low_precision_logits_is_taken_in_float32 {d} {g}":
                  (lambda d=d, g=g: graded.test_sigmoid_of_low_precision_logits_is_taken_in_float32(d, *g))
                  for d in (torch.bfloat16, torch.float16) for g in [(1, 1, True), (4, 2, False)]})
    for name in ("test_the_bias_chooses_and_the_gates_ignore_it",
                 "test_group_limited_routing_stays_in_the_chosen_groups",
                 "test_bias_update_on_a_hand_worked_case", "test_bias_update_with_no_load_keeps_every_bias",
                 "test_bias_update_when_one_expert_takes_every_token", "test_shared_experts_output_is_added"):
        calls[name] = getattr(graded, name)
    failures = {}
    for name, call in calls.items():
        try:
            call()
        except AssertionError as exc:
            failures[name] = str(exc).splitlines()[0]
    return failures


@pytest.mark.parametrize("name, caught_by", [
    ("deepseek softmax scores", "router"),
    ("deepseek bias in the gates", "test_the_bias_chooses_and_the_gates_ignore_it"),
    ("deepseek gates normalised over all experts", "router"),
    ("deepseek group score from the max", "test_group_limited_routing_stays_in_the_chosen_groups"),
    ("deepseek routed scaling factor omitted", "block"),
    ("deepseek bias update sign flipped", "test_bias_update_on_a_hand_worked_case"),
    ("deepseek sigmoid in the logits' dtype", "test_sigmoid_of_low_precision_logits_is_taken_in_float32"),
    ("deepseek sigmoid cast afterwards", "test_sigmoid_of_low_precision_logits_is_taken_in_float32"),
    ("deepseek shared experts omitted", "test_shared_experts_output_is_added"),
])
def test_wrong_deepseek_layers_are_rejected(name, caught_by):
    from transformers import DeepseekV3Config
    from transformers.models.deepseek_v3 import modeling_deepseek_v3

    assert PLANTED[name].key == "a5_8_4"
    assert not deepseek_failures((DeepseekV3Config, modeling_deepseek_v3)), "the reference must pass"
    with plant(name):
        failures = deepseek_failures((DeepseekV3Config, modeling_deepseek_v3))
    assert any(test.startswith(caught_by) for test in failures), f"{name} passed {caught_by}: failures {failures}"


@pytest.mark.timeout(300)
def test_gradients_over_the_world_size_fail_on_the_wider_meshes():
    from tests.moe.support import SYNC_EP_SIZES, WIDER_MESHES, gradient_sync_worker
    from tests.moe.test_ep_dp import WORLD, check_synced_gradients

    runs = launch(gradient_sync_worker, WORLD, "gradients over the world size", timeout=120, collective_timeout=60)
    for ep in SYNC_EP_SIZES:  # the world is dp x cp here: the wrong divisor is the right one
        check_synced_gradients(runs, ep, ep, WORLD)
    for mesh, sizes in WIDER_MESHES.items():
        with pytest.raises(AssertionError, match="divide by the dp x cp group's size"):
            check_synced_gradients(runs, mesh, sizes["ep"], sizes["dp"])


@pytest.mark.timeout(300)
@pytest.mark.parametrize("world_size", [2, 4])
def test_zero1_that_averages_only_the_slice_is_rejected(world_size):
    from tests.memory.test_zero1_zero2 import check_against_dp

    with pytest.raises(AssertionError, match="the parameters' .grad differ from the data-parallel mean gradient"):
        check_against_dp(1, world_size, "zero1 averages the slice only")


@pytest.mark.parametrize("name, message", [
    ("checkpoint restores the CPU generator only", "drew another dropout mask"),
    ("checkpoint restores the GPU generator without fork_rng", "moved the caller's GPU random stream"),
])
def test_checkpoint_without_the_gpu_generator_is_rejected(name, message, monkeypatch):
    from tests.memory import test_checkpointing_replay as graded

    assert PLANTED[name].key == "a5_5_4"
    with plant(name), pytest.raises(AssertionError, match=message):
        graded.test_recomputation_on_a_gpu_draws_from_the_gpus_generator(monkeypatch)


@pytest.mark.parametrize("name", ["quantization scale per tensor", "quantization scale from the mean",
                                  "quantization by truncation"])
def test_wrong_blockwise_quantizers_are_rejected(name):
    from tests.memory import test_quantized_sharding as graded

    with plant(name), pytest.raises(AssertionError, match="scales differ|exceeds half its block's step"):
        for case in graded.QUANTIZATION_CASES:
            graded.test_blockwise_quantization_has_one_scale_per_block_and_rounds_to_nearest(*case)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("name, check, message", [
    ("gathered weights not dequantized", "training", "dequantize the gathered int8 weights"),
    ("qgz sums quantized values", "training", "dequantize each received chunk"),
    ("hpz backward all-gather in the dp group", "wire", "the backward's all-gather belongs to the node-sized group"),
])
def test_wrong_zeropp_steps_are_rejected(name, check, message, monkeypatch):
    from tests.memory import test_quantized_sharding as graded

    planted_run = graded.run.__wrapped__
    for layout, (world_size, node) in graded.LAYOUTS.items():
        monkeypatch.setattr(graded, "run", lambda w, n, _name=name: planted_run(w, n, _name))
        test = (graded.test_training_stays_within_the_quantization_tolerance_of_zero3_and_of_no_sharding
                if check == "training" else graded.test_int8_on_the_wire_and_the_backward_all_gather_inside_the_node)
        with pytest.raises(AssertionError, match=message):
            test(layout)


def hang_analysis_failures() -> dict[str, str]:
    """Run the graded checks of the hang analysis in this process: {test: first line of its failure}."""
    from tests.communication import test_hang_analysis as graded

    failures = {}
    for name in dir(graded):
        if name.startswith("test_"):
            try:
                getattr(graded, name)()
            except AssertionError as exc:
                failures[name] = str(exc).splitlines()[0]
    return failures


@pytest.mark.parametrize("name, caught_by", [
    ("divergences by place in the list", "test_records_lost_from_the_start_of_a_ring_buffer_are_no_divergence"),
    ("divergences ignoring the group", "test_a_run_that_did_not_hang_has_no_divergence"),
    ("the last divergence", "test_the_first_divergence_is_reported_not_the_last"),
    ("sends and receives lined up like collectives", "test_a_run_that_did_not_hang_has_no_divergence"),
    ("every rank a member of every group", "test_a_run_that_did_not_hang_has_no_divergence"),
    ("collectives compared by name", "test_a_collective_of_another_size_or_dtype_is_a_divergence"),
    ("only the receives walked", "test_a_send_that_no_receive_meets_is_a_divergence"),
    ("messages compared by size only", "test_a_message_received_into_another_dtype_of_the_same_count_is_a_divergence"),
    ("a pair judged without one rank's dump", "test_messages_to_and_from_a_rank_without_a_dump_are_not_judged"),
    ("collectives compared by hand-written fields", "test_an_all_to_all_of_uneven_splits_is_no_divergence"),
])
def test_wrong_hang_analyses_are_rejected(name, caught_by):
    assert PLANTED[name].key == "a5_4_4"
    assert not hang_analysis_failures(), "the reference must pass"
    with plant(name):
        failures = hang_analysis_failures()
    assert caught_by in failures, f"{name} passed {caught_by}: failures {failures}"


def test_the_wrong_hang_analyses_are_each_one_change_from_a_correct_one(monkeypatch):
    # planted.py's _divergences with no change passes every check: each planted analysis fails for its own fault
    from communication import hang_lab
    from tests.instructor.planted import _divergences

    monkeypatch.setattr(hang_lab, "first_divergences", _divergences()(hang_lab.first_divergences))
    assert not hang_analysis_failures()


@pytest.mark.parametrize("name", [name for name, p in ALTERNATIVES.items() if p.key == "a5_4_4"])
def test_correct_hang_analyses_written_otherwise_are_accepted(name):
    with plant(name):
        failures = hang_analysis_failures()
    assert not failures, f"{name} is a correct analysis, yet it fails {failures}"


# The graded test modules of the keys :func:`key_failures` runs, each with its cached launch (a function of the
# module taking ``planted``, which it passes to the ranks; None: the module starts no ranks).
GRADED = {
    "a5_5_1": {"tests.memory.test_zero1_zero2": "run"},
    "a5_5_2": {"tests.memory.test_zero1_zero2": "run"},
    "a5_5_3": {"tests.memory.test_fsdp": "run"},
    "a5_5_4": {"tests.memory.test_activation_checkpointing": None, "tests.memory.test_checkpointing_replay": None},
    "a5_5_5": {"tests.memory.test_quantized_sharding": "run"},
    "a5_8_1": {"tests.moe.test_router_and_losses": None, "tests.moe.test_layer": None},
    "a5_8_2": {"tests.moe.test_expert_parallel": "runs"},
    "a5_8_3": {"tests.moe.test_ep_dp": "sync_runs"},
    "a5_8_4": {"tests.moe.test_deepseek_moe": "parallel_runs"},
}


def _marks(obj) -> list:
    marks = getattr(obj, "pytestmark", [])
    return list(marks) if isinstance(marks, (list, tuple)) else [marks]


def graded_calls(key: str, module) -> dict:
    """Every test of ``module`` marked ``key``, once per parametrization: {test id: call}. Fixtures: the module's
    own (their functions called once) and ``monkeypatch``; a test taking ``tmp_path`` (a whole training command)
    is left out."""
    import inspect

    fixtures, calls = {}, {}
    module_marks = [m.name for m in _marks(module)]
    for name in dir(module):
        fn = getattr(module, name)
        if not name.startswith("test_") or key not in module_marks + [m.name for m in _marks(fn)]:
            continue
        wanted = inspect.signature(fn).parameters
        if "tmp_path" in wanted:
            continue
        combos = [{}]
        for mark in (m for m in _marks(fn) if m.name == "parametrize"):
            names = [n.strip() for n in mark.args[0].split(",")]
            rows = [dict(zip(names, v if len(names) > 1 else (v,))) for v in mark.args[1]]
            combos = [{**c, **r} for c in combos for r in rows]
        for combo in combos:
            for f in wanted:
                if f not in combo and f != "monkeypatch" and f not in fixtures:
                    fixtures[f] = getattr(module, f).__wrapped__()

            def call(fn=fn, combo=combo, wanted=wanted):
                with pytest.MonkeyPatch.context() as monkeypatch:
                    values = {**fixtures, "monkeypatch": monkeypatch, **combo}
                    fn(**{f: values[f] for f in wanted})
            calls[f"{name}{list(combo.values()) if combo else ''}"] = call
    return calls


def key_failures(key: str, name: str | None, first: bool = False) -> dict[str, str]:
    """Every graded check of ``key`` (:data:`GRADED`) with ``name`` planted — of :data:`PLANTED` or
    ``ALTERNATIVES`` (None: the reference) — in this process and, through each module's cached launch, in the
    ranks: {test id: first line of its failure}; with ``first``, up to the first failure (the modules that start
    no ranks first)."""
    import importlib
    import inspect

    failures = {}
    modules = sorted(GRADED[key].items(), key=lambda item: item[1] is not None)
    with plant(name) if name else contextlib.nullcontext(), contextlib.ExitStack() as stack:
        for module_name, launcher in modules:
            module = importlib.import_module(module_name)
            if launcher is not None:
                original = getattr(module, launcher)
                fixed = list(inspect.signature(original).parameters).index("planted")
                stack.enter_context(mock.patch.object(
                    module, launcher, lambda *a, _o=original, _n=fixed, **k: _o(*a[:_n], planted=name)))
            for test, call in graded_calls(key, module).items():
                try:
                    call()
                except (Exception, pytest.fail.Exception) as exc:
                    failures[test] = (str(exc).splitlines() or [type(exc).__name__])[0]
                    if first:
                        return failures
    return failures


# One wrong solution of each class a key's checks could miss, where the class applies (docs/grading.md): a row or
# message not matched to its owner ("unmatched"), a tensor in another dtype ("mistyped"), a rank or expert left out
# or ranks outside the group taken in ("missing"), sizes that legitimately differ ("uneven").
CLASSES = [
    ("a5_8_1", "mistyped", "router z-loss in the logits' dtype"),
    ("a5_8_1", "unmatched", "unpermute gates read token-major"),
    ("a5_8_1", "missing", "counts without the idle last experts"),
    ("a5_8_1", "uneven", "capacity rounded down"),
    ("a5_8_4", "unmatched", "deepseek gates of the unbiased top-k"),
    ("a5_8_4", "uneven", "deepseek bias moved by the relative imbalance"),
    ("a5_5_4", "mistyped", "checkpoint without the forward's autocast"),
    ("a5_5_4", "unmatched", "checkpoint without the CPU's random state"),
    ("a5_5_1", "uneven", "shard range without padding"),
    ("a5_5_5", "uneven", "dequantize in whole blocks"),
    ("a5_8_2", "mistyped", "rows sent in float32"),
    ("a5_8_3", "unmatched", "expert gradients reduced in the dp group"),
    ("a5_8_3", "uneven", "expert gradients averaged over their replicas"),
    ("a5_5_1", "unmatched", "zero1 grads all from the buffer's start"),
    ("a5_5_1", "missing", "zero1 in the world, not its group"),
    ("a5_5_2", "missing", "zero2 in the world, not its group"),
    ("a5_5_3", "missing", "zero3 in the world, not its group"),
    ("a5_5_5", "mistyped", "qwz gathers fp32 values"),
    ("a5_5_5", "unmatched", "qgz scales read transposed"),
    ("a5_5_5", "missing", "hpz secondary slice by the dp rank"),
]
# Run by the tests above: a5_8_2 unmatched (the four split-size errors), missing ("counts exchanged in the world")
# and uneven ("splits assumed even"), all caught by the split-size check; a5_8_3 missing (the world size); a5_8_4
# mistyped (the sigmoid in the logits' dtype); a5_5_4 missing (a GPU's generator left out). Classes that do not
# apply: a5_8_4 missing (its blocks take no group; the loads' all-reduce is DeepSeekRouter.update_bias's); a5_8_3,
# a5_5_1, a5_5_2, a5_5_3 mistyped (their blocks pick groups and divisors; the flat buffers are the scaffolding's,
# fp32 or the gradients' own dtype); a5_5_2, a5_5_3 unmatched and uneven (a reduce-scatter's chunk r is group rank
# r's by definition; the padding is the scaffolding's); a5_5_4 uneven (nothing is cut into parts).


@pytest.mark.timeout(300)
@pytest.mark.parametrize("key, kind, name", CLASSES, ids=[f"{kind}-{name}" for _, kind, name in CLASSES])  # no key
def test_each_class_of_wrong_solution_fails_its_keys_tests(key, kind, name):
    assert PLANTED[name].key == key
    assert key_failures(key, name, first=True), f"{name} ({kind}) passes every check of {key}"


@pytest.mark.timeout(300)
@pytest.mark.parametrize("name", [name for name, p in ALTERNATIVES.items() if p.key == "a5_5_5" or p.key == "a5_8_4"])
def test_each_correct_alternative_passes_its_keys_tests(name):
    """A correct solution written otherwise than the reference (tests/instructor/planted.py, ``ALTERNATIVES``)
    passes every check of its key."""
    key = ALTERNATIVES[name].key
    failures = key_failures(key, name)
    assert not failures, f"{name}, a correct {key} solution, fails {failures}"


def test_every_planted_solution_is_run_here():
    text = open(__file__, encoding="utf-8").read()
    for name, planted in PLANTED.items():
        assert f'"{name}"' in text or f'planted_for("{planted.key}")' in text, f"{name} is planted but never run"
    assert not set(PLANTED) & set(ALTERNATIVES), "a name is planted as wrong and as correct"
    for name, alternative in ALTERNATIVES.items():
        assert f'p.key == "{alternative.key}"' in text, f"{name} is a correct alternative but never run"


def _fails(call) -> bool:
    try:
        call()
    except (AssertionError, ValueError, pytest.fail.Exception):
        return True
    return False


@pytest.mark.parametrize("name", planted_for("a5_2_7"))
def test_wrong_v_schedules_are_rejected(name):
    """Every planted DualPipeV / ZB-V generator differs from torch's lists; those that break the order of a
    micro-batch's actions (a W before its B, ZB-H1's order per chunk on the wrong placement) fail the structure
    check as well."""
    from tests.pipeline import test_dualpipe as graded

    schedule = "zbv" if name.startswith("zbv") else "dualpipev"
    structure_cases = [c for c in (("dualpipev", 2, 4), ("dualpipev", 3, 7), ("zbv", 2, 3), ("zbv", 4, 9))
                       if c[0] == schedule]
    with plant(name):
        assert any(_fails(lambda p=p: graded.test_action_lists_equal_torch(schedule, p)) for p in (1, 2, 3, 4)), \
            f"{name}: the lists passed the comparison with torch's"
        structure = [_fails(lambda c=c: graded.test_lists_are_complete_and_ordered(*c)) for c in structure_cases]
    if "W before its B" in name or "interleaved placement" in name:
        assert all(structure), f"{name}: the structure check let it through: {structure}"


DILOCO_CASE = {"diloco all-reduce over the world": "subgroups", "diloco mean over the world's size": "subgroups"}


@pytest.mark.timeout(300)
@pytest.mark.parametrize("name", planted_for("a5_1_4"))
def test_wrong_diloco_outer_steps_are_rejected(name):
    from tests.fault_tolerance.test_diloco_rendezvous import GROUPS, check_case
    from tests.fault_tolerance.workers import SUBGROUPS, diloco_worker

    runs = launch(diloco_worker, GROUPS, name, device="cpu", timeout=120, collective_timeout=60)
    case = DILOCO_CASE.get(name, "torchft")
    with pytest.raises(AssertionError, match="differ by"):
        check_case(runs, case, groups=SUBGROUPS if case == "subgroups" else None)


# ---- the classes of wrong solution reviewed per key (issue 53, item 3) -----------------------------------------------
# Each entry: the graded check that rejects the planted solution (run with it planted: in this process, or in the ranks
# through the worker's ``planted`` argument), and what its failure says (None: a bare assertion of the graded test).
# A run that fails on a collective one rank never meets ends with the launcher's report of it:
UNMATCHED = "deadlock|timed out|Timed out|never posted|SIGABRT|data size doesn't match"
# A planted solution that hangs is expected to: its runs wait this long (seconds) before a rank gives up, not the
# graded tests' 15-20 s (the reference never waits near it: tests/support/launching.py).
PLANTED_WAIT = 5

def _get(path: str):
    """``"module:attribute"`` -> the object (imported when the check runs, before anything is planted)."""
    import importlib

    module, _, attribute = path.partition(":")
    return getattr(importlib.import_module(module), attribute)


def _in_process(test: str, *args):
    """The graded test ``test`` run in this process with the solution planted."""
    def check(name, monkeypatch):
        function = _get(test)  # its module imported first: the plant replaces the module's names and puts them back
        with plant(name):
            function(*args)
    return check


def _launched(check, worker: str, world_size: int, *args, rules: bool = False, timeout: float = 120):
    """``check(launch(worker, world_size, *args, name))`` (``check``: a function or its ``"module:name"``), the ranks
    under NCCL's rules if ``rules``."""
    def run(name, monkeypatch):
        from course.nccl_rules import TIMEOUT_ENV
        from tests.support.rendezvous import under_rules

        if rules:
            under_rules(monkeypatch)
            monkeypatch.setenv(TIMEOUT_ENV, str(PLANTED_WAIT))
        out = launch(_get(worker), world_size, *args, name, timeout=timeout, collective_timeout=PLANTED_WAIT)
        (_get(check) if isinstance(check, str) else check)(out)
    return run


def _reading(results: str, test: str, *args):
    """The graded test ``test`` with the function its module reads its launch's results from (``results``,
    ``"module:attribute"``) answering with the planted solution's launch."""
    def run(name, monkeypatch):
        import importlib

        module, _, attribute = results.partition(":")
        graded = importlib.import_module(module)
        original = getattr(graded, attribute)
        monkeypatch.setattr(graded, attribute, lambda *a: original(*a, planted=name))
        _get(test)(*args)
    return run


def _checked(check: str, *extra):
    """A check of a launch's results that takes more arguments: ``check(out, *extra)``."""
    def call(out):
        _get(check)(out, *extra)
    return call


def _zero_bubble(name, monkeypatch):
    from tests.pipeline.test_zero_bubble import RecordingRunner, check_zero_bubble_runs

    check_zero_bubble_runs(launch(_get("tests.support.pipeline:gpt2_schedule_worker"), 2, "zb-h1", 1, RecordingRunner,
                                  name, timeout=180, collective_timeout=PLANTED_WAIT))


def _ring_runs(size, which):
    def run(name, monkeypatch):
        _get("tests.communication.test_ring_and_tree:_check")(_get("tests.communication.test_ring_and_tree:runs")(name),
                                                               size, which)
    return run


def _rendezvous_all_reduce(out):
    """tests/course/test_rendezvous.py's a5_4_1 check (the launch under NCCL's rules is the point)."""
    for rank, cases in out.items():
        for case, got, want in cases:
            assert torch.equal(got, want), f"rank {rank}: {case} differs from dist.all_reduce"


def _tp_stage(name, monkeypatch):
    from tests.three_d.test_tp_stage import CASES, test_tp_stages_equal_one_process_and_send_to_the_same_tp_rank

    out = launch(_get("tests.support.three_d:layouts_worker"), 4, list(CASES.values()), name, timeout=150,
                 collective_timeout=PLANTED_WAIT)
    test_tp_stages_equal_one_process_and_send_to_the_same_tp_rank(
        {n: {rank: r[i] for rank, r in out.items()} for i, n in enumerate(CASES)}, "peer")


THREE_D_RENDEZVOUS = [dict(dp=1, pp=2, tp=2, micro_batches=4, schedule="1f1b", max_norm=0.5),
                      dict(dp=2, pp=2, tp=1, micro_batches=2, schedule="gpipe", max_norm=0.5)]


def _three_d_rendezvous(out):
    """tests/course/test_rendezvous.py's a5_6_3 check."""
    from tests.three_d.test_step import check

    for i, case in enumerate(THREE_D_RENDEZVOUS):
        check({rank: r[i] for rank, r in out.items()}, case)


def _ulysses(out):
    from tests.context_parallel.test_ulysses import CASES, TOL
    from tests.context_parallel.workers import assert_equals_reference, read_case

    for case in CASES:
        for rank in range(4):
            assert_equals_reference(read_case(out, case, rank), case, rank, TOL)


def _ring_attention_float64(name, monkeypatch):
    from course.nccl_rules import ENV, TIMEOUT_ENV
    from tests.context_parallel import test_ring_attention as graded
    from tests.context_parallel.workers import ring_worker

    monkeypatch.setenv(ENV, "1")
    monkeypatch.setenv(TIMEOUT_ENV, str(PLANTED_WAIT))
    out = launch(ring_worker, 4, name, device="cpu", timeout=150, collective_timeout=PLANTED_WAIT)
    monkeypatch.setattr(graded, "results", lambda: out)
    graded.test_float64_blocks_travel_in_float64()


PARTITION, GRADIENTS, EPOCHS = "tests.data_parallel.test_partition", "tests.data_parallel.test_gradients", \
    "tests.data_parallel.test_epochs"
CLOCK, PIPE, STAGES = "tests.pipeline.test_clock_cycles_and_split", "tests.pipeline.test_pipe", \
    "tests.pipeline.test_gpt2_stages"
ONE_F_ONE_B, ZERO_BUBBLE = "tests.pipeline.test_gpipe_and_1f1b", "tests.pipeline.test_zero_bubble"
MAPPINGS, LAYERS, VOCAB, SEQUENCE = ("tests.tensor_parallel.test_mappings", "tests.tensor_parallel.test_layers",
                                     "tests.tensor_parallel.test_vocab_parallel",
                                     "tests.tensor_parallel.test_sequence_parallel")
BUCKETS, TOPK = "tests.communication.test_buckets", "tests.communication.test_compression"
BLOCKWISE = "tests.context_parallel.test_blockwise_attention"
LAYOUTS = "tests.support.three_d:layouts_worker"

REVIEWED = {
    "partition parts floored, the remainder dropped": (
        _in_process(f"{PARTITION}:test_equal_shards_are_disjoint_cover_everything_and_are_balanced", 2),
        "every element must land in exactly one shard"),
    "partition remainder to the last part": (
        _in_process(f"{PARTITION}:test_equal_shards_are_disjoint_cover_everything_and_are_balanced", 4),
        "equal fractions must give balanced shards"),
    "every rank loads shard 0": (
        _in_process(f"{PARTITION}:test_partition_dataset_gives_each_rank_its_shard_with_the_per_rank_batch", 2, 8),
        "disjoint and cover the dataset"),
    "gradients averaged over the world's size": (
        _launched(f"{GRADIENTS}:check_group_averages", f"{GRADIENTS}:group_worker", 4),
        "not the average over its group"),
    "gradients all-reduced in bf16": (
        _launched(_checked(f"{GRADIENTS}:check_averaged_gradients", 2), f"{GRADIENTS}:grad_worker", 2),
        "differs from single-process gradient"),
    "zero gradients not all-reduced": (
        _launched(_checked(f"{GRADIENTS}:check_averaged_gradients", 2), f"{GRADIENTS}:grad_worker", 2), UNMATCHED),
    "epoch sharded by the world's rank": (
        _launched(f"{EPOCHS}:check_groups", f"{EPOCHS}:groups_worker", 4), "not disjoint or miss data"),
    "every rank steps through its own batches": (
        _launched(f"{EPOCHS}:check_groups", f"{EPOCHS}:groups_worker", 4), "the dp group's ranks have 3 and 2 batches"),
    "dp step averaged over the world": (
        _launched(f"{EPOCHS}:check_groups", f"{EPOCHS}:groups_worker", 4), "average over the dp group, not the world"),
    "clock cycles leave the last stage out": (
        _in_process(f"{CLOCK}:test_clock_cycles_match_golden_schedule", 2, 3), "cycle"),
    "stages cut by the first stage's length": (
        _in_process(f"{CLOCK}:test_split_with_balance_keeps_several_cpu_stages", [2, 1, 2]), None),
    "pipe cuts split_size chunks": (
        _in_process(f"{PIPE}:test_split_size_is_the_micro_batch_size", 10, 4, [4, 4, 2]), "must make micro-batches"),
    "pipe drops the short last micro-batch": (
        _in_process(f"{PIPE}:test_split_size_is_the_micro_batch_size", 10, 4, [4, 4, 2]), None),
    "tied gradient skipped when missing": (
        _launched(_checked(f"{STAGES}:check_tied_sums", 1, 3, False), f"{STAGES}:tied_worker", 3, 1, 3, False),
        UNMATCHED),
    "tied gradient summed over the world": (
        _launched(_checked(f"{STAGES}:check_tied_sums", 2, 2, True), f"{STAGES}:tied_worker", 4, 2, 2, True),
        "is not the sum"),
    "1f1b warm-up not capped at m": (_in_process(f"{ONE_F_ONE_B}:test_one_f_one_b_golden_lists"), None),
    "backward keeps the micro-batch in flight": (
        _launched(f"{ONE_F_ONE_B}:check_pipeline_runs", f"{ONE_F_ONE_B}:pipeline_worker", 3, ["gpipe", "1f1b"]),
        "1F1B in-flight micro-batches"),
    "interleaved rounds of p when m < p": (
        _in_process("tests.pipeline.test_interleaved:test_action_lists_equal_torch_interleaved_1f1b", 4), "p=4"),
    "zb-h1 B computes the weight gradients too": (_zero_bubble, "differs from one process|B must compute only"),
    "zb-h1 deferrals counted from the last rank": (
        _in_process(f"{ZERO_BUBBLE}:test_action_lists_equal_torch_zero_bubble", 2), "rank"),
    "f's backward all-reduce over the world": (
        _reading(f"{MAPPINGS}:operator_results", f"{MAPPINGS}:test_f_is_identity_forward_and_all_reduce_backward"),
        "must sum the gradients of its group"),
    "chunks split by the global rank": (
        _reading(f"{MAPPINGS}:operator_results", f"{MAPPINGS}:test_scatter_keeps_its_own_part_and_gathers_gradient"),
        "raised on rank 2|scatter forward on rank"),
    "g's sum in float32": (
        _reading(f"{MAPPINGS}:operator_results", f"{MAPPINGS}:test_a_float64_tensor_stays_float64_and_exact", "g"),
        "returned torch.float32 for a float64 tensor"),
    "column layer's f without the group": (
        _reading(f"{LAYERS}:operator_results", f"{LAYERS}:test_column_parallel_equals_linear"), "input gradient"),
    "row layer's g without the group": (
        _reading(f"{LAYERS}:operator_results", f"{LAYERS}:test_row_parallel_equals_linear"), "output"),
    "vocab embedding reduced over the world": (
        _reading(f"{VOCAB}:operator_results", f"{VOCAB}:test_vocab_parallel_embedding_equals_embedding"),
        "embedding output"),
    "vocab cross-entropy's sums over the world": (
        _reading(f"{VOCAB}:operator_results", f"{VOCAB}:test_vocab_parallel_cross_entropy_equals_cross_entropy", 1.0),
        "per-token loss"),
    "tp head's f without the group": (
        _reading("tests.tensor_parallel.test_gpt2:gpt2_results",
                 "tests.tensor_parallel.test_gpt2:test_tp_gpt2_in_the_tp_groups_of_a_larger_world_equals_transformers"),
        "gradient of"),
    "sequence gather over the world": (
        _reading(f"{SEQUENCE}:operator_results", f"{SEQUENCE}:test_gather_from_sequence_parallel_region"),
        "sequence gather raised on rank|all-gather along the sequence"),
    "partial grads synced over the world": (
        _reading("tests.tensor_parallel.test_gpt2:gpt2_results",
                 f"{SEQUENCE}:test_sequence_parallel_gpt2_in_the_tp_groups_of_a_larger_world"), "gradient of"),
    "ring chunks floored, the remainder dropped": (_ring_runs(3, "ring"), "int64 SUM differs"),
    "ring sends before it receives": (
        _launched("tests.instructor.test_planted:_rendezvous_all_reduce", "tests.support.rendezvous:all_reduce_worker",
                  4, rules=True), UNMATCHED),
    "ring messages in float32": (_ring_runs(4, "ring"), "float64 SUM differs"),
    "ring peers addressed by their rank in the group": (
        _ring_runs(3, "ring"), f"SUM differs|not part of group|{UNMATCHED}"),
    "bucket closed at its capacity": (
        _in_process(f"{BUCKETS}:test_buckets_follow_reverse_registration_order_and_capacity"), None),
    "last bucket dropped": (
        _in_process(f"{BUCKETS}:test_buckets_follow_reverse_registration_order_and_capacity"), None),
    "buckets launched as they fill": (
        _launched(f"{BUCKETS}:check_bucket_order", f"{BUCKETS}:overlap_worker", 2), f"in the order|{UNMATCHED}"),
    "buckets averaged over the ranks that used them": (
        _launched(f"{BUCKETS}:check_equal_to_average_gradients_and_ddp", f"{BUCKETS}:equality_worker", 2),
        "differs from DDP"),
    "top-k values sent in float32": (
        _in_process(f"{TOPK}:test_topk_sends_the_largest_entries_of_gradient_plus_residual", (10,), 0.3),
        "values must be the"),
    "top-k residual in the default dtype": (
        _in_process(f"{TOPK}:test_topk_sends_the_largest_entries_of_gradient_plus_residual", (10,), 0.3),
        "the new residual"),
    "3d head's f without the group": (_tp_stage, UNMATCHED),
    "3d gradients averaged by the world's size": (
        _launched("tests.instructor.test_planted:_three_d_rendezvous", LAYOUTS, 4, THREE_D_RENDEZVOUS, rules=True,
                  timeout=200), "global gradient norm"),
    "3d norm counts replicated parameters on every tp rank": (
        _launched("tests.instructor.test_planted:_three_d_rendezvous", LAYOUTS, 4, THREE_D_RENDEZVOUS, rules=True,
                  timeout=200), "global gradient norm"),
    "3d norm not summed over the pipeline": (
        _launched("tests.instructor.test_planted:_three_d_rendezvous", LAYOUTS, 4, THREE_D_RENDEZVOUS, rules=True,
                  timeout=200), "global gradient norm"),
    "online update in the inputs' dtype": (
        _in_process(f"{BLOCKWISE}:test_bf16_inputs_are_folded_into_float32_statistics_in_float32"),
        "compute the scores and products in the statistics' dtype"),
    "block gradients in the inputs' dtype": (
        _in_process(f"{BLOCKWISE}:test_bf16_block_gradients_are_computed_in_the_statistics_dtype"),
        "compute in the dtype of lse"),
    "causal tile skipped at the diagonal": (
        _in_process(f"{BLOCKWISE}:test_equals_sdpa_forward_and_backward", 33, 1, True), "causal=True, block 1"),
    "ring attention receives into a float32 buffer": (_ring_attention_float64, f"x torch.float32|{UNMATCHED}"),
    "zig-zag second chunk from the middle": (
        _in_process("tests.context_parallel.test_ring_attention:test_zigzag_and_contiguous_chunks", 2), None),
    "ulysses output all-to-all over the world": (
        _launched("tests.instructor.test_planted:_ulysses", "tests.context_parallel.workers:ulysses_worker", 4,
                  timeout=150), "output"),
}
MESH_ARITHMETIC = ["mesh coordinates with dp fastest", "tp group counted from the rank"]


@pytest.mark.timeout(300)
@pytest.mark.parametrize("name", list(REVIEWED))
def test_reviewed_wrong_solutions_are_rejected(name, monkeypatch):
    check, message = REVIEWED[name]
    with pytest.raises((AssertionError, RankFailure, pytest.fail.Exception), match=message):
        check(name, monkeypatch)


from tests.three_d.test_mesh_arithmetic import device_meshes  # noqa: E402,F401 (the graded test's fixture)


@pytest.mark.parametrize("name", MESH_ARITHMETIC)
def test_wrong_mesh_arithmetic_is_rejected(name, device_meshes):  # noqa: F811
    from tests.three_d.test_mesh_arithmetic import test_coordinates_and_groups_equal_init_device_mesh as test

    with plant(name), pytest.raises(AssertionError, match=r"of \(dp, pp, tp\) = \(2, 1, 4\)"):
        test(device_meshes, (2, 1, 4))
