"""The ZeRO++ experiment's formulas (memory/labs/zeropp_experiment.py; ungraded): the cross-node bytes of a step and the
per-tensor quantization errors notebook 05 prints."""
import pytest
import torch


def test_cross_node_bytes_follow_the_paper_count():
    from memory.labs.zeropp_experiment import cross_node_bytes

    # fp32 ZeRO-3: 3 x 4 bytes per parameter; ZeRO++: 2 x (1 + 4/64) bytes -> 12 / 2.125
    found = cross_node_bytes(10**6, dp=16, node=8, block=64)
    assert found["ratio"] == pytest.approx(12 / 2.125)
    # from fp16 (3 x 2 bytes) with int8 weights and gradients: 6 / 2 = 3x (the paper's int4 gradients: 6 / 1.5 = 4x)
    assert cross_node_bytes(10**6, 16, 8, block=10**9, weight_bytes=2, grad_bytes=2)["ratio"] == pytest.approx(3)
    assert cross_node_bytes(10**6, dp=8, node=8)["zeropp"] == 0  # one node: nothing crosses


@pytest.mark.needs_solution  # calls the reference quantizer the student release stubs
def test_every_tensor_is_within_half_a_step():
    from memory.labs.zeropp_experiment import quantization_errors

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(10, 30), torch.nn.Linear(30, 5))
    rows = quantization_errors(model, block=16)
    assert [r["name"] for r in rows] == [n for n, _ in model.named_parameters()]
    assert all(r["max_err_over_half_step"] <= 1 + 1e-4 and 0 < r["relative_rms"] < 0.01 for r in rows), rows
