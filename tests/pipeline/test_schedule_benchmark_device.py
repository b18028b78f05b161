"""Ungraded: ``pipeline.labs.schedule_benchmark`` measures ``--balance auto``'s layer costs on the run's device, and
its replay runs CPU seconds on the CPU and the actions' device-synchronised spans on a GPU (labelled).

Which device the costing runs on is checked through the seam :func:`pipeline.labs.schedule_benchmark.layer_balances`
with the ``meta`` device standing in for a GPU (the costing itself is replaced by a recorder of its model's
device): the former benchmark built the model on the CPU whatever ``--device`` said. On GPUs
``tests/gpu/test_pipeline_nccl.py`` (``test_schedule_benchmark_costs_layers_on_the_gpu``) runs the real costing.
"""
import pytest
import torch

from pipeline.labs import schedule_benchmark as sb

CFG = dict(balance="auto", v=2, micro_batch_size=2, seq=8, vocab=64, n_layer=4)


def test_auto_balance_costs_the_layers_on_the_runs_device(monkeypatch):
    import pipeline.gpt2

    seen = []

    def costing(model, n_stages, sample, repeats=3, group=None):  # stands in for the measurement
        seen.append((next(model.parameters()).device, n_stages))
        return [1] * n_stages, []

    monkeypatch.setattr(pipeline.gpt2, "gpt2_measured_balance", costing)
    balances = sb.layer_balances(CFG, 2, torch.device("meta"), group=None)
    assert seen == [(torch.device("meta"), 2), (torch.device("meta"), 4)], "costed on another device than the run's"
    assert balances == {1: [1, 1], 2: [1, 1, 1, 1]}
    seen.clear()
    assert sb.layer_balances(dict(CFG, balance="count"), 2, torch.device("meta")) == {1: None, 2: None}
    assert not seen, "--balance count measures nothing"


@pytest.mark.needs_solution  # pipeline.gpt2.gpt2_layers is assignment 5.2.3's
def test_auto_balance_on_the_cpu_gives_a_partition_of_the_chain():
    balances = sb.layer_balances(CFG, 2, torch.device("cpu"))
    layers = CFG["n_layer"] + 2  # embeddings, the blocks, the head
    for v, balance in balances.items():
        assert len(balance) == 2 * v and sum(balance) == layers and min(balance) >= 1, (v, balance)


def test_the_replay_runs_cpu_seconds_on_the_cpu_and_device_spans_on_a_gpu():
    step = {"events": [("F", 0, 1.0, 1.5), ("B", 0, 2.0, 3.0)], "event_cpu_s": [0.25, 0.75]}
    assert sb.replay_source("cpu") == "cpu" and sb.replay_source(torch.device("cuda", 1)) == "device"
    assert sb.replay_durations(step, "cpu") == [0.25, 0.75]
    assert sb.replay_durations(step, "device") == [0.5, 1.0]
    row = dict(p=2, balance="auto", schedule="1f1b", m=4, theory=0.2, bubble_median=0.3, bubble_min=0.2,
               bubble_max=0.4, ratio_to_theory=1.5, dedicated_bubble_median=0.25, dedicated_bubble_min=0.2,
               dedicated_bubble_max=0.3, dedicated_ratio_to_theory=1.25, cores_busy_median=1.0,
               tokens_per_s_median=100.0, tokens_per_s_min=90.0, tokens_per_s_max=110.0)
    on_gpu = sb.format_table({"config": {"cpu_count": 16}, "rows": [dict(row, replayed_from="device")]})
    assert "one device per rank (replayed)" in on_gpu and "device-synchronised wall seconds" in on_gpu
    assert "one core per rank" not in on_gpu
    on_cpu = sb.format_table({"config": {"cpu_count": 2}, "rows": [dict(row, replayed_from="cpu")]})
    assert "one core per rank (replayed)" in on_cpu and "CPU seconds per action" in on_cpu
