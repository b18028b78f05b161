"""communication.cost_model: the alpha-beta model of the ring and of recursive doubling, its fit, the
crossover, nccl-tests' bandwidths and GPT-2's parameter count (no processes: formulas and synthetic data)."""
import math
import random

import pytest

from communication import cost_model as cm
from communication.alpha_beta import bus_bandwidth, fit_line, measured_crossover, readable_bytes

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
    assert fit["quality"]["quality"] == "good" and fit["quality"]["worst_factor"] == pytest.approx(1.0)
    # one alpha: per step, the line's intercept over the steps (the arithmetic is spelled out for printing)
    assert fit["intercept"] == pytest.approx(alpha * cm.allreduce_steps(algorithm, p), rel=1e-9)
    assert f"/ {cm.allreduce_steps(algorithm, p)} =" in fit["alpha_arithmetic"]


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


def test_a_negative_coefficient_is_a_failed_fit_and_predicts_no_crossover():
    falling = [1e-3 * (1 - 0.1 * k) for k in range(len(SIZES))]  # times that fall with the size: beta < 0
    fit = cm.fit_allreduce_model("ring", 4, SIZES, falling)
    assert fit["unconstrained"]["beta"] < 0  # as the least-squares solve gave it
    assert fit["clamped"] == "beta" and fit["beta"] == 0 and fit["alpha"] > 0 and fit["bandwidth"] is None
    assert fit["quality"]["quality"] == "failed" and "beta" in fit["quality"]["reason"]
    x = cm.crossover_prediction(4, fit)
    assert x["bytes"] is None and x["failed"] and x["sentence"].startswith("no crossover predicted: the fit failed")
    proportional = [3e-10 * n for n in SIZES]
    proportional[0] *= 0.5  # below the line through the origin: the intercept comes out negative
    fit = cm.fit_allreduce_model("ring", 4, SIZES, proportional)
    assert fit["clamped"] == "alpha" and fit["alpha"] == 0 and fit["beta"] > 0
    assert fit["quality"]["quality"] == "failed" and cm.crossover_prediction(4, fit)["bytes"] is None
    with pytest.raises(ValueError):
        cm.fit_allreduce_model("ring", 4, SIZES[:2], [1e-3, 0.0])


def test_a_poor_fit_says_so_but_still_predicts():
    alpha, beta, p = 20e-6, 1 / 10e9, 4
    times = [cm.predict_allreduce("ring", n, p, alpha, beta) for n in SIZES]
    times[2] *= 3  # one point 3x off: no line through the others comes within 1.5x of it and of them
    fit = cm.fit_allreduce_model("ring", p, SIZES, times)
    assert fit["quality"]["quality"] == "poor" and fit["quality"]["worst_factor"] > 1.5
    x = cm.crossover_prediction(p, fit)
    assert x["bytes"] == pytest.approx(cm.predicted_crossover(p, fit["alpha"], fit["beta"]))
    assert "a poor fit" in x["sentence"] and not x["failed"]


def test_the_crossover_sentence_and_value_agree():
    fit = cm.fit_allreduce_model("ring", 2, SIZES, [cm.predict_allreduce("ring", n, 2, 1e-5, 1e-9) for n in SIZES])
    x = cm.crossover_prediction(2, fit)  # p = 2: no crossover in the model, and the sentence says why
    assert x["bytes"] is None and not x["failed"] and "predicts no crossover" in x["sentence"]
    fit = cm.fit_allreduce_model("ring", 4, SIZES, [cm.predict_allreduce("ring", n, 4, 8e-6, 1e-9) for n in SIZES])
    x = cm.crossover_prediction(4, fit)
    assert x["bytes"] == pytest.approx(8 * 8e-6 / 1e-9) and readable_bytes(x["bytes"]) in x["sentence"]


def test_fit_line_reports_a_negative_slope_unclamped():
    line = fit_line(SIZES, [1e-3 * (1 - 0.1 * k) for k in range(len(SIZES))])
    assert line["slope"] < 0 and line["quality"]["quality"] == "failed"
    line = fit_line(SIZES, [1e-4 + 1e-9 * n for n in SIZES])
    assert line["intercept"] == pytest.approx(1e-4) and line["quality"]["quality"] == "good"


