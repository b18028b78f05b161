"""Assignments 5.5.1 (ZeRO-1) and 5.5.2 (ZeRO-2), graded.

Real 2- and 4-process gloo runs of a tiny language model with 2347 parameters (no dp size
> 1 divides it, so the flat buffer is padded); the 4-process run also as two dp groups of 2, each of
which must equal the data parallelism of its own ranks (collectives over the optimizer's group, not the
world). After every step each rank's slice gradient must equal the slice of the data-parallel mean gradient, every rank's parameters must equal
those of one process stepping ``torch.optim.Adam`` on the mean loss (and, for ZeRO-1,
those of ``torch.distributed.optim.ZeroRedundancyOptimizer``) and be bit-for-bit the same on
every rank, and a rank must hold Adam state for its slice only. ZeRO-2: after the reduction a
rank holds no full gradient — its slice's gradient (the average, checked on the slice itself)
is all it keeps, not a view into a full-size buffer. ZeRO-1: after the reduction every parameter's
``grad`` holds the data-parallel mean gradient (``_reduce_stage1``'s contract: a step that gives only the
optimizer's slice the mean and leaves each ``param.grad`` as the rank's own gradient fails; gradient
clipping and logging read ``param.grad``).
"""
import functools

import pytest
import torch

from tests.support.launching import launch_once
from tests.support.memory import TOL, make_model, reference_run, zero_worker

STEPS = 3


@functools.lru_cache(maxsize=None)
def run(stage, world_size, planted=None):
    return launch_once(zero_worker, world_size, stage, STEPS, planted, timeout=120)


@functools.lru_cache(maxsize=None)
def reference(world_size, first=0):
    return reference_run(world_size, STEPS, first=first)


