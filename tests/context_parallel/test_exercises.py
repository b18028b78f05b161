"""The notebook's exercise checks accept the right answers and refuse wrong ones (scaffolding: no assignment)."""
import math


def test_online_softmax_check(capsys):
    from context_parallel.labs.exercises import EXERCISE_1_BLOCKS, check_online_softmax

    scores = [s for b in EXERCISE_1_BLOCKS for s in b]
    m = max(scores)
    assert check_online_softmax(m, sum(math.exp(s - m) for s in scores))
    assert not check_online_softmax(5.0, 1.0)
    not_rescaled = sum(math.exp(s - 5.0) for s in EXERCISE_1_BLOCKS[0]) + sum(math.exp(s - m) for s in EXERCISE_1_BLOCKS[1])
    assert not check_online_softmax(m, not_rescaled)
    assert "not rescaled" in capsys.readouterr().out
    assert not check_online_softmax(None, None), "no answer yet: not yet, never an error"


def test_causal_work_check():
    from context_parallel.labs.exercises import causal_chunk_pairs, check_causal_work

    cp = 8
    assert [causal_chunk_pairs("zigzag", cp, r) for r in range(cp)] == [2 * cp + 1] * cp
    assert [causal_chunk_pairs("contiguous", cp, r) for r in range(cp)] == [4 * r + 3 for r in range(cp)]
    assert check_causal_work(cp, 4 * cp - 1, 2 * cp + 1)
    assert not check_causal_work(cp, 2 * cp + 1, 4 * cp - 1)


def test_traffic_check():
    from context_parallel.labs.exercises import check_traffic

    b, s, h, p = 1, 32768, 768, 8
    ring = (p - 1) * 2 * b * s // p * h * 2 / 1e6
    ulysses = 4 * b * s // p * h * 2 * (p - 1) / p / 1e6
    assert check_traffic(b, s, h, p, ring, ulysses)
    assert not check_traffic(b, s, h, p, ulysses, ring)


def test_overlap_check():
    from context_parallel.labs.exercises import check_overlap_length

    assert check_overlap_length(312e12 / 50e9)
    assert not check_overlap_length(312e12 / 50e9 / 2)


def test_striped_and_gpu_scale_checks():
    from context_parallel.labs.exercises import (GPU_CP, causal_query_key_pairs, check_ring_step, check_striped_pairs,
                                            ring_step_seconds)

    cp, seq = 4, 1024
    # every token pair of the causal triangle is computed exactly once, whatever the layout
    for layout in ("striped", "contiguous"):
        assert sum(causal_query_key_pairs(layout, cp, seq, r) for r in range(cp)) == seq * (seq + 1) // 2
    striped = [causal_query_key_pairs("striped", cp, seq, r) for r in range(cp)]
    assert striped == [4 * (255 * 256 // 2) + 256 * (r + 1) for r in range(cp)], "rank r: queries 4j + r"
    assert check_striped_pairs(max(striped), sum(range(769, 1025)))
    assert not check_striped_pairs(sum(range(769, 1025)), max(striped))
    t = ring_step_seconds(**GPU_CP)
    assert t["transfer"]["nvlink"] < t["compute"] < t["transfer"]["infiniband"]
    assert check_ring_step(1e3 * t["compute"], 1e3 * t["transfer"]["nvlink"], 1e3 * t["transfer"]["infiniband"])
    assert not check_ring_step(1e3 * t["compute"], 1e3 * t["transfer"]["infiniband"], 1e3 * t["transfer"]["nvlink"])
