"""Assignment 5.4.3 — top-k sparsification with error feedback (graded).

``topk_compress(grad, residual, ratio)`` must send the k = ceil(ratio * n) largest-magnitude
entries of ``grad + residual`` and keep the rest as the new residual, so that over any number
of steps *what was sent plus the residual equals the sum of the gradients* (nothing is lost,
only delayed; Stich et al. 2018, Lin et al. 2018). In a 2-rank run, the top-k reducer with
ratio 1 (everything sent) equals ``average_gradients``.
"""
import math

import pytest
import torch
import torch.distributed as dist
from torch import nn

from course.launch import launch
from tests.support.launching import GRADED_COLLECTIVE_TIMEOUT

pytestmark = pytest.mark.a5_4_3


def average_gradients(model, group=None):
    """The reference (assignment 5.1.2's average_gradients, written out here so this key depends on no other)."""
    for p in model.parameters():
        if p.grad is not None:
            dist.all_reduce(p.grad, group=group)
            p.grad /= dist.get_world_size(group)


def _dense(indices, values, like):
    out = torch.zeros(like.numel(), dtype=values.dtype)
    out[indices] = values
    return out.view_as(like)


@pytest.mark.parametrize("shape,ratio", [((10,), 0.3), ((7, 9), 0.1), ((4, 5, 6), 0.05), ((3,), 1.0), ((50,), 0.001)])
def test_topk_sends_the_largest_entries_of_gradient_plus_residual(shape, ratio):
    from communication.compression import topk_compress

    g = torch.Generator().manual_seed(0)
    grad, residual = torch.randn(shape, generator=g, dtype=torch.float64), torch.randn(shape, generator=g, dtype=torch.float64)
    indices, values, new_residual = topk_compress(grad, residual, ratio)
    n, k = grad.numel(), max(1, math.ceil(ratio * grad.numel()))
    acc = (grad + residual).reshape(-1)
    assert indices.shape == (k,) and values.shape == (k,), f"k = ceil({ratio} * {n}) = {k} entries must be sent"
    assert len(set(indices.tolist())) == k, "indices must be distinct"
    want = set(acc.abs().argsort(descending=True)[:k].tolist())
    assert set(indices.tolist()) == want, ("the entries sent must be the k largest in magnitude of grad + residual "
                                           "(error feedback: add the residual before selecting)")
    assert torch.equal(values, acc[indices]), "values must be the (signed) entries of grad + residual at the indices"
    assert new_residual.shape == grad.shape
    assert torch.equal(new_residual.reshape(-1), acc - _dense(indices, values, acc)), \
        "the new residual is grad + residual with the sent entries set to zero"


def test_error_feedback_loses_nothing_over_many_steps():
    from communication.compression import topk_compress

    g = torch.Generator().manual_seed(1)
    shape = (6, 8)
    residual = torch.zeros(shape, dtype=torch.float64)
    total_grad, total_sent = torch.zeros(shape, dtype=torch.float64), torch.zeros(shape, dtype=torch.float64)
    for step in range(20):
        grad = torch.randn(shape, generator=g, dtype=torch.float64) * (1 + step % 3)
        indices, values, residual = topk_compress(grad, residual, 0.05)
        total_grad += grad
        total_sent += _dense(indices, values, grad)
        # float64 sums of 20 steps of O(3) values: 20 x 2^-53 x 60 ~ 1.3e-13 at most, below 1e-12
        assert torch.allclose(total_sent + residual, total_grad, atol=1e-12), (
            f"step {step}: what was sent plus the residual must equal the sum of the gradients "
            "(the residual of what was not sent must be kept and added to the next gradient)")
    assert residual.abs().sum() > 0, "with ratio 0.05 something must still be waiting in the residual"


def reducer_worker(rank, world_size):
    from communication.compression import TopKReducer

    out = {}
    for variant in ("topk", "average_gradients"):
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(5, 7), nn.Tanh(), nn.Linear(7, 2))
        g = torch.Generator().manual_seed(10 + rank)
        x, y = torch.randn(4, 5, generator=g), torch.randn(4, 2, generator=g)
        nn.functional.mse_loss(model(x), y).backward()
        if variant == "topk":
            reducer = TopKReducer(model, group=None, ratio=1.0)
            reducer.before_backward()
            reducer.finish()
            out["bytes"] = (reducer.bytes_sent, reducer.dense_bytes)
        else:
            average_gradients(model, group=None)
        out[variant] = [p.grad.clone() for p in model.parameters()]
    return out


def test_topk_reducer_with_ratio_one_equals_average_gradients():
    outputs = launch(reducer_worker, 2, timeout=90, collective_timeout=GRADED_COLLECTIVE_TIMEOUT)
    for rank, out in outputs.items():
        for got, want in zip(out["topk"], out["average_gradients"]):
            # the same two-term float32 sums (exact in either order) and a halving (exact): only a reordering of the
            # values sent could differ, by <= 2^-24 ~ 6e-8 relative; rtol 1e-6 / atol 1e-7 leave a factor of 10
            assert torch.allclose(got, want, rtol=1e-6, atol=1e-7), f"rank {rank}: top-k with ratio 1 must average"
        sent, dense = out["bytes"]
        assert sent == dense * 3, "ratio 1: every float32 value plus its int64 index (12 bytes per 4) is sent"
