"""three_d.choosing's verdict on the fastest factorisation and the matrix-product peak under concurrency
(ungraded). Verdicts are checked on made-up timings, never on the machine's clock."""
import pytest

from course.launch import launch
from three_d.choosing import leader_verdicts, matmul_rate


def test_the_fastest_is_named_only_when_it_beats_every_other():
    rounds = [1.0, 1.1, 1.05, 1.02, 1.08, 1.3, 0.95]  # seven rounds, the load moving from round to round
    apart = {(8, 1, 1): rounds, (4, 2, 1): [2 * t for t in rounds], (2, 4, 1): [3 * t for t in rounds]}
    out = leader_verdicts(apart)
    assert out["leader"] == (8, 1, 1) and out["fastest"] == (8, 1, 1) and out["tied"] == []
    assert {k: v["verdict"] for k, v in out["verdicts"].items()} == {(4, 2, 1): "faster", (2, 4, 1): "faster"}
    assert "is the fastest" in out["sentence"]


def test_overlapping_ranges_name_no_fastest():
    # the best median (2·4·1) but paired rounds on both sides of 8·1·1's: a leader, not a fastest
    overlap = {(8, 1, 1): [1.0, 1.2, 1.1, 1.0, 1.2, 1.1, 1.0], (2, 4, 1): [0.6, 0.9, 1.5, 0.8, 1.3, 0.7, 1.4],
               (1, 4, 2): [4.0, 4.1, 4.2, 4.0, 4.1, 4.2, 4.0]}
    out = leader_verdicts(overlap)
    assert out["leader"] == (2, 4, 1)
    assert out["fastest"] is None and out["tied"] == [(8, 1, 1)]
    assert out["verdicts"][(1, 4, 2)]["verdict"] == "faster"
    assert "no factorisation is measurably the fastest" in out["sentence"] and "8·1·1" in out["sentence"]


def test_leader_verdicts_reject_what_cannot_be_compared():
    with pytest.raises(ValueError, match="at least two"):
        leader_verdicts({(8, 1, 1): [1.0, 1.0, 1.0]})
    with pytest.raises(ValueError, match="side by side"):
        leader_verdicts({(8, 1, 1): [1.0, 1.0, 1.0], (4, 2, 1): [1.0, 1.0]})


def test_matmul_rate_is_one_summary_per_launch_from_the_slowest_rank():
    out = launch(matmul_rate, 2, 16, 32, 64, 3, 2e7, 1, timeout=120, collective_timeout=60)
    assert out[0] == out[1], "the slowest rank's time: every rank reports the same rates"
    assert out[0]["world_size"] == 2 and out[0]["shape"] == [16, 32, 64] and out[0]["threads"] == 1
    rates = out[0]["flops_per_rank"]
    assert rates["n"] == 3 and 0 < rates["min"] <= rates["median"] <= rates["max"]


@pytest.mark.parametrize("args, message", [((0, 32, 64, 3), "positive sizes"), ((16, 32, 64, 2), "repeats must be"),
                                           ((16, 32, 64, 3, 1e6, 0), "threads must be")])
def test_matmul_rate_rejects_bad_input(args, message):
    with pytest.raises(ValueError, match=message):
        matmul_rate(0, 1, *args)
