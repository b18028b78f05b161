import pytest
"""Ungraded: the all-reduce benchmark worker (project/benchmark.py, notebook 04) — every algorithm timed at every
size, the same repeat count on every rank (or the ranks would wait for each other's calls), within bounds."""
from communication.experiments import ALGORITHMS, MAX_INNER, allreduce_bench_worker
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
