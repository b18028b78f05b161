"""Assignment 5.3.2 — ColumnParallelLinear and RowParallelLinear (graded).

In the tensor-parallel groups of a (dp 2, tp 2) mesh of 4 real processes (groups of 2 that are not the world:
:func:`tests.support.tensor_parallel.operator_results`), each parallel layer is built from the weight and bias of one
``nn.Linear`` (the same on every rank) and must compute the same function:

* output equal to ``nn.Linear``'s (column: this rank's slice of the output features, or
  all of them with ``gather_output``; row: all of them, bias added once),
* input gradient equal to ``nn.Linear``'s (or this rank's slice of it for a row layer
  with ``input_is_parallel``),
* weight and bias gradients equal to the matching shard of ``nn.Linear``'s.

The loss on every rank is ``sum(output * G)`` for the same fixed G; every rank has the same inputs, so a layer
whose f or g communicates in the world instead of its group sums twice what it should. Also checked: a
column layer followed by a row layer equals the dense two-layer MLP. Tolerance: float32,
atol 1e-5 (and rtol 1e-5): the sharded layers compute the same dot products of <= 15 terms (the weight
gradients sum over the 3 x 5 batch rows; the outputs over <= HIDDEN = 10 features), split over 2 ranks and
summed by an all-reduce (another order): <= 15 x 2^-24 ~ 9e-7 of the terms' magnitudes (O(1) randn values,
through two layers: a few 1e-6 at most), a factor of >= 3 below 1e-5.
"""

import pytest
import torch
from torch import nn
from tests.support.tensor_parallel import TP, WORLD, assert_close, attempt, case, group_rank, operator_results

pytestmark = pytest.mark.a5_3_2

IN, OUT, HIDDEN = 8, 6, 10  # all divisible by TP
BATCH = (3, 5)


def dense(in_features, out_features, seed):
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        layer = nn.Linear(in_features, out_features)
        with torch.no_grad():
            layer.bias.normal_()  # a clearly non-zero bias
    return layer


def data(features, seed):
    return torch.randn(*BATCH, features, generator=torch.Generator().manual_seed(seed))


def reference(layer, x, grad_out):
    """Output and gradients of a dense layer for loss = sum(layer(x) * grad_out)."""
    layer.zero_grad()
    x = x.clone().requires_grad_(True)
    y = layer(x)
    y.backward(grad_out)
    return {"y": y.detach(), "x": x.grad, "w": layer.weight.grad.clone(), "b": layer.bias.grad.clone()}


def _parallel(layer, x, grad_out):
    x = x.clone().requires_grad_(True)
    y = layer(x)
    y.backward(grad_out)
    return {"y": y.detach(), "x": x.grad, "w": layer.weight.grad.clone(), "b": layer.bias.grad.clone()}


def cases(rank, group):
    """This rank's results of every layer in ``group`` (run by
    :func:`tests.support.tensor_parallel.operators_worker`)."""
    from course.collectives import group_rank as rank_in, group_size
    from tensor_parallel.layers import ColumnParallelLinear, RowParallelLinear

    lin = dense(IN, OUT, seed=0)
    x, x_row = data(IN, 1), data(IN, 2)
    p, mine = group_size(group), rank_in(group)
    grad, chunk = data(OUT, 3), OUT // p
    out = {}

    attempt(out, "column", lambda: _parallel(
        ColumnParallelLinear(IN, OUT, master_weight=lin.weight, master_bias=lin.bias, group=group),
        x, grad[..., mine * chunk:(mine + 1) * chunk]))
    attempt(out, "column_gather", lambda: _parallel(
        ColumnParallelLinear(IN, OUT, gather_output=True, master_weight=lin.weight, master_bias=lin.bias,
                             group=group), x, grad))
    in_part = IN // p
    attempt(out, "row_parallel_input", lambda: _parallel(
        RowParallelLinear(IN, OUT, input_is_parallel=True, master_weight=lin.weight, master_bias=lin.bias,
                          group=group),
        x_row[..., mine * in_part:(mine + 1) * in_part], grad))
    attempt(out, "row_full_input", lambda: _parallel(
        RowParallelLinear(IN, OUT, input_is_parallel=False, master_weight=lin.weight, master_bias=lin.bias,
                          group=group),
        x_row, grad))

    def mlp():
        fc, proj = dense(IN, HIDDEN, seed=4), dense(HIDDEN, IN, seed=5)
        col = ColumnParallelLinear(IN, HIDDEN, master_weight=fc.weight, master_bias=fc.bias, group=group)
        row = RowParallelLinear(HIDDEN, IN, master_weight=proj.weight, master_bias=proj.bias, group=group)
        xin = x.clone().requires_grad_(True)
        y = row(torch.nn.functional.gelu(col(xin)))
        y.backward(data(IN, 6))
        return {"y": y.detach(), "x": xin.grad}

    attempt(out, "mlp", mlp)
    return out


