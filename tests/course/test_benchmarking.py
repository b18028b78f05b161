"""Ungraded: the one benchmark harness (course.benchmarking) — its statistics, the warm-up and interleaving
of repeats, the machine description, the report and the shared command line (no process started)."""
from __future__ import annotations

import json
from unittest import mock

import pytest

from course import benchmarking


def test_summarise_gives_the_median_and_the_spread():
    assert benchmarking.summarise([3.0, 1.0, 2.0]) == {"median": 2.0, "min": 1.0, "max": 3.0, "n": 3,
                                                        "all": [3.0, 1.0, 2.0]}
    assert benchmarking.summarise([4, 1, 3, 2])["median"] == 2.5  # the mean of the middle two
    with pytest.raises(ValueError, match="no repeat"):
        benchmarking.summarise([])
    r = benchmarking.ratios([2.0, 4.0, 9.0], [1.0, 2.0, 3.0])  # per repeat, side by side: 2, 2, 3
    assert (r["median"], r["min"], r["max"]) == (2.0, 2.0, 3.0)
    with pytest.raises(ValueError, match="side by side"):
        benchmarking.ratios([1.0], [1.0, 2.0])
    assert benchmarking.apart({"min": 3, "max": 4}, {"min": 1, "max": 2.5})
    assert not benchmarking.apart({"min": 2, "max": 4}, {"min": 1, "max": 2.5})


def test_interleaved_warms_up_then_takes_turns_and_times_each_call_on_the_clock():
    calls, clock = [], iter(float(t) for t in range(100))
    variants = {"a": lambda: calls.append("a"), "b": lambda: calls.append("b")}
    with mock.patch.object(benchmarking, "now", side_effect=lambda device=None: next(clock)):
        times = benchmarking.interleaved(variants, repeats=3, warmup=2, inner=2)
    assert calls[:4] == ["a", "a", "b", "b"], "warm-up: each variant, untimed"
    assert calls[4:] == ["a", "a", "b", "b"] * 3, "then the variants take turns in every repeat"
    assert times == {"a": [0.5] * 3, "b": [0.5] * 3}, "seconds per call: one clock tick over inner=2 calls"


def test_machine_describes_cores_cpu_device_versions_and_load():
    import torch

    info = benchmarking.machine("cpu")
    assert info["cores"] >= 1 and info["usable_cores"] >= 1 and info["cpu_model"]
    assert info["device"] == "cpu" and info["torch"] == torch.__version__ and info["timer"] == "host-clock"
    assert len(info["load_average"]) == 3 and "gpu" not in info
    assert f"{info['cores']} cores" in benchmarking.describe(info)


def test_report_holds_the_machine_and_the_options(tmp_path):
    with pytest.raises(ValueError, match="machine"):
        benchmarking.write_report(tmp_path / "r.json", {"config": {}})
    path = benchmarking.write_report(tmp_path / "r.json", {"machine": benchmarking.machine(), "config": {"a": 1},
                                                            "rows": [1]})
    assert json.loads(path.read_text())["rows"] == [1]


def test_the_shared_command_line_checks_repeats(capsys):
    parser = benchmarking.parser("demo", out="x.json", timeout=10.0)
    parser.add_argument("--pp", type=int, nargs="+", default=[2])
    args = parser.parse_args(["--pp", "3", "4", "--repeats", "3"])
    assert args.pp == [3, 4] and str(args.out) == "x.json" and args.timeout == 10.0
    assert benchmarking.check(parser, args, 2).device == "cpu"  # the test suite pins the CPU
    for argv, message in ((["--repeats", "2"], "--repeats must be >= 3"), (["--warmup", "-1"], "--warmup must be >= 0")):
        with pytest.raises(SystemExit):
            benchmarking.check(parser, parser.parse_args(argv), 2)
        assert message in capsys.readouterr().err


@pytest.mark.parametrize("module,argv,message", [
    ("pipeline.labs.schedule_benchmark", ["--pp", "2", "--micro_batches", "5"], "--micro_batches 5 with --pp 2"),
    ("three_d.labs.factorisation_benchmark", ["--batch_size", "30"], "--batch_size 30 must be divisible"),
    ("project.tools.benchmark", ["--dp", "1"], "--world_sizes and --dp must be >= 2"),
])
def test_every_benchmark_takes_the_run_configurations_names(module, argv, message, capsys):
    import importlib

    parse = importlib.import_module(module).parse_args
    try:
        args = parse(argv)
    except SystemExit:
        args = None
    assert message in capsys.readouterr().err
    if args is not None:
        assert args.pp == [2] and args.micro_batches == [4]


