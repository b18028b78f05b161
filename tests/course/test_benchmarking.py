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
    assert benchmarking.conditions({**base, "load_average": [1.5, 0, 0], "busy_ranks": 1}) == "loaded"
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


def test_compare_names_a_winner_only_when_the_repeats_separate():
    fast, slow = [1.0, 1.1, 1.05, 0.98], [2.0, 2.1, 2.2, 1.9]
    v = benchmarking.compare(fast, slow, ("bucketed", "plain"))
    assert v["verdict"] == "faster" and not v["overlap"] and v["interval"][1] < 1
    assert v["sentence"].startswith("bucketed is faster than plain")
    assert benchmarking.compare(slow, fast)["verdict"] == "slower"
    # A rate (tokens/s): higher is better.
    assert benchmarking.compare(slow, fast, lower_is_better=False)["verdict"] == "faster"
    # Overlapping ranges: no winner, whatever the medians say.
    v = benchmarking.compare([1.0, 1.1, 2.05], [2.0, 2.1, 2.2])
    assert v["verdict"] == "indistinguishable" and v["overlap"] and "indistinguishable" in v["sentence"]
    # The rounds disagree (ratios on both sides of 1): the interval of the ratio holds 1.
    v = benchmarking.compare([1.0, 3.0, 1.0, 3.0, 1.0], [2.0, 2.5, 2.0, 2.5, 2.0])
    assert v["verdict"] == "indistinguishable"
    assert benchmarking.compare(fast, slow) == benchmarking.compare(fast, slow), "seeded: the same verdict"
    with pytest.raises(ValueError, match="side by side"):
        benchmarking.compare([1.0, 2.0, 3.0], [1.0, 2.0])
    with pytest.raises(ValueError, match="3"):
        benchmarking.compare([1.0, 2.0], [1.0, 2.0])


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
    assert "other processes' runnable threads" in benchmarking.describe(benchmarking.finish(benchmarking.machine()))
