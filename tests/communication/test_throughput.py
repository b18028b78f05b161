"""Ungraded: the one data-parallel throughput worker (notebooks 01 and 04, project/tools/benchmark.py) — a row per
synchroniser, number of ranks and repeat, the windows' tokens counted as the epoch runner counts them."""
from __future__ import annotations

import pytest


@pytest.mark.timeout(180)
@pytest.mark.needs_solution  # calls reference code the student release stubs
def test_every_variant_and_window_is_timed_in_every_repeat():
    import torch

    from communication.labs.experiments import dp_throughput_worker
    from course.launch import launch

    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 50, (4, 8), generator=g, device="cpu")
    mask = torch.ones_like(ids)
    mask[0, -3:] = 0  # padding is not counted
    cfg = dict(preset="tiny", vocab_size=50, warmup=1, repeats=2, world_sizes=[1, 2], bucket_mb=0.1,
               variants=["average_gradients", "bucketed"], batches=[{"input_ids": ids, "attention_mask": mask,
                                                                     "labels": ids.clone()}] * 2)
    out = launch(dp_throughput_worker, 2, cfg, timeout=150)
    assert out[1] == {}
    rows = out[0]["rows"]
    assert sorted((r["variant"], r["world_size"], r["repeat"]) for r in rows) == sorted(
        (v, n, k) for v in cfg["variants"] for n in (1, 2) for k in range(2))
    assert all(r["steps"] == 2 and r["tokens"] == 2 * (32 - 3) and r["seconds"] > 0 for r in rows)
    assert all(r["tokens_per_sec"] == pytest.approx(r["tokens"] / r["seconds"]) for r in rows)
    assert len(set(out[0]["param_sha"].values())) == 1, "the same updates whatever the synchroniser"
    assert out[0]["n_buckets"] >= 2
