"""The performance keys' machinery (instructor/performance.py, instructor/leaderboard.py), on synthetic and
replayed timings: no verdict here depends on the clock or the machine's load (speed is a benchmark, not a test).

The submission's speed itself is measured by ``python instructor/performance.py`` (docs/grading.md, "Performance
keys"); what is checked here is what turns numbers into verdicts, that a deliberately slow reference is judged a
fail — through its replayed schedule, its recorded launch order and synthetic timings of its cost model — and
that the grader and the Gradescope export report performance apart from correctness.
"""
from __future__ import annotations

import copy
import json
import random
from pathlib import Path

import pytest

from instructor import leaderboard, performance
from instructor.grade import KeyResult, gradescope
from instructor.performance import FAIL, NOT_MEASURABLE, PASS, PERF_KEYS, PerfResult, judge
from instructor.keys import KEYS
from project.tools.performance import bubble_ratios

REPO = Path(__file__).resolve().parents[2]
DP, PP, BUBBLE = PERF_KEYS["perf_dp_overlap"], PERF_KEYS["perf_1f1b"], PERF_KEYS["perf_bubble"]


def jitter(values: list[float], seed: int, spread: float = 0.03) -> list[float]:
    """``values`` each times a seeded factor within ±``spread`` (a quiet machine's repeat-to-repeat noise)."""
    rng = random.Random(seed)
    return [v * (1 + rng.uniform(-spread, spread)) for v in values]


# ---- the names -----------------------------------------------------------------------------------------------

def test_no_performance_key_name_holds_a_correctness_key():
    for name in PERF_KEYS:
        assert not any(key in name for key in KEYS), name  # pytest -k a5_x_y selects exactly that key's tests
    assert {k.code_of for k in PERF_KEYS.values()} <= set(KEYS)


# ---- verdicts on synthetic timings -----------------------------------------------------------------------------

def test_a_ratio_at_the_library_passes_and_a_clearly_slower_one_fails():
    library = jitter([1000.0] * 5, 1)
    assert judge(DP, jitter([1000.0] * 5, 2), library)["verdict"] == PASS
    slow = judge(DP, jitter([700.0] * 5, 3), library)  # 0.7x DDP's tokens/s: every repeat below 0.9
    assert slow["verdict"] == FAIL and slow["interval"][1] < DP.bound
    seconds = jitter([0.3] * 5, 4)
    assert judge(PP, jitter([0.31] * 5, 5), seconds)["verdict"] == PASS
    assert judge(PP, jitter([0.45] * 5, 6), seconds)["verdict"] == FAIL  # 1.5x the step time


def test_the_margin_decides_near_the_threshold():
    library = [1000.0] * 5
    # 0.92x: below the stated 0.95 but within the 0.05 margin -> pass; 0.85x: beyond the bound 0.9 -> fail
    assert judge(DP, [920.0] * 5, library)["verdict"] == PASS
    assert judge(DP, [850.0] * 5, library)["verdict"] == FAIL
    assert judge(PP, [1.12] * 5, [1.0] * 5)["verdict"] == PASS
    assert judge(PP, [1.2] * 5, [1.0] * 5)["verdict"] == FAIL


def test_a_fail_needs_the_whole_interval_beyond_the_bound():
    # medians below the bound, but one repeat's ratio reaches it: the interval reaches it -> not shown slower
    mine, library = [850.0, 860.0, 960.0], [1000.0, 1000.0, 1000.0]
    v = judge(DP, mine, library)
    assert v["interval"][1] >= DP.bound and v["verdict"] == PASS


@pytest.mark.parametrize("conditions", ["loaded", "oversubscribed"])
def test_a_loaded_machine_is_not_measurable_not_a_zero(conditions):
    v = judge(DP, [500.0] * 5, [1000.0] * 5, conditions=conditions)
    assert v["verdict"] == NOT_MEASURABLE and conditions in v["reason"]
    assert performance.points(DP, v) is None  # not graded
    assert performance.points(DP, judge(DP, [1000.0] * 5, [1000.0] * 5)) == DP.points
    assert performance.points(DP, judge(DP, [500.0] * 5, [1000.0] * 5)) == 0.0


def test_a_failed_check_fails_on_any_machine():
    broken = [{"name": "parity", "passed": False, "detail": "losses differ"}]
    for conditions in ("quiet", "loaded"):
        v = judge(DP, [1000.0] * 5, [1000.0] * 5, conditions=conditions, checks=broken)
        assert v["verdict"] == FAIL and "parity check failed" in v["reason"]


