"""communication.cost_model: the alpha-beta model of the ring and of recursive doubling, its fit, the
crossover, nccl-tests' bandwidths and GPT-2's parameter count (no processes: formulas and synthetic data)."""
import math
import random

import pytest

from communication import cost_model as cm
from communication.alpha_beta import bus_bandwidth

SIZES = [1024 * 8**k for k in range(6)]


@pytest.mark.parametrize("p, ring_steps, ring_factor, rd_steps", [(2, 2, 1.0, 1), (3, 4, 4 / 3, 3), (4, 6, 1.5, 2),
                                                                  (6, 10, 10 / 6, 4), (8, 14, 1.75, 3)])
def test_steps_and_bytes_per_algorithm(p, ring_steps, ring_factor, rd_steps):
    assert cm.allreduce_steps("ring", p) == ring_steps
    assert cm.allreduce_bytes_factor("ring", p) == pytest.approx(ring_factor)
    assert cm.allreduce_steps("recursive_doubling", p) == rd_steps
    assert cm.allreduce_bytes_factor("recursive_doubling", p) == rd_steps  # every step carries the whole tensor
    assert cm.predict_allreduce("ring", 1000, p, 2.0, 0.5) == pytest.approx(2.0 * ring_steps + 0.5 * ring_factor * 1000)


@pytest.mark.parametrize("bad", [dict(algorithm="tree", p=4), dict(algorithm="ring", p=1),
                                 dict(algorithm="ring", p=2.5)])
def test_bad_algorithm_or_group_size(bad):
    with pytest.raises(ValueError):
        cm.allreduce_steps(**bad)


@pytest.mark.parametrize("p", [2, 4, 8])
@pytest.mark.parametrize("algorithm", cm.ALGORITHMS)
def test_fit_recovers_alpha_and_beta(p, algorithm):
    alpha, beta = 50e-6, 1 / 2e9
    times = [cm.predict_allreduce(algorithm, n, p, alpha, beta) for n in SIZES]
    fit = cm.fit_allreduce_model(algorithm, p, SIZES, times)
    assert fit["alpha"] == pytest.approx(alpha, rel=1e-9)
    assert fit["beta"] == pytest.approx(beta, rel=1e-9)
    assert fit["ratio"] == pytest.approx([1.0] * len(SIZES))
    assert fit["clamped"] is None


def test_fit_with_noise_stays_close_and_reports_residuals():
    rng = random.Random(0)
    alpha, beta, p = 20e-6, 1 / 10e9, 4
    times = [cm.predict_allreduce("ring", n, p, alpha, beta) * (1 + 0.05 * rng.uniform(-1, 1)) for n in SIZES]
    fit = cm.fit_allreduce_model("ring", p, SIZES, times)
    # seeded noise (the same numbers on every machine): each time is off by at most 5 %, so the ratios lie in
    # [0.95, 1.05] up to the fit's own error, and a least-squares fit of two coefficients stays within a few times that
    assert fit["alpha"] == pytest.approx(alpha, rel=0.15)
    assert fit["beta"] == pytest.approx(beta, rel=0.15)
    assert all(0.9 < r < 1.1 for r in fit["ratio"])
    assert fit["ratio"] == pytest.approx([t / m for t, m in zip(times, fit["predicted"])])


def test_fit_clamps_a_negative_coefficient():
    falling = [1e-3 * (1 - 0.1 * k) for k in range(len(SIZES))]  # times that fall with the size: beta < 0
    fit = cm.fit_allreduce_model("ring", 4, SIZES, falling)
    assert fit["clamped"] == "beta" and fit["beta"] == 0 and fit["alpha"] > 0 and fit["bandwidth"] == math.inf
    proportional = [3e-10 * n for n in SIZES]
    proportional[0] *= 0.5  # below the line through the origin: the intercept comes out negative
    fit = cm.fit_allreduce_model("ring", 4, SIZES, proportional)
    assert fit["clamped"] == "alpha" and fit["alpha"] == 0 and fit["beta"] > 0
    with pytest.raises(ValueError):
        cm.fit_allreduce_model("ring", 4, SIZES[:2], [1e-3, 0.0])