def test_readable_bytes():
    assert readable_bytes(4 * 2**20) == "4 MiB" and readable_bytes(538412) == "526 KiB"
    assert readable_bytes(1024) == "1 KiB" and readable_bytes(12) == "12 B" and readable_bytes(None) == "none"


# Seven per-repeat times, paired round by round: every ratio one way (factor 10) is a verdict, equal rounds
# (ratios of 1) are indistinguishable — compare()'s sign test, whatever the bootstrap draws.
FAST = [1.0, 1.1, 1.2, 1.05, 1.15, 0.95, 1.0]
SLOW, SAME = [10 * t for t in FAST], list(FAST)


@pytest.mark.parametrize("ring, tree, kind, at", [
    ([SLOW, SLOW, FAST, FAST], [FAST, FAST, SLOW, SLOW], "crossover", 2),
    ([SLOW, SAME, FAST, FAST], [FAST, SAME, SLOW, SLOW], "crossover", 2),
    ([SLOW, FAST, SAME, FAST], [FAST, SLOW, SAME, SLOW], "crossover", 3),  # a tie in between: not from 1 on
    ([FAST, FAST, FAST, SAME], [SLOW, SLOW, SLOW, SAME], "never", None),  # indistinguishable at the largest
    ([FAST] * 4, [SLOW] * 4, "always", None),
])
def test_measured_crossover_comes_from_verdicts(ring, tree, kind, at):
    sizes = SIZES[:4]
    out = measured_crossover(sizes, ring, tree, ("ring", "recursive doubling"))
    assert out["kind"] == kind
    assert out["bytes"] == (sizes[at] if at is not None else None)
    assert len(out["verdicts"]) == 4 and all("sentence" in v for v in out["verdicts"])
    assert (readable_bytes(out["bytes"]) in out["sentence"]) if at is not None else "no " in out["sentence"]


def test_crossover_agreement():
    sizes = SIZES[:4]  # 1 KB .. 512 KB
    crossing = {"kind": "crossover", "bytes": sizes[2]}
    ok = cm.crossover_agreement({"bytes": (sizes[1] + sizes[2]) / 2, "failed": False}, crossing, sizes)
    assert ok["answer"] == "agrees"
    assert cm.crossover_agreement({"bytes": sizes[0], "failed": False}, crossing, sizes)["answer"] == "disagrees"
    assert cm.crossover_agreement({"bytes": None, "failed": False}, crossing, sizes)["answer"] == "disagrees"
    never = {"kind": "never", "bytes": None}
    assert cm.crossover_agreement({"bytes": None, "failed": False}, never, sizes)["answer"] == "agrees"
    assert cm.crossover_agreement({"bytes": 2 * sizes[-1], "failed": False}, never, sizes)["answer"] == "agrees"
    failed = {"bytes": None, "failed": True, "sentence": "no crossover predicted: the fit failed"}
    assert cm.crossover_agreement(failed, never, sizes)["answer"] == "cannot say"
    assert cm.crossover_agreement({"bytes": None, "failed": False}, None, sizes)["answer"] == "cannot say"
    loaded = cm.crossover_agreement({"bytes": None, "failed": False}, never, sizes, "loaded")
    assert loaded["answer"] == "agrees" and "loaded machine" in loaded["sentence"]
    over = cm.crossover_agreement({"bytes": None, "failed": False}, never, sizes, "oversubscribed")
    assert over["answer"] == "cannot say" and "more busy ranks than cores" in over["sentence"]


@pytest.mark.parametrize("p", [2, 3, 4, 5, 8])
@pytest.mark.parametrize("algorithm", cm.ALGORITHMS)
def test_schedule_has_the_steps_and_bytes_of_the_model(algorithm, p):
    n = 3000.0
    schedule = cm.allreduce_schedule(algorithm, p, n)
    assert len(schedule) == cm.allreduce_steps(algorithm, p)
    assert sum(schedule) == pytest.approx(cm.allreduce_bytes_factor(algorithm, p) * n)


