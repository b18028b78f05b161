"""Ungraded: the one activation-bytes counter (course.saved_tensors) — each saved storage once, parameters
apart, per key, exclusions looked up again for storages made during the forward pass — and the stage
runner's per-micro-batch count agreeing with it."""
from __future__ import annotations

import pytest
import torch

from course.saved_tensors import SavedTensorBytes, storage_bytes


def test_each_saved_storage_counts_once_and_parameters_apart():
    w = torch.randn(8, 8, requires_grad=True)
    x = torch.randn(4, 8, requires_grad=True)
    with SavedTensorBytes(exclude=[w]) as saved:
        h = x @ w                # saves x and w
        y = (h * h).sum()        # saves h (twice: one storage)
    assert saved.count == 4
    assert saved.bytes == (32 + 64 + 32) * 4 and saved.parameter_bytes == 64 * 4
    assert saved.activation_bytes == 64 * 4 == storage_bytes([x, h, h.view(-1)])
    y.backward()
    assert saved.storages == {}, "without a key only the totals are kept"


def test_bytes_by_key_and_exclusions_looked_up_again():
    blocks = [torch.nn.Linear(4, 4) for _ in range(2)]
    current = [None]
    made = []

    def excluded():  # a "ZeRO-3" parameter whose storage is made during the forward pass
        return [p for b in blocks for p in b.parameters()] + made

    x = torch.randn(3, 4, requires_grad=True)
    with SavedTensorBytes(exclude=excluded, key=lambda: current[0]) as saved:
        for i, block in enumerate(blocks):
            current[0] = i
            x = torch.tanh(block(x))
        current[0] = None
        full = torch.randn(4, 4, requires_grad=True)
        made.append(full)
        (x @ full).sum().backward()
    per_block = saved.bytes_by_key()
    assert set(per_block) == {0, 1, None}
    assert per_block[0] == per_block[1] > 0 and per_block[None] == 3 * 4 * 4  # x only: `full` is excluded
    assert saved.bytes_by_key(activations_only=False)[None] == 3 * 4 * 4 + 16 * 4
    assert saved.parameter_bytes == 2 * 16 * 4 + 16 * 4  # both weights (biases are not saved) and `full`


def stage_bytes_worker(rank: int, world_size: int) -> dict:
    from course.launch import context
    from course.mesh import Mesh
    from pipeline import StageRunner, schedule_actions

    device, m = context().device, 2
    mesh = Mesh.build(pp=world_size)
    torch.manual_seed(0)
    stage = torch.nn.Sequential(torch.nn.Linear(6, 6), torch.nn.GELU(), torch.nn.Linear(6, 6)).to(device)
    runner = StageRunner(stage, device, loss_fn=lambda y, t: ((y - t) ** 2).mean(), group=mesh.pp_group)
    inputs = [torch.randn(5, 6, device=device) for _ in range(m)] if mesh.is_first_stage else None
    targets = [torch.zeros(5, 6, device=device) for _ in range(m)] if mesh.is_last_stage else None
    result = runner.run(schedule_actions("gpipe", mesh.stage, world_size, m), inputs, targets)
    x = torch.randn(5, 6, device=device, requires_grad=not mesh.is_first_stage)
    with SavedTensorBytes(exclude=list(stage.parameters())) as one:  # one micro-batch, as the runner counts it
        y = stage(x)
        if mesh.is_last_stage:
            y = ((y - targets[0]) ** 2).mean()
    return {"peak": result.peak_activation_bytes, "one": one.activation_bytes, "in_flight": result.peak_in_flight}


@pytest.mark.needs_solution  # calls reference code the student release stubs
def test_the_stage_runner_counts_each_micro_batch_with_the_same_counter():
    from course.launch import launch

    for rank, r in launch(stage_bytes_worker, 2, timeout=90).items():
        assert r["in_flight"] == 2 and r["peak"] == 2 * r["one"] > 0, (rank, r)  # GPipe: both in flight at once
