import pytest
"""Ungraded: the all-reduce benchmark worker (project/tools/benchmark.py, notebook 04) — every algorithm timed at every
size, the same repeat count on every rank (or the ranks would wait for each other's calls), within bounds."""
from communication.labs.experiments import ALGORITHMS, MAX_INNER, allreduce_bench_worker
from course.launch import launch


@pytest.mark.needs_solution  # calls reference code the student release stubs
def test_every_rank_times_the_same_calls():
    sizes = [64, 4096]
    out = launch(allreduce_bench_worker, 2, sizes, 3, 1, timeout=120)
    assert out[0]["inner"] == out[1]["inner"]
    assert all(1 <= out[0]["inner"][s] <= MAX_INNER for s in sizes)
    for name in ALGORITHMS:
        assert sorted(out[0][name]) == sizes
        assert all(len(out[0][name][s]) == 3 and min(out[0][name][s]) > 0 for s in sizes)
        assert out[0][name] == out[1][name]  # the slowest rank's time, on every rank


def test_an_oversubscribed_world_size_is_replayed_from_a_quiet_one(capsys):
    """project/tools/benchmark.py: p = 4 measured on 2 cores (oversubscribed) is also replayed from the link fitted at
    p = 2 (quiet), labelled as replayed; nothing is measured here (a synthetic report)."""
    from types import SimpleNamespace

    from communication import cost_model as cm
    from project.tools import benchmark

    sizes = [1024, 65536, 4 * 2**20]
    alpha, beta = 50e-6, 1 / 1e9

    def entry(p, conditions):
        def points(algorithm):
            ts = {n: cm.predict_allreduce(algorithm, n, p, alpha, beta) for n in sizes}
            return {str(n): {"median": t, "min": t, "max": t, "all": [t, t, t]} for n, t in ts.items()}
        return {"machine": {"conditions": conditions},
                "algorithms": {"ring": {"points": points("ring")}, "tree": {"points": points("recursive_doubling")}}}

    report = {"2": entry(2, "quiet"), "4": entry(4, "oversubscribed")}
    benchmark._replays(SimpleNamespace(sizes_bytes=sizes), report, cm.replay_allreduce, cm.fit_benchmark)
    assert "replay" not in report["2"]
    replay = report["4"]["replay"]
    assert replay["replayed"] and replay["source_p"] == 2
    assert replay["algorithms"]["ring"]["median"] == pytest.approx(
        [cm.predict_allreduce("ring", n, 4, alpha, beta) for n in sizes], rel=1e-9)
    out = capsys.readouterr().out
    assert "p = 4 replayed (not measured)" in out and "(replayed)" in out


def _rank_worker(rank, world_size):
    return rank


@pytest.mark.timeout(120)
def test_launch_measured_records_the_machine_around_the_ranks():
    from communication.labs.experiments import launch_measured

    out, info = launch_measured(_rank_worker, 2, timeout=100)
    assert out == {0: 0, 1: 1}
    assert info["busy_ranks"] == 2 and info["device"] == "cpu"
    assert "load_average_after" in info and info["conditions"] in ("quiet", "loaded", "oversubscribed")
