"""The exercise checks of notebook 01 (data_parallel/labs/checks.py) and the data-order helper they describe:
the formulas agree with the code they stand for, and each check accepts the right answer only."""
import pytest

from data_parallel.labs import checks
from data_parallel.data_order import global_batch_indices
from data_parallel.partition import DataPartitioner


@pytest.mark.needs_solution  # calls reference code the student release stubs
def test_global_batches_at_one_rank_are_consecutive_slices_of_the_shuffle():
    order = DataPartitioner(list(range(100)), [1.0], seed=7).partitions[0]
    batches = global_batch_indices(100, 8, 1, seed=7)
    assert batches[0] == order[:8] and batches[3] == order[24:32]
    assert len(batches) == 13 and len(batches[-1]) == 4


@pytest.mark.parametrize("dp", [1, 2, 4])
@pytest.mark.needs_solution  # calls reference code the student release stubs
def test_an_epoch_sees_every_example_once_at_any_dp(dp):
    batches = global_batch_indices(96, 16, dp, seed=3)
    seen = [i for b in batches for i in b]
    assert sorted(seen) == list(range(96)) and all(len(b) == 16 for b in batches)


@pytest.mark.needs_solution  # calls reference code the student release stubs
def test_global_batches_depend_on_dp_but_the_shuffle_does_not():
    one, two = global_batch_indices(1000, 20, 1, seed=5, steps=5), global_batch_indices(1000, 20, 2, seed=5, steps=5)
    assert all(set(a) != set(b) for a, b in zip(one, two))
    assert [b[:10] for b in two] == [a[:10] for a in global_batch_indices(1000, 10, 1, seed=5, steps=5)]


@pytest.mark.parametrize("dp", [1, 2, 4])
@pytest.mark.needs_solution  # calls reference code the student release stubs
def test_shared_fraction_formula_matches_the_data_order(dp):
    one = {i for b in global_batch_indices(29000, 64, 1, seed=42, steps=10) for i in b}
    many = {i for b in global_batch_indices(29000, 64, dp, seed=42, steps=10) for i in b}
    assert len(one & many) / len(many) == pytest.approx(checks.shared_fraction_of_first_steps(dp))


def test_parameter_formulas_match_gpt2():
    from course.model import build_gpt2

    for preset, n_layer, h, vocab, positions in (("tiny", 4, 128, 500, 64), ("tiny", 2, 64, 301, 32)):
        model = build_gpt2(preset, vocab, n_positions=positions, n_layer=n_layer, n_embd=h, n_head=4)
        params = list(model.parameters())
        assert checks.gpt2_parameter_count(vocab, positions, h, n_layer) == sum(p.numel() for p in params)
        assert checks.gpt2_parameter_tensors(n_layer) == len(params)


def test_gpt2_124m_count_and_ring_bytes():
    assert checks.gpt2_parameter_count(50257, 1024, 768, 12) == 124_439_808  # Radford et al. 2019's "117M"/124M
    assert checks.ring_bytes_sent_per_rank(800.0, 1) == 0
    assert checks.ring_bytes_sent_per_rank(800.0, 2) == 800.0
    assert checks.ring_bytes_sent_per_rank(800.0, 8) == 1400.0
    assert checks.effective_batch_size(16, 8, 4) == 512


def test_checks_accept_the_right_answers_only(capsys):
    n = 124_439_808
    assert checks.check_effective_batch_size(512)
    assert not checks.check_effective_batch_size(128)  # forgot the accumulation
    assert not checks.check_effective_batch_size(None)
    assert checks.check_gradient_bytes(4 * n, 2 * 7 / 8 * 4 * n)
    assert not checks.check_gradient_bytes(4 * n, 4 * n)  # sent the whole payload once
    assert not checks.check_gradient_bytes(4 * (n + 50257 * 768), 2 * 7 / 8 * 4 * n)  # untied head counted
    assert checks.check_all_reduce_calls(148)
    assert not checks.check_all_reduce_calls(149)  # the tied head counted again
    assert checks.check_shared_fraction(0.25)
    assert not checks.check_shared_fraction(1.0)  # "the same global batches"
    out = capsys.readouterr().out
    assert "right" in out and "not yet" in out and "hint" in out


def test_the_gpu_scale_problem_prices_compute_and_all_reduce_from_the_datasheets():
    from course.hardware import HARDWARE

    n = checks.gpt2_parameter_count(**checks.GPU_MODEL)
    h100 = HARDWARE["h100"]
    at8, at64 = (checks.dp_step_seconds(n, 512, 1024, dp) for dp in (8, 64))
    assert at8["link"] == "nvlink" and at64["link"] == "infiniband", "a ring of 64 leaves the node of 8"
    rate = h100.peak_flops["bf16"] * h100.matmul_efficiency
    assert at8["compute"] == pytest.approx(6 * n * 64 * 1024 / rate)
    ring = 2 * 7 * h100.intra.alpha + 2 * 7 / 8 * 2 * n * h100.intra.beta + h100.intra.base
    assert at8["all_reduce"] == pytest.approx(ring)
    b = checks.break_even_batch(n, 1024, 64)
    assert b % 64 == 0 and checks.dp_step_seconds(n, b, 1024, 64)["ratio"] <= 1 < \
        checks.dp_step_seconds(n, b - 64, 1024, 64)["ratio"]
    assert checks.check_dp_break_even(b) and not checks.check_dp_break_even(b - 64)
    assert checks.check_token_count_bytes(1, 8) and not checks.check_token_count_bytes(2, 8)
    with pytest.raises(ValueError, match="does not split"):
        checks.dp_step_seconds(n, 100, 1024, 64)