def test_a_replay_is_judged_on_its_ratio_whatever_the_load():
    assert judge(BUBBLE, ratio=1.0)["verdict"] == PASS
    assert judge(BUBBLE, ratio=1.2, conditions="loaded")["verdict"] == FAIL
    with pytest.raises(ValueError):
        judge(BUBBLE)
    with pytest.raises(ValueError):
        judge(DP, [1.0, 1.0], [1.0, 1.0])  # fewer than 3 side-by-side repeats


# ---- the deliberately slow reference ---------------------------------------------------------------------------

def slow_one_f_one_b(rank: int, p: int, m: int) -> list[tuple]:
    """The slow reference's 1F1B (tests/instructor/slow_reference.py): no warm-up forwards."""
    return [a for i in range(m) for a in (("F", i), ("B", i))]


def test_the_slow_references_schedule_is_written_as_planted(tmp_path):
    from tests.instructor.slow_reference import block_bodies, write

    root = write(tmp_path / "slow")
    text = (root / "pipeline" / "schedules.py").read_text()
    assert "warmup = 0  # planted" in text
    assert "if False:  # planted" in (root / "communication" / "buckets.py").read_text()
    namespace: dict = {}
    lines = text.split("\n")
    [(first, end)] = [(a, b) for a, b in block_bodies(text, "ASSIGN5_2_4", "schedules.py")
                      if "warmup = 0  # planted" in "\n".join(lines[a:b])]
    body = "\n".join(lines[first:end]) + "\n"
    exec("def f(rank, n_stages, micro_batches):\n" + body, namespace)  # the planted block, as written
    for p, m in ((2, 4), (4, 8)):
        assert [namespace["f"](r, p, m) for r in range(p)] == [slow_one_f_one_b(r, p, m) for r in range(p)]


def test_the_slow_1f1b_fails_the_replayed_bubble_and_the_reference_passes(monkeypatch):
    import pipeline.schedules as schedules

    assert judge(BUBBLE, ratio=max(r["ratio"] for r in bubble_ratios()))["verdict"] == PASS
    monkeypatch.setattr(schedules, "one_f_one_b_actions", slow_one_f_one_b)
    rows = bubble_ratios()
    worst = max(r["ratio"] for r in rows)
    assert judge(BUBBLE, ratio=worst)["verdict"] == FAIL
    # serialised: every rank idle while the others work, bubble (p - 1) / p
    assert all(r["bubble"] == pytest.approx((r["p"] - 1) / r["p"]) for r in rows)


def test_the_slow_1f1b_fails_its_step_time_ratio_in_a_replayed_cost_model():
    """Step times from :func:`pipeline.metrics.replay_by_kind` of each schedule (F = 1, B = 2 per stage, the
    reference's 1F1B standing for Schedule1F1B, which runs the same order), with ±3 % noise per repeat."""
    from pipeline.metrics import replay_by_kind
    from pipeline.schedules import one_f_one_b_actions

    def step_time(actions_of, p=2, m=8) -> float:
        events = replay_by_kind([actions_of(r, p, m) for r in range(p)], {"F": 1.0, "B": 2.0})
        return max(e[3] for rank in events for e in rank)

    library = jitter([step_time(one_f_one_b_actions)] * 5, 7)
    assert judge(PP, jitter([step_time(one_f_one_b_actions)] * 5, 8), library)["verdict"] == PASS
    slow = judge(PP, jitter([step_time(slow_one_f_one_b)] * 5, 9), library)
    assert slow["verdict"] == FAIL and slow["ratio"] == pytest.approx(16 / 9, rel=0.1)  # 2m units against m + p - 1


def test_buckets_reduced_after_backward_fail_in_a_cost_model_where_communication_shows():
    """A step of k buckets, each computed in c and all-reduced in a (one link): with overlap the all-reduces
    follow the backward bucket by bucket (the step ends max(c, a) * k + min(c, a) after the start); after the
    backward they all come at the end (k c + k a). With a = c (a GPU with NCCL, where the link is the limit) the
    after-backward step is ~1.8x as long: its tokens/s ratio to DDP's overlapped one fails."""
    k, c, a, forward = 10, 1.0, 1.0, 5.0
    overlapped = forward + max(c, a) * k + min(c, a)
    after = forward + k * c + k * a
    tokens = 1000.0
    library = jitter([tokens / overlapped] * 5, 10)
    assert judge(DP, jitter([tokens / overlapped] * 5, 11), library)["verdict"] == PASS
    assert judge(DP, jitter([tokens / after] * 5, 12), library)["verdict"] == FAIL


