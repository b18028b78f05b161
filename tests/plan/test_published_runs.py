"""The planner against published runs (project/planner/published_runs.py): the table builds, every row has its
unit, source, published figure, prediction and error, each run is set up as its source ran it (and so fits in the
device's memory, as it did), and the shapes the sources show hold in the prediction too. The predictions use no
constant fitted to these rows, so the errors are reported (``python -m project.planner.published_runs``), not
bounded here; only signs and orders are asserted. No processes start."""
import math

import pytest

from project.planner import published_runs as P

# the planner replays each pipeline schedule's action list (assignment 5.2.4's 1F1B): the release's stub stops it
pytestmark = pytest.mark.needs_solution


@pytest.fixture(scope="module")
def rows():
    return P.table()


def test_every_row_has_its_unit_source_and_error(rows):
    counts = (len(P.MEGATRON_ROWS), len(P.TORCHTITAN_ROWS), len(P.PLAYBOOK_ROWS), len(P.MOSAIC_ROWS))
    assert len(rows) == sum(counts)
    for r in rows:
        assert r.source.startswith((P.NARAYANAN, P.TORCHTITAN, P.PLAYBOOK, P.MOSAIC)) and r.run and r.unit
        assert r.published > 0 and r.predicted > 0 and math.isfinite(r.error)
        assert math.isclose(r.error, r.predicted / r.published - 1, rel_tol=1e-12)
        assert r.prediction.fits, f"{r.run} ran, so it must fit: {r.prediction.limit}"
    text = P.format_table(rows)
    assert all(r.unit[:34] in text for r in rows) and "median absolute error" in text


def test_megatron_rows_run_from_32_to_3072_gpus_in_the_papers_unit(rows):
    from three_d.choosing import megatron_flops_per_step

    megatron = [r for r in rows if r.source == P.NARAYANAN]
    assert [row[6] for row in P.MEGATRON_ROWS] == [32, 64, 128, 256, 512, 1024, 1536, 1920, 2520, 3072]
    for row, r in zip(P.MEGATRON_ROWS, megatron):
        size, heads, hidden, layers, tp, pp, gpus, batch, tflops = row
        c = r.config
        assert (c.tp, c.pp, c.devices, c.batch_size, c.model.n_embd, c.model.n_layer) == (tp, pp, gpus, batch, hidden,
                                                                                        layers)
        assert c.recompute == "full" and c.attention_kernel == "eager"  # the paper's recomputation and 2021 attention
        # the paper's count of the predicted step: teraFLOP/s per GPU
        flops = megatron_flops_per_step(batch, 2048, layers, hidden, 51200)
        assert math.isclose(r.predicted, flops / r.prediction.step_s / gpus / 1e12, rel_tol=1e-12)
        # the model's parameters are the size the table names (to its rounding)
        params = c.model.parameters(51200, 2048)["total"]
        assert abs(params / 1e9 - size) < 0.05 * size, (size, params)


def test_torchtitan_rows_are_set_up_as_run_and_compile_is_faster(rows):
    titan = [r for r in rows if r.source.startswith(P.TORCHTITAN)]
    for r in titan:
        c = r.config
        assert (c.preset, c.model_max_length, c.batch_size // c.dp, c.zero) == ("llama3-8b", 8192, 2, 3)
        assert c.recompute == "alternate" and c.hardware == "h100-96gb" and c.attention_kernel == "flash"
    for eager, compiled in zip(titan[::2], titan[1::2]):
        assert compiled.published > eager.published and compiled.predicted > eager.predicted


def test_the_playbook_curve_drops_most_where_tp_leaves_the_node(rows):
    """Tokens/s per GPU falls with TP in both; the step from 8 to 16 (out of the node) loses more than any step
    inside it, published and predicted alike."""
    curve = [r for r in rows if r.source == P.PLAYBOOK]
    for key in ("published", "predicted"):
        values = [getattr(r, key) for r in curve]
        assert all(a > b for a, b in zip(values, values[1:])), key
        drops = [1 - b / a for a, b in zip(values, values[1:])]  # 2->4, 4->8, 8->16, 16->32
        assert drops[2] > max(drops[0], drops[1]), (key, drops)


def test_the_summary_counts_the_rows_within_the_bound(rows):
    s = P.summary(rows)
    assert s["within"] == sum(abs(r.error) <= P.TARGET for r in rows)
    assert s["target_met"] == (s["within"] == len(rows) and s["median"] <= P.MEDIAN_TARGET)
    assert abs(s["worst"].error) == max(abs(r.error) for r in rows)