def check_against_dp(stage, world_size, planted=None):
    outputs = run(stage, world_size, planted)
    grads, params = reference(world_size)
    numel = sum(p.numel() for p in make_model().parameters())
    size = -(-numel // world_size)
    for rank in range(world_size):
        out = outputs[rank]
        assert (out["start"], out["end"], out["padded"]) == (rank * size, (rank + 1) * size, size * world_size), (
            f"rank {rank} owns [{out['start']}, {out['end']}) of {out['padded']}; expected "
            f"[{rank * size}, {(rank + 1) * size}) of {size * world_size} (padded to a multiple of dp)")
        for step, rec in enumerate(out["steps"]):
            want = torch.cat([grads[step], torch.zeros(size * world_size - numel)])[rank * size:(rank + 1) * size]
            got = rec["shard_grad"]
            assert got.shape == want.shape, f"rank {rank} step {step}: slice gradient of shape {tuple(got.shape)}"
            assert torch.allclose(got, want, **TOL), (
                f"rank {rank} step {step}: slice gradient differs from the data-parallel mean gradient "
                f"(median ratio {float((got[want != 0] / want[want != 0]).median()):.3f}; summed but not divided by dp?)")
            assert torch.allclose(rec["params"], params[step], **TOL), (
                f"rank {rank} step {step}: parameters differ from data parallelism with torch.optim.Adam "
                f"(max diff {float((rec['params'] - params[step]).abs().max()):.2e})")
            if stage == 1:
                held = rec["param_grads"]
                assert torch.allclose(held, grads[step], **TOL), (
                    f"rank {rank} step {step}: the parameters' .grad differ from the data-parallel mean gradient "
                    f"(max diff {float((held - grads[step]).abs().max()):.2e}): after reduce_gradients every "
                    "parameter's grad holds the mean over dp (views of the averaged flat gradient), not this rank's own")
            assert torch.equal(rec["params"], outputs[0]["steps"][step]["params"]), (
                f"rank {rank} step {step}: parameters differ from rank 0's; after the step every rank must hold "
                "every updated slice (all-gather them)")
            assert rec["state_numel"] == 2 * size, (
                f"rank {rank} holds {rec['state_numel']} elements of Adam state; ZeRO keeps exp_avg and exp_avg_sq "
                f"of its own slice only: 2 x {size} (did every rank step the whole model?)")
    if world_size == 4:
        check_in_groups(outputs)
    return outputs


def check_in_groups(outputs):
    """The 4-rank run's second optimizer, over dp groups of 2 ({0, 1} and {2, 3}; tests/support/memory.py,
    ``GROUPS_MESH``): each group equals the 2-rank data parallelism of its own shards — its collectives take the
    optimizer's group, not the world (the same when the group is the world, as in every run above)."""
    numel = sum(p.numel() for p in make_model().parameters())
    size = -(-numel // 2)
    for rank, out in outputs.items():
        grads, params = reference(2, 2 * (rank // 2))
        for step, rec in enumerate(out["in_groups"]):
            want = torch.cat([grads[step], torch.zeros(2 * size - numel)])[rank % 2 * size:(rank % 2 + 1) * size]
            got = rec["shard_grad"]
            assert got.shape == want.shape and torch.allclose(got, want, **TOL), (
                f"rank {rank} step {step}, dp group {{{rank // 2 * 2}, {rank // 2 * 2 + 1}}} of 4 ranks: the slice "
                f"gradient differs from the mean over that group's ranks (shape {tuple(got.shape)}): every collective "
                "takes the optimizer's group, not the world")
            assert torch.allclose(rec["params"], params[step], **TOL), (
                f"rank {rank} step {step}, dp group of 2 of 4 ranks: parameters differ from the group's data "
                "parallelism with torch.optim.Adam (collectives over the optimizer's group only)")


@pytest.mark.a5_5_1
def test_shard_range_covers_the_padded_buffer_in_equal_slices():
    from memory.zero import shard_range

    for numel, dp in [(10, 4), (12, 4), (1, 3), (2347, 2), (2347, 4), (7, 1)]:
        ranges = [shard_range(numel, dp, r) for r in range(dp)]
        padded = ranges[0][2]
        assert padded % dp == 0 and numel <= padded < numel + dp, f"numel {numel}, dp {dp}: padded to {padded}"
        assert [r[2] for r in ranges] == [padded] * dp
        assert ranges[0][0] == 0 and ranges[-1][1] == padded
        for (s0, e0, _), (s1, e1, _) in zip(ranges, ranges[1:]):
            assert e0 == s1, f"numel {numel}, dp {dp}: slices {s0}:{e0} and {s1}:{e1} are not contiguous"
        assert {e - s for s, e, _ in ranges} == {padded // dp}


@pytest.mark.a5_5_1
@pytest.mark.parametrize("world_size", [2, 4])
def test_zero1_equals_data_parallel_adam_and_zero_redundancy_optimizer(world_size):
    outputs = check_against_dp(1, world_size)
    for rank in range(world_size):
        for step, rec in enumerate(outputs[rank]["steps"]):
            assert torch.allclose(rec["params"], rec["zro_params"], **TOL), (
                f"rank {rank} step {step}: parameters differ from torch.distributed.optim.ZeroRedundancyOptimizer")


@pytest.mark.a5_5_2
@pytest.mark.parametrize("world_size", [2, 4])
def test_zero2_equals_data_parallel_adam_and_keeps_only_its_gradient_slice(world_size):
    outputs = check_against_dp(2, world_size)
    for rank in range(world_size):
        for step, rec in enumerate(outputs[rank]["steps"]):
            assert rec["full_grads_held"] == 0, (
                f"rank {rank} step {step}: {rec['full_grads_held']} gradient elements of the full model are still "
                "held after the reduction; ZeRO-2 keeps only its slice's gradient")
            slice_bytes = rec["shard_grad"].numel() * rec["shard_grad"].element_size()
            assert rec["shard_grad_storage_bytes"] == slice_bytes, (
                f"rank {rank} step {step}: the slice's gradient is a view into {rec['shard_grad_storage_bytes']} bytes, "
                f"not a {slice_bytes}-byte slice of its own: the full averaged gradient is still held (reduce-scatter, "
                "so that each rank receives its slice only)")
