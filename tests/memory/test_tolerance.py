"""Ungraded: the memory tests' tolerance (``tests.support.memory.TOL``) holds on this machine's kernels.

The ZeRO, FSDP and HSDP tests compare parameters after 3 Adam steps, where a rounding difference in a
small gradient can grow. Their reference trajectory in float32 is compared here with the same trajectory
in float64 (exact arithmetic to within 2^-53): float32's own rounding on this CPU must use at most half
of the tolerance at every step, so that any correct implementation's other rounding fits in it too. If
this fails on a machine, the tolerance is too tight for it there — not the implementations wrong.
"""
import pytest
import torch

from tests.support.memory import TOL, reference_run

STEPS = 3  # the steps of tests/memory/test_zero1_zero2.py, test_fsdp.py and test_hsdp.py


@pytest.mark.parametrize("world_size, first", [(2, 0), (4, 0), (2, 2)])  # (2, 2): the dp group {2, 3} of 4 ranks
def test_float32_rounding_uses_at_most_half_the_tolerance(world_size, first):
    single = reference_run(world_size, STEPS, first=first)
    exact = reference_run(world_size, STEPS, torch.float64, first=first)
    for step, (g32, p32, g64, p64) in enumerate(zip(*single, *exact)):
        for what, got, want in (("gradient", g32, g64), ("parameters", p32, p64)):
            used = float(((got.double() - want).abs() / (TOL["atol"] + TOL["rtol"] * want.abs())).max())
            assert used <= 0.5, f"step {step}: float32 rounding of the {what} uses {used:.2f} of the tolerance"
