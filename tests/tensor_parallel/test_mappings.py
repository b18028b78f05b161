"""Assignment 5.3.1 — Megatron's conjugate operators f and g, and scatter/gather (graded).

Each operator runs in the tensor-parallel groups of a (dp 2, tp 2) mesh of 4 real processes (gloo;
:func:`tests.support.tensor_parallel.operator_results`): groups of 2 that are not the world, ranks 2 and 3
being ranks 0 and 1 of theirs, with inputs that differ on every rank. Its forward output and input
gradient on every rank are compared with the closed form computed here over the rank's group:

* f: forward identity, backward = sum of the group's upstream gradients,
* g: forward = sum of the group's inputs, backward identity,
* scatter (last dim): forward = this rank's chunk (by its rank in the group), backward = the group's
  gradient chunks concatenated,
* gather (last dim): forward = the group's chunks concatenated, backward = this rank's chunk,
* gather(scatter(x)) == x,
* every operator keeps a float64 tensor float64, forward and backward, at float64's precision.

An operator that communicates in the world instead of its group adds or gathers the other group's
tensors; one that picks its chunk by the global rank has no chunk 2 or 3. The collectives must go
through ``course.collectives`` so the counter sees them: f's forward and g's backward communicate
nothing, f's backward is one all-reduce, etc.
Tolerance: float32, atol 1e-6: the mappings copy, split and concatenate (exact) or all-reduce 2 ranks'
O(1) randn values (a two-term sum, the same in either order: exact to the same bits), so 1e-6 only
allows for a reduction that adds in another order, 2^-24 x 2 ~ 1.2e-7 of values < ~4. float64: the same
two-term sums, 2 x 2^-53 ~ 2.2e-16 of values < ~4: atol 1e-14; float32 arithmetic anywhere (2^-24 ~ 6e-8
relative) is 10^6 times that.
"""

import pytest
import torch
from tests.support.tensor_parallel import (TP, WORLD, assert_close, case, group_members, group_rank,
                                           operator_results, run_operator)

SHAPE = (2, 3, 4)  # last dim divisible by the group size


def _tensor(seed: int, shape=SHAPE, dtype=torch.float32) -> torch.Tensor:
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed), dtype=dtype)


def per_rank_input(rank, dtype=torch.float32):
    return _tensor(100 + rank, dtype=dtype)


def shared_input(dtype=torch.float32):
    return _tensor(7, dtype=dtype)


def upstream(rank, shape=SHAPE, dtype=torch.float32):
    return _tensor(200 + rank, shape, dtype)


def cases(rank, group):
    """This rank's results of every operator in ``group`` (run by
    :func:`tests.support.tensor_parallel.operators_worker`)."""
    from course.collectives import group_size
    from tensor_parallel import mappings as M

    chunk = SHAPE[-1] // group_size(group)
    small = SHAPE[:-1] + (chunk,)
    out = {}
    for dtype, suffix in ((torch.float32, ""), (torch.float64, "-float64")):
        out.update({
            "f" + suffix: run_operator(lambda x: M.copy_to_tensor_parallel_region(x, group),
                                       per_rank_input(rank, dtype), upstream(rank, dtype=dtype)),
            "g" + suffix: run_operator(lambda x: M.reduce_from_tensor_parallel_region(x, group),
                                       per_rank_input(rank, dtype), upstream(rank, dtype=dtype)),
            "scatter" + suffix: run_operator(lambda x: M.scatter_to_tensor_parallel_region(x, group),
                                             shared_input(dtype), upstream(rank, small, dtype)),
            "gather" + suffix: run_operator(lambda x: M.gather_from_tensor_parallel_region(x, group),
                                            per_rank_input(rank, dtype)[..., :chunk], upstream(rank, dtype=dtype)),
        })
    out["roundtrip"] = run_operator(lambda x: M.gather_from_tensor_parallel_region(
        M.scatter_to_tensor_parallel_region(x, group), group), shared_input(), upstream(rank))
    return out


def get(op, rank):
    return case(operator_results(), "mappings", rank, op)


def close(actual, expected, what, atol=1e-6):
    assert_close(actual, expected, what, atol=atol, rtol=0)


def counted(r, forward, backward, op):
    assert r["forward"] == forward and r["backward"] == backward, (
        f"{op}: collectives counted forward {r['forward']}, backward {r['backward']}; expected forward {forward}, "
        f"backward {backward}. Communicate through course.collectives (all_reduce, all_gather) so they are counted.")


CHUNK = SHAPE[-1] // TP