@pytest.mark.parametrize("p", [3, 4, 8, 16])
def test_crossover_is_where_the_two_predictions_meet(p):
    alpha, beta = 5e-6, 1 / 50e9
    n = cm.predicted_crossover(p, alpha, beta)
    ring, rd = (cm.predict_allreduce(a, n, p, alpha, beta) for a in ("ring", "recursive_doubling"))
    assert ring == pytest.approx(rd, rel=1e-9)
    assert cm.predict_allreduce("ring", 2 * n, p, alpha, beta) < cm.predict_allreduce("recursive_doubling", 2 * n, p,
                                                                                      alpha, beta)
    assert cm.predict_allreduce("ring", n / 2, p, alpha, beta) > cm.predict_allreduce("recursive_doubling", n / 2, p,
                                                                                      alpha, beta)


def test_no_crossover_at_two_ranks_or_without_bandwidth_cost():
    assert cm.predicted_crossover(2, 5e-6, 1e-9) is None  # same bytes, one step fewer: never slower
    assert cm.predicted_crossover(4, 5e-6, 0.0) is None
    assert cm.predicted_crossover(4, 8e-6, 1e-9) == pytest.approx(8 * 8e-6 / 1e-9)  # 4 alpha / (0.5 beta)
    with pytest.raises(ValueError):
        cm.predicted_crossover(4, -1.0, 1e-9)


def test_bandwidths_as_nccl_tests_define_them():
    assert cm.algorithm_bandwidth(512e6, 2e-3) == pytest.approx(256e9)
    factors = {"all_reduce": 2 * 7 / 8, "reduce_scatter": 7 / 8, "all_gather": 7 / 8, "all_to_all": 7 / 8,
               "broadcast": 1.0, "reduce": 1.0}
    for collective, factor in factors.items():
        assert cm.nccl_bus_bandwidth(512e6, 2e-3, 8, collective) == pytest.approx(256e9 * factor)
    assert cm.nccl_bus_bandwidth(4e6, 1e-3, 4) == pytest.approx(bus_bandwidth(4e6, 1e-3, 4))
    with pytest.raises(ValueError):
        cm.bus_bandwidth_factor("allreduce", 8)
    with pytest.raises(ValueError):
        cm.algorithm_bandwidth(1e6, 0.0)


def test_links_carry_their_figures_and_sources():
    nvlink, pcie, ib = (cm.LINKS[k] for k in ("NVLink 4 (H100 SXM)", "PCIe Gen5 x16", "InfiniBand NDR (1 NIC per GPU)"))
    assert nvlink.bandwidth == pytest.approx(450e9)
    assert pcie.bandwidth == pytest.approx(63.0e9, rel=1e-3)
    assert ib.bandwidth == pytest.approx(50e9)
    assert nvlink.alpha < pcie.alpha < ib.alpha
    for link in cm.LINKS.values():
        assert link.beta == pytest.approx(1 / link.bandwidth)
        assert link.bandwidth_source and "tuning.cc" in link.alpha_source


def test_gpt2_parameter_count_matches_transformers():
    assert cm.gpt2_parameter_count() == 124_439_808
    import torch
    import transformers

    config = transformers.GPT2Config(vocab_size=1000, n_positions=64, n_embd=32, n_layer=3, n_head=2)
    with torch.device("meta"):
        model = transformers.GPT2LMHeadModel(config)
    assert sum(p.numel() for p in model.parameters()) == cm.gpt2_parameter_count(1000, 64, 32, 3)


def test_fit_benchmark_reads_the_benchmark_report():
    alpha, beta, p = 30e-6, 1 / 1e9, 4

    def points(algorithm, scale=1.0):
        return {str(n): {"median": scale * cm.predict_allreduce(algorithm, n, p, alpha, beta),
                         "min": 0.9 * cm.predict_allreduce(algorithm, n, p, alpha, beta),
                         "max": 1.1 * cm.predict_allreduce(algorithm, n, p, alpha, beta)} for n in SIZES}

    report = {"algorithms": {"ring": {"points": points("ring")}, "tree": {"points": points("recursive_doubling")},
                             "dist.all_reduce": {"points": points("ring", 0.5)}}}
    out = cm.fit_benchmark(report, p)
    assert out["fit"]["alpha"] == pytest.approx(alpha) and out["fit"]["beta"] == pytest.approx(beta)
    assert out["algorithms"]["recursive_doubling"]["ratio"] == pytest.approx([1.0] * len(SIZES))
    x = out["crossover_model"]
    assert x == pytest.approx(8 * alpha / beta)
    assert out["crossover_measured"] == min(n for n in SIZES if n >= x)
