"""The memory report of notebook 07's section 5 (``context_parallel.labs.experiments.gpt2_memory_worker``;
ungraded, runs the ring and Ulysses solutions: ``needs_solution``): besides the peak, what autograd saved for
the backward pass and the attention layer's own peak, per method, cp and sequence length."""
import pytest

pytestmark = pytest.mark.needs_solution

SCALARS = 32 * 4 / 1e6  # MB: up to 32 fp32 0-d tensors (the loss's count, a scale) that do not grow with s


def test_saved_activations_are_linear_in_the_shard_and_alike_for_ring_and_ulysses():
    from course.launch import launch
    from context_parallel.labs.experiments import gpt2_memory_worker

    out = launch(gpt2_memory_worker, 2, [64, 128], [1, 2], 2, 200, 32, device="cpu", timeout=240)
    assert out[1] == {}, "rank 0 reports"
    rows = {(r["method"], r["cp"], r["seq"]): r for r in out[0]["memory"]}
    assert len(rows) == 2 * 2 * 2
    for (method, cp, seq), r in rows.items():
        assert r["saved for backward MB"] > 0 and r["attention alone peak MB"] > 0, (method, cp, seq)
        assert r["attention alone peak MB"] < r["peak MB"], "one attention layer is part of the step"
    for method in ("ring", "ulysses"):
        for cp in (1, 2):
            # neither kernel keeps the (s x s) scores: every saved tensor but a few 0-d scalars is (b, s/cp, ...)
            # wide, so doubling s doubles the bytes (a kept score matrix would add a 4x term: at s = 64 it alone is
            # 2 layers x 4 heads x 64 x 64 x 4 B = 0.13 MB, far above the tolerance of SCALARS)
            assert rows[(method, cp, 128)]["saved for backward MB"] == pytest.approx(
                2 * rows[(method, cp, 64)]["saved for backward MB"], abs=SCALARS), (method, cp)
    # at cp = 2 both methods save their shard's tensors: the same bytes, up to scalars
    assert rows[("ring", 2, 128)]["saved for backward MB"] == pytest.approx(
        rows[("ulysses", 2, 128)]["saved for backward MB"], abs=SCALARS)