def test_conditions_class_the_machine_by_busy_ranks_and_other_load():
    base = {"cores": 2, "usable_cores": 2, "device": "cpu"}
    assert benchmarking.conditions({**base, "load_average": [0.2, 0, 0], "busy_ranks": 2}) == "quiet"
    assert benchmarking.conditions({**base, "load_average": [0.2, 0, 0], "busy_ranks": 3}) == "oversubscribed"
    # busy ranks + the others' load must fit the cores (half a thread of slack for the sampling)
    assert benchmarking.conditions({**base, "load_average": [1.5, 0, 0], "busy_ranks": 1}) == "quiet"
    assert benchmarking.conditions({**base, "load_average": [1.6, 0, 0], "busy_ranks": 1}) == "loaded"
    assert benchmarking.conditions({**base, "load_average": [0.8, 0, 0], "busy_ranks": 2}) == "loaded"
    # After the run the load holds the run's own busy ranks: only the rest counts as other load.
    assert benchmarking.conditions({**base, "load_average": [0.1, 0, 0], "load_average_after": [2.4, 0, 0],
                                    "busy_ranks": 2}) == "quiet"
    assert benchmarking.conditions({**base, "load_average": [0.1, 0, 0], "load_average_after": [4.0, 0, 0],
                                    "busy_ranks": 2}) == "loaded"
    # One GPU per rank: ranks do not share the CPU's cores for their compute.
    assert benchmarking.conditions({**base, "device": "cuda:0", "load_average": [0.1, 0, 0], "busy_ranks": 8}) == "quiet"
    info = benchmarking.finish(benchmarking.machine("cpu", busy_ranks=1))
    assert info["conditions"] in ("quiet", "loaded") and len(info["load_average_after"]) == 3
    assert "conditions:" in benchmarking.describe(info) and "1 busy ranks" in benchmarking.describe(info)


def test_quiet_only_when_the_busy_ranks_and_the_others_fit_the_cores_at_the_start_and_the_end():
    """Notebook 03 was called quiet with 1.0 other runnable thread beside its 2 ranks on 2 cores, notebook 04 with
    0.8: both are loaded. The threads at the end count as much as those at the start."""
    base = {"cores": 2, "usable_cores": 2, "device": "cpu", "busy_ranks": 2}
    assert benchmarking.conditions({**base, "others_running": 1.0, "others_running_after": 0.0}) == "loaded"
    assert benchmarking.conditions({**base, "others_running": 0.8}) == "loaded"
    assert benchmarking.conditions({**base, "others_running": 0.0, "others_running_after": 0.8}) == "loaded"
    assert benchmarking.conditions({**base, "others_running": 0.2, "others_running_after": 0.4}) == "quiet"
    assert benchmarking.conditions({**base, "busy_ranks": 1, "others_running": 1.0}) == "quiet"
    line = benchmarking.conditions_clause({**base, "others_running": 1.0, "others_running_after": 0.2})
    assert line == ("conditions: loaded (2 busy ranks + 1.0 other runnable threads at the start, 0.2 at the end, "
                    "on 2 cores)")


# Planted paired series: the verdict comes from the per-repeat ratios, never from unpaired ranges.
SLOW_ROUNDS = [1.0, 1.3, 0.9, 1.6, 1.1, 1.4, 1.0]  # the machine's load moves every round


def test_every_paired_ratio_one_way_is_a_verdict_even_when_the_ranges_overlap():
    """Notebook 05's ZeRO-3 against ZeRO-0: 7 paired ratios 0.569-0.933, all below 1, ranges overlapping."""
    a = [0.7 * x for x in SLOW_ROUNDS]
    a[3] = 0.93 * SLOW_ROUNDS[3]  # one round only just below 1
    v = benchmarking.compare(a, SLOW_ROUNDS, ("zero3", "zero0"), conditions="quiet")
    assert v["overlap"], "the unpaired ranges overlap..."
    assert v["verdict"] == "faster" and v["sign"] == {"below": 7, "above": 0, "ties": 0, "p": 2 / 128}
    assert v["sentence"].startswith("verdict: zero3 is faster than zero0") and "7 of 7 repeats below 1" in v["sentence"]
    assert "conditions: quiet" in v["sentence"]
    assert benchmarking.compare(SLOW_ROUNDS, a)["verdict"] == "slower"
    # a rate: higher is better, so the same ratios all above 1 make a faster
    assert benchmarking.compare(SLOW_ROUNDS, a, lower_is_better=False)["verdict"] == "faster"