def test_the_overlap_check_reads_the_launch_order():
    assert performance.dp_overlap([10, 10, 10], 10)["passed"]
    assert not performance.dp_overlap([0, 0, 0], 10)["passed"]      # every bucket waited for finish()
    assert not performance.dp_overlap([10, 9, 10], 10)["passed"]
    assert not performance.dp_overlap([], 10)["passed"]


def test_parity_checks():
    same = {"yours": [[5.0, 5.1], [4.9, 5.0]], "library": [[5.0, 5.1], [4.9, 5.0]]}
    assert performance.dp_parity(same)["passed"]
    off = copy.deepcopy(same)
    off["yours"][1][0] = 4.9 * (1 + 1e-3)  # a missing halving changes the loss after one step by > 1e-3
    assert not performance.dp_parity(off)["passed"]
    losses = {"yours": [0.9, 0.8], "library": [0.9, 0.8]}
    assert performance.pp_parity(losses, 0.0, 1.0)["passed"]
    assert not performance.pp_parity(losses, 1e-3, 1.0)["passed"]
    assert not performance.pp_parity({"yours": [0.9], "library": [0.9, 0.8]}, 0.0, 1.0)["passed"]


@pytest.mark.timeout(300)
def test_the_grader_step_fails_the_slow_reference_on_any_machine(tmp_path):
    """The slow reference through the grader's path (grading copy, policy, subprocess): its 1F1B's replayed
    bubble and its buckets' launch order fail whatever the load; the reference's checks all pass."""
    from tests.instructor.slow_reference import write

    slow = {r.key: r for r in performance.grade_performance(["perf_bubble", "perf_dp_overlap"], write(tmp_path / "s"),
                                                             quiet=True)}
    assert slow["perf_bubble"].verdict == FAIL and slow["perf_bubble"].points == 0.0
    assert slow["perf_dp_overlap"].verdict == FAIL, slow["perf_dp_overlap"].output
    assert "overlap check failed" in slow["perf_dp_overlap"].detail["reason"]
    ref = performance.grade_performance(["perf_dp_overlap"], None, quiet=True)[0]
    assert all(c["passed"] for c in ref.detail["checks"]), ref.output
    assert ref.verdict in (PASS, NOT_MEASURABLE), ref.output  # a fail only if a quiet run shows it slower


# ---- reports ---------------------------------------------------------------------------------------------------

def perf_results() -> list[PerfResult]:
    out = []
    for key, verdict in zip(PERF_KEYS.values(), (PASS, NOT_MEASURABLE, FAIL)):
        v = {"verdict": verdict, "ratio": 1.0, "interval": [0.9, 1.1], "reason": "synthetic"}
        out.append(PerfResult(key.name, key.topic, verdict, performance.points(key, v), key.points, 1.0,
                              performance.describe(key, v), v))
    return out


def test_the_gradescope_export_keeps_performance_apart():
    first = next(iter(KEYS.values()))  # no key's string in this file: pytest -k KEY never imports it
    correctness = [KeyResult(first.key, first.topic, 17, 17, 10.0, 10, 5.0, "all tests passed")]
    payload = gradescope(correctness, perf_results())
    tests = payload["tests"]
    assert [t["tags"] for t in tests] == [["correctness"], ["performance"], ["performance"], ["performance"]]
    perf = {t["name"].split(":")[0]: t for t in tests if t["tags"] == ["performance"]}
    assert perf["perf_dp_overlap"]["score"] == 2 and perf["perf_dp_overlap"]["max_score"] == 2
    assert perf["perf_1f1b"]["score"] == 0 and perf["perf_1f1b"]["max_score"] == 0  # not measurable: not graded
    assert perf["perf_bubble"]["score"] == 0 and perf["perf_bubble"]["max_score"] == 2
    assert all(t["visibility"] == "visible" and t["output"].startswith("[performance, optional]") for t in perf.values())
    assert payload["score"] == 12
    assert "Correctness: 10/10 points." in payload["output"]
    assert "Performance (optional, apart from correctness): 2/4 points" in payload["output"]
    assert "perf_1f1b" in payload["output"]
    json.dumps(payload)  # plain JSON
    assert gradescope(correctness)["score"] == 10 and len(gradescope(correctness)["tests"]) == 1


def test_the_report_has_a_performance_section(capsys):
    performance.print_table(perf_results())
    out = capsys.readouterr().out
    assert "PERFORMANCE (optional, apart from correctness)" in out
    assert "not measurable here" in out and "-/2" in out


