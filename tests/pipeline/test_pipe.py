"""Assignment 5.2.2 — ``Pipe.forward`` / ``Pipe.compute`` over per-stage workers (graded).

* outputs and gradients equal the un-piped model's, for several batch and micro-batch
  sizes (also a batch not divisible by the micro-batch size);
* ``split_size`` is the micro-batch size (not the number of micro-batches);
* the stages of one clock cycle run at the same time: in every clock cycle with
  several tasks, the stages wait for each other at a ``threading.Barrier`` (with a
  timeout), which only passes if all of the cycle's tasks run concurrently;
* an exception raised in a stage reaches the caller;
* the output lands on the last stage's device (``meta`` stands in for a second device).
"""
import threading

import pytest
import torch
from torch import nn

from pipeline.pipe import Pipe

pytestmark = [pytest.mark.a5_2_2, pytest.mark.timeout(120)]


def _model(seed=0, width=6):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(width, 8), nn.Tanh(), nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 3))


@pytest.mark.parametrize("batch,split_size,n_stages", [(8, 2, 2), (10, 4, 3), (5, 1, 4), (7, 7, 2), (3, 16, 2),
                                                         (9, 2, 5)])
def test_outputs_and_gradients_equal_the_unpiped_model(batch, split_size, n_stages):
    reference = _model()
    piped_model = _model()
    pipe = Pipe(piped_model, split_size, devices=["cpu"] * n_stages)
    assert len(pipe.partitions) == n_stages
    x = torch.randn(batch, 6)
    weights = torch.randn(batch, 3)  # a loss that tells rows apart

    out = pipe(x)
    want = reference(x)
    assert out.shape == want.shape
    # Each output row is the same dot products of <= 8 terms whether its rows run in one batch or in micro-batches
    # (only a matmul's blocking may change their order: <= 8 x 2^-24 ~ 5e-7 of O(1) magnitudes); the gradients add
    # the micro-batches' parts, sums of <= batch = 10 row terms in another order: <= 10 x 2^-24 ~ 6e-7 relative.
    # Measured: at most 17 % of these tolerances, on either kernel path (AVX-512 and ATEN_CPU_CAPABILITY=default).
    torch.testing.assert_close(out, want, rtol=1e-6, atol=1e-6)

    (out * weights).sum().backward()
    (want * weights).sum().backward()
    for (name, p), q in zip(reference.named_parameters(), piped_model.parameters()):
        assert q.grad is not None, f"no gradient reached {name}"
        torch.testing.assert_close(q.grad, p.grad, rtol=1e-5, atol=1e-6, msg=f"gradient of {name}")


class RecordBatchSize(nn.Module):
    def __init__(self):
        super().__init__()
        self.sizes = []
        self.lock = threading.Lock()

    def forward(self, x):
        with self.lock:
            self.sizes.append(x.shape[0])
        return x


@pytest.mark.parametrize("batch,split_size,want", [(10, 4, [4, 4, 2]), (8, 2, [2, 2, 2, 2]), (6, 6, [6]),
                                                   (3, 5, [3])])
def test_split_size_is_the_micro_batch_size(batch, split_size, want):
    first, last = RecordBatchSize(), RecordBatchSize()
    pipe = Pipe(nn.Sequential(first, nn.Linear(2, 2), last), split_size, balance=[1, 1, 1])
    out = pipe(torch.randn(batch, 2))
    assert out.shape == (batch, 2)
    assert sorted(first.sizes, reverse=True) == want, \
        f"batch {batch} with split_size {split_size} must make micro-batches {want}, got {first.sizes}"
    assert sorted(last.sizes, reverse=True) == want


class MeetInCycle(nn.Module):
    """Stage ``stage`` of a pipeline: in a clock cycle with several tasks, wait for the others.

    Column 0 of the input holds each row's index in the batch, so the micro-batch index
    is ``row // split_size`` and the clock cycle ``micro-batch + stage``.
    """

    def __init__(self, stage, split_size, barriers):
        super().__init__()
        self.stage, self.split_size, self.barriers = stage, split_size, barriers

    def forward(self, x):
        cycle = int(x[0, 0]) // self.split_size + self.stage
        if cycle in self.barriers:
            self.barriers[cycle].wait(timeout=5)  # BrokenBarrierError unless the cycle's tasks run together
        return x + 0


@pytest.mark.parametrize("m,n", [(4, 3), (2, 2)])
def test_stages_of_one_clock_cycle_run_concurrently(m, n):
    split_size = 2
    tasks_per_cycle = [sum(1 for i in range(m) for j in range(n) if i + j == k) for k in range(m + n - 1)]
    barriers = {k: threading.Barrier(c) for k, c in enumerate(tasks_per_cycle) if c > 1}
    pipe = Pipe(nn.Sequential(*[MeetInCycle(j, split_size, barriers) for j in range(n)]), split_size,
                balance=[1] * n)
    x = torch.arange(m * split_size, dtype=torch.float32)[:, None].repeat(1, 3)
    out = pipe(x)  # raises threading.BrokenBarrierError if a cycle's stages ran one after another
    torch.testing.assert_close(out, x)
    assert all(not b.broken for b in barriers.values())


class Boom(nn.Module):
    def forward(self, x):
        raise ValueError("stage failure 42")


def test_an_exception_in_a_stage_reaches_the_caller():
    pipe = Pipe(nn.Sequential(nn.Linear(2, 2), Boom()), 1, balance=[1, 1])
    with pytest.raises(ValueError, match="stage failure 42"):
        pipe(torch.randn(3, 2))
    # the pipe is still usable afterwards with a healthy model
    ok = Pipe(nn.Sequential(nn.Linear(2, 2), nn.ReLU()), 1, balance=[1, 1])
    assert ok(torch.randn(3, 2)).shape == (3, 2)


def test_output_lands_on_the_last_stage_device():
    pipe = Pipe(nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 2)), 2, devices=["cpu", "meta"])
    out = pipe(torch.randn(5, 4))
    assert out.device == torch.device("meta") and out.shape == (5, 2)
