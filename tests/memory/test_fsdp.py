"""Assignment 5.5.3 (ZeRO-3 / FSDP), graded.

Real 2- and 4-process gloo runs of the tiny language model (each block a unit, the tied
embedding / head, final LayerNorm and ``scale`` the root). After every step the gathered
mean gradients and parameters must equal one process doing data parallelism with
``torch.optim.Adam``, and (2 ranks) torch's FSDP2 (``torch.distributed.fsdp.fully_shard``)
on the same model, data and optimizer; the 4-process run also as two dp groups of 2, each equal to
the data parallelism of its own ranks (collectives over the unit's group, not the world). Memory:
after the backward pass no full parameter or gradient may be held, and during the step at most the
root and one block are gathered at once. Gradient accumulation: two micro-steps (a backward pass on each half of a rank's
batch, each reduced) then one optimizer step equal one step on the joined batch.
"""
import functools

import pytest
import torch

from tests.support.launching import launch_once
from tests.support.memory import TOL, fsdp_worker, reference_named_run

pytestmark = pytest.mark.a5_5_3

STEPS = 3


@functools.lru_cache(maxsize=None)
def run(world_size, with_fsdp2, planted=None):
    return launch_once(fsdp_worker, world_size, STEPS, with_fsdp2, planted, timeout=150)


@functools.lru_cache(maxsize=None)
def in_groups_reference(group):
    """The 2-rank data parallelism of dp group ``group`` of the 4-rank run's ``GROUPS_MESH`` (ranks 2g, 2g + 1)."""
    return reference_named_run(2, STEPS, 2 * group)


@pytest.mark.parametrize("world_size", [2, 4])
def test_zero3_equals_data_parallel_adam_and_frees_full_parameters(world_size):
    outputs = run(world_size, world_size == 2)
    reference = reference_named_run(world_size, STEPS)
    for rank in range(world_size):
        out = outputs[rank]
        block_bytes = [b for name, b in out["unit_bytes"].items() if name != "root"]
        allowed = out["unit_bytes"]["root"] + max(block_bytes)
        total = sum(out["unit_bytes"].values())
        assert all(n == b // 4 // world_size for n, b in zip(out["shard_numel"], out["unit_bytes"].values())), (
            f"rank {rank}: slices of {out['shard_numel']} elements; each must be 1/{world_size} of its padded unit")
        for step, (grads, params) in enumerate(reference):
            rec = out["steps"][step]
            assert rec["held_after_backward"] == 0, (
                f"rank {rank} step {step}: {rec['held_after_backward']} bytes of full parameters still held after "
                "the backward pass; every gathered unit must be freed (storage resized to 0)")
            assert rec["full_grads_held"] == 0, f"rank {rank} step {step}: full gradients kept after the reduction"
            assert rec["peak_full_bytes"] <= allowed, (
                f"rank {rank} step {step}: {rec['peak_full_bytes']} bytes of full parameters held at once (all units: "
                f"{total}); at most the root and one block ({allowed}) — free each block after its forward")
            assert rec["peak_full_bytes"] > 0
            assert set(rec["grads"]) == set(grads)
            for name in grads:
                assert torch.allclose(rec["grads"][name], grads[name], **TOL), (
                    f"rank {rank} step {step}: gradient of {name} differs from the data-parallel mean gradient "
                    f"(median ratio {float((rec['grads'][name] / grads[name]).median()):.3f})")
                assert torch.allclose(rec["params"][name], params[name], **TOL), (
                    f"rank {rank} step {step}: {name} differs from data parallelism with torch.optim.Adam")
                if "fsdp2_params" in rec:
                    assert torch.allclose(rec["params"][name], rec["fsdp2_params"][name], **TOL), (
                        f"rank {rank} step {step}: {name} differs from torch FSDP2 (fully_shard)")
        for step, rec in enumerate(out.get("in_groups", [])):  # 4 ranks as dp groups {0, 1} and {2, 3}
            grads, params = in_groups_reference(rank // 2)[step]
            for name in grads:
                assert torch.allclose(rec["grads"][name], grads[name], **TOL) and \
                    torch.allclose(rec["params"][name], params[name], **TOL), (
                        f"rank {rank} step {step}, a dp group of 2 of the 4 ranks: {name} differs from the data "
                        "parallelism of that group's ranks: every collective takes the unit's group, not the world")


def test_two_accumulated_micro_steps_equal_one_step_on_the_joined_batch():
    """The slices' gradients add up over micro-steps (a reduction that overwrites ``shard.grad`` keeps only
    the last micro-step's half)."""
    outputs = {rank: out["accumulation"] for rank, out in run(2, True).items()}  # the 2-rank launch
    grads, params = reference_named_run(2, 1)[0]
    for rank, out in outputs.items():
        for name in grads:
            assert torch.allclose(out["grads"][name], grads[name], **TOL), (
                f"rank {rank}: after two micro-steps the gradient of {name} is not the joined batch's (median ratio "
                f"{float((out['grads'][name] / grads[name]).median()):.3f}; add each micro-step's slice to shard.grad)")
            assert torch.allclose(out["params"][name], params[name], **TOL), (
                f"rank {rank}: {name} after the step differs from one step on the joined batch")
