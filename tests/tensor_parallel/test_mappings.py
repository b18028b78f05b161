"""Assignment 5.3.1 — Megatron's conjugate operators f and g, and scatter/gather (graded).

Each operator runs across 2 real processes (gloo); its forward output and input gradient
on every rank are compared with the closed form computed here from the same inputs:

* f: forward identity, backward = sum of the ranks' upstream gradients,
* g: forward = sum of the ranks' inputs, backward identity,
* scatter (last dim): forward = this rank's chunk, backward = all ranks' gradient chunks concatenated,
* gather (last dim): forward = all ranks' chunks concatenated, backward = this rank's chunk,
* gather(scatter(x)) == x.

The collectives must go through ``course.collectives`` so the counter sees them: f's
forward and g's backward communicate nothing, f's backward is one all-reduce, etc.
Tolerance: float32, atol 1e-6: the mappings copy, split and concatenate (exact) or all-reduce 2 ranks'
O(1) randn values (a two-term sum, the same in either order: exact to the same bits), so 1e-6 only
allows for a reduction that adds in another order, 2^-24 x 2 ~ 1.2e-7 of values < ~4.
"""

import pytest
import torch
from tests.support.tensor_parallel import assert_close, case, launch_once, run_operator

WORLD = 2
SHAPE = (2, 3, 4)  # last dim divisible by WORLD


def _tensor(seed: int, shape=SHAPE) -> torch.Tensor:
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed))


def per_rank_input(rank):
    return _tensor(100 + rank)


def shared_input():
    return _tensor(7)


def upstream(rank, shape=SHAPE):
    return _tensor(200 + rank, shape)




def mappings_worker(rank, world_size):
    from tensor_parallel import mappings as M

    chunk = SHAPE[-1] // world_size
    small = SHAPE[:-1] + (chunk,)
    return {
        "f": run_operator(M.copy_to_tensor_parallel_region, per_rank_input(rank), upstream(rank)),
        "g": run_operator(M.reduce_from_tensor_parallel_region, per_rank_input(rank), upstream(rank)),
        "scatter": run_operator(M.scatter_to_tensor_parallel_region, shared_input(), upstream(rank, small)),
        "gather": run_operator(M.gather_from_tensor_parallel_region, per_rank_input(rank)[..., :chunk], upstream(rank)),
        "roundtrip": run_operator(lambda x: M.gather_from_tensor_parallel_region(M.scatter_to_tensor_parallel_region(x)),
                          shared_input(), upstream(rank)),
    }


results = launch_once(mappings_worker, WORLD)


def get(op, rank):
    return case(results(), op, rank)


def close(actual, expected, what):
    assert_close(actual, expected, what, atol=1e-6, rtol=0)


def counted(r, forward, backward, op):
    assert r["forward"] == forward and r["backward"] == backward, (
        f"{op}: collectives counted forward {r['forward']}, backward {r['backward']}; expected forward {forward}, "
        f"backward {backward}. Communicate through course.collectives (all_reduce, all_gather) so they are counted.")


@pytest.mark.a5_3_1
def test_f_is_identity_forward_and_all_reduce_backward():
    total_grad = sum(upstream(r) for r in range(WORLD))
    for rank in range(WORLD):
        r = get("f", rank)
        close(r["y"], per_rank_input(rank), f"f forward on rank {rank} must return its input unchanged")
        close(r["grad"], total_grad, f"f backward on rank {rank} must sum the ranks' gradients")
        counted(r, {}, {"all_reduce": 1}, "f")


@pytest.mark.a5_3_1
def test_g_is_all_reduce_forward_and_identity_backward():
    total = sum(per_rank_input(r) for r in range(WORLD))
    for rank in range(WORLD):
        r = get("g", rank)
        close(r["y"], total, f"g forward on rank {rank} must sum the ranks' inputs")
        close(r["grad"], upstream(rank), f"g backward on rank {rank} must pass the gradient through unchanged")
        counted(r, {"all_reduce": 1}, {}, "g")


@pytest.mark.a5_3_1
def test_scatter_keeps_its_own_part_and_gathers_gradient():
    chunk = SHAPE[-1] // WORLD
    full_grad = torch.cat([upstream(r, SHAPE[:-1] + (chunk,)) for r in range(WORLD)], dim=-1)
    for rank in range(WORLD):
        r = get("scatter", rank)
        close(r["y"], shared_input()[..., rank * chunk:(rank + 1) * chunk], f"scatter forward on rank {rank}")
        close(r["grad"], full_grad, f"scatter backward on rank {rank} must concatenate every rank's gradient")
        counted(r, {}, {"all_gather": 1}, "scatter")


@pytest.mark.a5_3_1
def test_gather_concatenates_and_splits_gradient():
    chunk = SHAPE[-1] // WORLD
    full = torch.cat([per_rank_input(r)[..., :chunk] for r in range(WORLD)], dim=-1)
    for rank in range(WORLD):
        r = get("gather", rank)
        close(r["y"], full, f"gather forward on rank {rank} must concatenate the ranks' chunks in rank order")
        close(r["grad"], upstream(rank)[..., rank * chunk:(rank + 1) * chunk],
              f"gather backward on rank {rank} must keep its own chunk of the gradient")
        counted(r, {"all_gather": 1}, {}, "gather")


@pytest.mark.a5_3_1
def test_gather_undoes_scatter():
    chunk = SHAPE[-1] // WORLD
    for rank in range(WORLD):
        r = get("roundtrip", rank)
        close(r["y"], shared_input(), "gather(scatter(x)) must equal x")
        # Each rank keeps its own chunk of its own upstream gradient; the all-gather concatenates them.
        expected = torch.cat([upstream(q)[..., q * chunk:(q + 1) * chunk] for q in range(WORLD)], dim=-1)
        close(r["grad"], expected, "backward of gather(scatter(x))")