def get(name, rank):
    return case(operator_results(), "layers", rank, name)


def close(actual, expected, what):
    assert_close(actual, expected, what, atol=1e-5, rtol=1e-5)


def test_column_parallel_equals_linear():
    ref = reference(dense(IN, OUT, seed=0), data(IN, 1), data(OUT, 3))
    chunk = OUT // TP
    for rank in range(WORLD):
        r, mine = get("column", rank), slice(group_rank(rank) * chunk, (group_rank(rank) + 1) * chunk)
        close(r["y"], ref["y"][..., mine], f"rank {rank}: output = its slice of the output features")
        close(r["x"], ref["x"], f"rank {rank}: input gradient (f must all-reduce it in backward)")
        close(r["w"], ref["w"][mine], f"rank {rank}: weight gradient = rows {mine} of nn.Linear's")
        close(r["b"], ref["b"][mine], f"rank {rank}: bias gradient")


def test_column_parallel_gather_output_equals_linear():
    ref = reference(dense(IN, OUT, seed=0), data(IN, 1), data(OUT, 3))
    chunk = OUT // TP
    for rank in range(WORLD):
        r, mine = get("column_gather", rank), slice(group_rank(rank) * chunk, (group_rank(rank) + 1) * chunk)
        close(r["y"], ref["y"], f"rank {rank}: gathered output")
        close(r["x"], ref["x"], f"rank {rank}: input gradient")
        close(r["w"], ref["w"][mine], f"rank {rank}: weight gradient")
        close(r["b"], ref["b"][mine], f"rank {rank}: bias gradient")


def test_row_parallel_equals_linear():
    ref = reference(dense(IN, OUT, seed=0), data(IN, 2), data(OUT, 3))
    chunk = IN // TP
    for rank in range(WORLD):
        r, mine = get("row_parallel_input", rank), slice(group_rank(rank) * chunk, (group_rank(rank) + 1) * chunk)
        close(r["y"], ref["y"], f"rank {rank}: output (partial sums all-reduced, bias added once)")
        close(r["x"], ref["x"][..., mine], f"rank {rank}: gradient of its input slice")
        close(r["w"], ref["w"][:, mine], f"rank {rank}: weight gradient = columns {mine} of nn.Linear's")
        close(r["b"], ref["b"], f"rank {rank}: bias gradient (the bias is replicated)")


def test_row_parallel_full_input_equals_linear():
    ref = reference(dense(IN, OUT, seed=0), data(IN, 2), data(OUT, 3))
    chunk = IN // TP
    for rank in range(WORLD):
        r, mine = get("row_full_input", rank), slice(group_rank(rank) * chunk, (group_rank(rank) + 1) * chunk)
        close(r["y"], ref["y"], f"rank {rank}: output")
        close(r["x"], ref["x"], f"rank {rank}: input gradient (scatter's backward gathers it)")
        close(r["w"], ref["w"][:, mine], f"rank {rank}: weight gradient")
        close(r["b"], ref["b"], f"rank {rank}: bias gradient")


def test_column_then_row_equals_dense_mlp():
    fc, proj = dense(IN, HIDDEN, seed=4), dense(HIDDEN, IN, seed=5)
    x = data(IN, 1).requires_grad_(True)
    y = proj(torch.nn.functional.gelu(fc(x)))
    y.backward(data(IN, 6))
    for rank in range(WORLD):
        r = get("mlp", rank)
        close(r["y"], y.detach(), f"rank {rank}: column -> GeLU -> row output")
        close(r["x"], x.grad, f"rank {rank}: input gradient of the MLP")