# ---- the leaderboard -------------------------------------------------------------------------------------------

def committed() -> dict:
    return json.loads((REPO / "leaderboard" / "reference.json").read_text())


def test_the_committed_example_is_the_reference_and_is_accepted():
    found = leaderboard.entries(REPO / "leaderboard")
    assert found[0]["name"] == "reference" and found[0]["reference"]
    assert set(found[0]["keys"]) == set(PERF_KEYS)


@pytest.mark.parametrize("spoil, reason", [
    (lambda e: e["keys"]["perf_dp_overlap"].update(checks=[]), "no parity check"),
    (lambda e: e["keys"]["perf_1f1b"]["checks"][0].update(passed=False), "parity check failed"),
    (lambda e: e["keys"]["perf_1f1b"].pop("machine"), "no machine record"),
    (lambda e: e["keys"]["perf_dp_overlap"]["machine"].update(conditions="loaded"), "loaded machine"),
    (lambda e: e["keys"]["perf_1f1b"].update(ratio=0.5), "is not what its own numbers give"),
    (lambda e: e.update(commit="main"), "40-hex-digit"),
])
def test_the_validator_rejects(spoil, reason):
    entry = committed()
    spoil(entry)
    with pytest.raises(leaderboard.EntryError, match=reason):
        leaderboard.validate(entry)


def test_an_entry_is_written_from_a_run_and_a_loaded_run_is_refused(tmp_path):
    entry = committed()
    run = [{"key": name, "detail": r} for name, r in entry["keys"].items()]
    path = leaderboard.write(leaderboard.entry_from_run(run, "alice", "a" * 40), tmp_path)
    assert path.name == "alice.json" and leaderboard.entries(tmp_path)[0]["name"] == "alice"
    loaded = copy.deepcopy(run)
    loaded[0]["detail"]["machine"]["conditions"] = "loaded"
    with pytest.raises(leaderboard.EntryError, match="loaded"):
        leaderboard.entry_from_run(loaded, "bob", "b" * 40)
    assert leaderboard.main(["check", "--folder", str(tmp_path)]) == 0


def test_a_failed_launch_is_measured_once_more_and_a_repeated_failure_fails(monkeypatch, tmp_path):
    """A launch can fail for the machine's sake (another process took the chosen port: EADDRINUSE, seen once in
    the 20 reference runs); the grader measures once more. Code that fails fails again: then it is a fail."""
    import instructor.submission as submission

    monkeypatch.setattr(submission, "grading_tree", lambda root, source, key, out, **kw: type("T", (), {"root": out})())
    raw = {"key": "perf_bubble", "machine": {}, "rows": [{"p": 2, "m": 4, "bubble": 0.2, "theory": 0.2, "ratio": 1.0}],
           "ratio": 1.0}
    calls = []

    def flaky(tree, name, timeout, out):
        calls.append(name)
        if len(calls) == 1:
            raise RuntimeError("the measurement failed (exit 1): EADDRINUSE")
        return dict(raw)

    monkeypatch.setattr(performance, "_run_measurement", flaky)
    result = performance.grade_performance(["perf_bubble"], tmp_path, quiet=True)[0]
    assert result.verdict == PASS and len(calls) == 2 and "EADDRINUSE" in result.detail["retried_after"]

    def broken(tree, name, timeout, out):
        calls.append(name)
        raise RuntimeError("the measurement failed (exit 1): NotImplementedError")

    calls.clear()
    monkeypatch.setattr(performance, "_run_measurement", broken)
    result = performance.grade_performance(["perf_bubble"], tmp_path, quiet=True)[0]
    assert result.verdict == FAIL and result.points == 0.0 and len(calls) == 2


def test_a_quiet_machine_whose_cores_the_ranks_share_is_not_measurable():
    from instructor.performance import grading_conditions

    base = {"cores": 2, "usable_cores": 2, "device": "cpu", "busy_ranks": 2, "conditions": "quiet"}
    assert grading_conditions({**base, "others_running": 0.2, "others_running_after": 0.0}) == "quiet"
    # the harness's quiet (others <= half the cores), but one more runnable thread takes turns with a rank
    assert grading_conditions({**base, "others_running": 1.0, "others_running_after": 0.0}) == "loaded"
    assert grading_conditions({**base, "conditions": "oversubscribed"}) == "oversubscribed"
    assert grading_conditions({**base, "device": "cuda", "others_running": 1.0}) == "quiet"  # a GPU per rank