def test_balanced_paired_ratios_are_indistinguishable_whatever_the_medians():
    b = [2.0] * 7
    a = [1.0, 3.0, 1.0, 3.0, 1.0, 3.0, 2.5]  # 3 below, 4 above
    v = benchmarking.compare(a, b)
    assert v["verdict"] == "indistinguishable" and (v["sign"]["below"], v["sign"]["above"]) == (3, 4)
    assert "are indistinguishable" in v["sentence"] and "p = 1 >= 0.05" in v["sentence"]
    # 6 of 7 one way is not enough for 95 % (p = 0.125): the sign test is exact
    a = [1.0] * 6 + [3.0]
    assert benchmarking.compare(a, b)["verdict"] == "indistinguishable"


def test_too_few_repeats_give_no_verdict_and_say_so():
    fast, slow = [1.0, 1.1, 1.05, 0.98], [2.0, 2.1, 2.2, 1.9]
    v = benchmarking.compare(fast, slow, ("bucketed", "plain"))
    assert v["verdict"] == "indistinguishable" and not v["overlap"] and "too few repeats" in v["sentence"]
    assert benchmarking.repeats_for_verdict() == 6 and benchmarking.sign_test_p(7, 0) < 0.05
    assert benchmarking.sign_test_p(5, 0) > 0.05 and benchmarking.sign_test_p(0, 0) == 1.0
    assert benchmarking.compare(fast, slow) == benchmarking.compare(fast, slow), "seeded: the same verdict"
    with pytest.raises(ValueError, match="side by side"):
        benchmarking.compare([1.0, 2.0, 3.0], [1.0, 2.0])
    with pytest.raises(ValueError, match="3"):
        benchmarking.compare([1.0, 2.0], [1.0, 2.0])


def test_a_rate_above_the_machines_peak_is_refused():
    peak = 100e9
    assert benchmarking.check_rate(40e9, peak, "matmul", ranks=2) == 40e9
    with pytest.raises(ValueError, match="above this machine's measured peak"):
        benchmarking.check_rate(81.7e9, peak, "planner's rate per rank", ranks=8)  # notebook 06's 650 GFLOP/s
    measured = benchmarking.machine_peak_flops()
    assert measured >= benchmarking.peak_flops(1) > 0


def test_fit_quality_fails_a_negative_or_clamped_coefficient_and_flags_large_residuals():
    good = benchmarking.fit_quality([1.0, 2.0, 4.0], [1.1, 1.9, 4.0], {"alpha": 1e-5, "beta": 1e-9})
    assert good["quality"] == "good" and good["worst_factor"] < 1.2
    poor = benchmarking.fit_quality([1.0, 2.0, 8.0], [1.0, 2.0, 4.0], {"alpha": 1e-5, "beta": 1e-9})
    assert poor["quality"] == "poor" and poor["worst_factor"] == 2.0
    assert benchmarking.fit_quality([1.0], [1.0], {"alpha": 1e-5, "beta": -1e-9})["quality"] == "failed"
    failed = benchmarking.fit_quality([1.0], [1.0], {"alpha": 1e-5, "beta": 0.0}, clamped=("beta",))
    assert failed["quality"] == "failed" and "beta" in failed["reason"]


def test_conditions_read_the_other_processes_running_now_when_sampled():
    base = {"cores": 2, "usable_cores": 2, "device": "cpu", "busy_ranks": 2}
    # The lagging load average holds the caller's own last minute: the sampled count of other runnable threads wins.
    assert benchmarking.conditions({**base, "load_average": [3.0, 0, 0], "others_running": 0.2,
                                    "others_running_after": 0.0}) == "quiet"
    assert benchmarking.conditions({**base, "load_average": [0.1, 0, 0], "others_running": 0.0,
                                    "others_running_after": 1.6}) == "loaded"
    assert benchmarking.conditions({**base, "busy_ranks": 3, "others_running": 0.0}) == "oversubscribed"
    now = benchmarking.others_running(samples=2, interval_s=0.0)
    assert now is None or now >= 0
    assert "other runnable threads at the start" in benchmarking.describe(benchmarking.finish(benchmarking.machine()))