@pytest.mark.a5_3_1
def test_f_is_identity_forward_and_all_reduce_backward():
    for rank in range(WORLD):
        total_grad = sum(upstream(q) for q in group_members(rank))
        r = get("f", rank)
        close(r["y"], per_rank_input(rank), f"f forward on rank {rank} must return its input unchanged")
        close(r["grad"], total_grad, f"f backward on rank {rank} must sum the gradients of its group "
                                     f"{group_members(rank)} (all-reduce in the group it is given)")
        counted(r, {}, {"all_reduce": 1}, "f")


@pytest.mark.a5_3_1
def test_g_is_all_reduce_forward_and_identity_backward():
    for rank in range(WORLD):
        total = sum(per_rank_input(q) for q in group_members(rank))
        r = get("g", rank)
        close(r["y"], total, f"g forward on rank {rank} must sum the inputs of its group {group_members(rank)}")
        close(r["grad"], upstream(rank), f"g backward on rank {rank} must pass the gradient through unchanged")
        counted(r, {"all_reduce": 1}, {}, "g")


@pytest.mark.a5_3_1
def test_scatter_keeps_its_own_part_and_gathers_gradient():
    chunk = CHUNK
    for rank in range(WORLD):
        full_grad = torch.cat([upstream(q, SHAPE[:-1] + (chunk,)) for q in group_members(rank)], dim=-1)
        mine = group_rank(rank)
        r = get("scatter", rank)
        close(r["y"], shared_input()[..., mine * chunk:(mine + 1) * chunk],
              f"scatter forward on rank {rank}: chunk {mine}, its rank in its group")
        close(r["grad"], full_grad, f"scatter backward on rank {rank} must concatenate its group's gradients")
        counted(r, {}, {"all_gather": 1}, "scatter")


@pytest.mark.a5_3_1
def test_gather_concatenates_and_splits_gradient():
    chunk = CHUNK
    for rank in range(WORLD):
        full = torch.cat([per_rank_input(q)[..., :chunk] for q in group_members(rank)], dim=-1)
        mine = group_rank(rank)
        r = get("gather", rank)
        close(r["y"], full, f"gather forward on rank {rank} must concatenate its group's chunks in group-rank order")
        close(r["grad"], upstream(rank)[..., mine * chunk:(mine + 1) * chunk],
              f"gather backward on rank {rank} must keep its own chunk of the gradient")
        counted(r, {"all_gather": 1}, {}, "gather")


@pytest.mark.a5_3_1
def test_gather_undoes_scatter():
    chunk = CHUNK
    for rank in range(WORLD):
        r = get("roundtrip", rank)
        close(r["y"], shared_input(), "gather(scatter(x)) must equal x")
        # Each rank keeps its own chunk of its own upstream gradient; the all-gather concatenates them.
        expected = torch.cat([upstream(q)[..., group_rank(q) * chunk:(group_rank(q) + 1) * chunk]
                              for q in group_members(rank)], dim=-1)
        close(r["grad"], expected, "backward of gather(scatter(x))")


@pytest.mark.a5_3_1
@pytest.mark.parametrize("op", ["f", "g", "scatter", "gather"])
def test_a_float64_tensor_stays_float64_and_exact(op):
    """"All tensors keep their dtype": an operator that sums or moves float64 tensors in float32 (``x.float()``
    "for accuracy", a buffer of the default dtype) changes the dtype or loses the float64 digits."""
    f64 = torch.float64
    for rank in range(WORLD):
        r, members, mine = get(op + "-float64", rank), group_members(rank), group_rank(rank)
        small = SHAPE[:-1] + (CHUNK,)
        want = {
            "f": (per_rank_input(rank, f64), sum(upstream(q, dtype=f64) for q in members)),
            "g": (sum(per_rank_input(q, f64) for q in members), upstream(rank, dtype=f64)),
            "scatter": (shared_input(f64)[..., mine * CHUNK:(mine + 1) * CHUNK],
                        torch.cat([upstream(q, small, f64) for q in members], dim=-1)),
            "gather": (torch.cat([per_rank_input(q, f64)[..., :CHUNK] for q in members], dim=-1),
                       upstream(rank, dtype=f64)[..., mine * CHUNK:(mine + 1) * CHUNK]),
        }[op]
        for name, got, expected in (("forward", r["y"], want[0]), ("backward", r["grad"], want[1])):
            assert got.dtype == f64, f"{op} {name} on rank {rank} returned {got.dtype} for a float64 tensor"
            close(got, expected, f"{op} {name} on rank {rank} (float64)", atol=1e-14)