def test_replay_walks_the_schedule_with_the_link_fitted_at_two_ranks():
    alpha, beta = 40e-6, 1 / 3e9  # the link
    fit = cm.fit_allreduce_model("ring", 2, SIZES, [cm.predict_allreduce("ring", n, 2, alpha, beta) for n in SIZES])
    replay = cm.replay_allreduce(fit, 4, SIZES, 2)
    assert replay["replayed"] and replay["source_p"] == 2 and replay["crossover_measured"] is None
    for name in cm.ALGORITHMS:  # exact data at p = 2 give the link back, and its replay at p = 4 is the model's
        assert replay["algorithms"][name]["median"] == pytest.approx(
            [cm.predict_allreduce(name, n, 4, alpha, beta) for n in SIZES], rel=1e-9)
    assert replay["crossover_model"]["bytes"] == pytest.approx(8 * alpha / beta, rel=1e-9)
    assert replay["crossover_agreement"]["answer"] == "cannot say"  # nothing measured at p = 4
    assert "replayed (not measured)" in replay["sentence"]


def test_a_failed_fit_is_not_replayed():
    fit = cm.fit_allreduce_model("ring", 2, SIZES, [1e-3 * (1 - 0.1 * k) for k in range(len(SIZES))])
    replay = cm.replay_allreduce(fit, 4, SIZES, 2)
    assert replay["algorithms"] == {} and "not replayed" in replay["sentence"]
    assert replay["crossover_model"]["bytes"] is None and replay["crossover_model"]["failed"]


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


ROUNDS = [0.9, 0.95, 1.0, 1.0, 1.05, 1.1, 1.0]


def _report(p, alpha, beta, ring_times=None, conditions="quiet"):
    """A report of one world size as project/tools/benchmark.py writes it (seven repeats per size, up to 10% apart,
    the same round's factor for every algorithm: the load moves every round)."""
    def points(algorithm, times=None, scale=1.0):
        out = {}
        for i, n in enumerate(SIZES):
            t = times[i] if times else scale * cm.predict_allreduce(algorithm, n, p, alpha, beta)
            out[str(n)] = {"median": t, "min": 0.9 * t, "max": 1.1 * t, "all": [f * t for f in ROUNDS]}
        return out

    return {"machine": {"conditions": conditions},
            "algorithms": {"ring": {"points": points("ring", ring_times)},
                           "tree": {"points": points("recursive_doubling")},
                           "dist.all_reduce": {"points": points("ring", scale=0.5)}}}


def test_fit_benchmark_reads_the_benchmark_report():
    alpha, beta, p = 30e-6, 1 / 1e9, 4
    out = cm.fit_benchmark(_report(p, alpha, beta), p)
    assert out["fit"]["alpha"] == pytest.approx(alpha) and out["fit"]["beta"] == pytest.approx(beta)
    assert out["fit"]["quality"]["quality"] == "good" and out["prediction_quality"]["quality"] == "good"
    assert out["algorithms"]["recursive_doubling"]["ratio"] == pytest.approx([1.0] * len(SIZES))
    x = out["crossover_model"]["bytes"]
    assert x == pytest.approx(8 * alpha / beta)
    # 10% spreads that overlap wherever the two differ by less than 1.1/0.9 — but paired round by round every
    # ratio lies on one side, so the measured crossover is the first size from which the ring is faster
    measured = out["crossover_measured"]
    assert measured["kind"] == "crossover" and measured["bytes"] >= min(n for n in SIZES if n >= x)
    assert out["crossover_agreement"]["answer"] in ("agrees", "disagrees")
    assert not out["replayed"]


def test_fit_benchmark_of_a_negative_beta_fails_and_predicts_nothing():
    p = 4
    falling = [1e-3 * (1 - 0.1 * k) for k in range(len(SIZES))]
    out = cm.fit_benchmark(_report(p, 30e-6, 1e-9, ring_times=falling), p)
    assert out["fit"]["quality"]["quality"] == "failed" and out["prediction_quality"]["quality"] == "failed"
    assert out["crossover_model"]["bytes"] is None and out["crossover_model"]["failed"]
    assert out["crossover_agreement"]["answer"] == "cannot say"
    over = cm.fit_benchmark(_report(p, 30e-6, 1e-9, conditions="oversubscribed"), p)
    assert over["crossover_agreement"]["answer"] == "cannot say"
