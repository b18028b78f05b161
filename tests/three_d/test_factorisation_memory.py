"""The memory the factorisation benchmark reports (three_d/labs/factorisation_benchmark.py): a rank's held bytes
and the fullest rank of a factorisation."""
from __future__ import annotations

import torch

from three_d.labs.factorisation_benchmark import held_bytes, summarise


def test_held_bytes_counts_parameters_gradients_and_adamw_state():
    layer = torch.nn.Linear(3, 4)  # 12 + 4 parameters
    optimizer = torch.optim.AdamW(layer.parameters(), lr=1e-3)
    assert held_bytes(layer, optimizer) == {"params": 64, "grads": 0, "optimizer": 0}
    layer(torch.ones(2, 3)).sum().backward()
    optimizer.step()
    steps = sum(s["step"].numel() * s["step"].element_size() for s in optimizer.state.values())
    assert held_bytes(layer, optimizer) == {"params": 64, "grads": 64, "optimizer": 2 * 64 + steps}


def test_summarise_reports_the_fullest_rank():
    small = {"params": 10, "grads": 10, "optimizer": 20, "activations": 5}
    large = {"params": 30, "grads": 30, "optimizer": 60, "activations": 1}
    report = [{"dp": 1, "pp": 2, "tp": 1, "repeat": r, "micro_batches": 4, "step_s": 0.5 + r,
               "comm": {}, "memory": [small, large]} for r in range(3)]
    row, = summarise(report, {"batch_size": 8, "seq_len": 4})
    assert row["memory_bytes"] == 121 and row["memory"] == large
    assert row["tokens_per_s_median"] == 32 / 1.5
