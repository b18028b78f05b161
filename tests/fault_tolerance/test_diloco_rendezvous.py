"""Assignment 5.1.4 — DiLoCo (``fault_tolerance/diloco.py``), checked across 3 replica groups (one rank each) under
NCCL's ordering rules (``LLMSYS_NCCL_RULES=1``, :mod:`course.nccl_rules`), in float64:

* against torchft's own DiLoCo (``torchft.local_sgd.DiLoCo``, its pseudo-gradients averaged over the same group):
  the same weights after each of 3 outer steps of H = 3 AdamW steps, outer SGD lr 0.7 with Nesterov momentum 0.9;
* with H = 1, an outer lr of 1 and no momentum (inner SGD), DiLoCo is synchronous data-parallel SGD;
* after every outer step every group holds the same weights (each starts the next round from the global ones);
* over process groups that are not the world (ranks [0, 1] and rank [2] alone), each equals torchft's DiLoCo over
  the same group: a DiLoCo that all-reduces or divides over the world instead mixes in, or counts, the third rank;
* in one process, the outer step is ``torch.optim.SGD(nesterov=True)`` applied to the pseudo-gradient.

Tolerance: both sides do the same float64 operations, possibly in another order (a sum before or after the
division by the group's size): each rounds at float64's 2.2e-16 relative; 9 AdamW steps (whose normalised update
changes at most twice as much, relatively, as the gradient) and 3 outer steps (the momentum sums at most
1 / (1 - 0.9) = 10 pseudo-gradients) keep that below 1e-12 on weights of size ~1. TOL = 1e-9 leaves room; the
wrong solutions of tests/instructor/planted.py move the weights by more than 1e-3.
"""
from __future__ import annotations

import pytest
import torch

from course.launch import launch
from tests.support.rendezvous import under_rules

pytestmark = pytest.mark.a5_1_4
GROUPS, TOL = 3, 1e-9


@pytest.fixture(scope="module")
def runs():
    with pytest.MonkeyPatch.context() as monkeypatch:
        under_rules(monkeypatch)
        from tests.fault_tolerance.workers import diloco_worker

        return launch(diloco_worker, GROUPS, device="cpu", timeout=120, collective_timeout=60)


def check_case(runs: dict, case: str, tol: float = TOL, groups=None) -> None:
    """Every rank's weights after each outer step equal the reference's (within ``tol``) and those of every other
    rank of its group (``groups``: lists of ranks; None: the world)."""
    for rank, cases in runs.items():
        ours, reference = cases[case]["ours"], cases[case]["reference"]
        assert len(ours) == len(reference), f"rank {rank}: {len(ours)} outer steps, the reference took {len(reference)}"
        for k, (a, b) in enumerate(zip(ours, reference)):
            err = (a - b).abs().max().item()
            assert err <= tol, f"{case}, rank {rank}: weights after outer step {k + 1} differ by {err:.3g} (> {tol})"
    for rank, cases in runs.items():
        first = min(next(g for g in (groups or [list(runs)]) if rank in g))
        for k, a in enumerate(cases[case]["ours"]):
            assert torch.equal(a, runs[first][case]["ours"][k]), \
                f"{case}: rank {rank} and rank {first} hold different weights after outer step {k + 1}: every group " \
                "must start the next round from the same global weights"


def test_diloco_equals_torchfts_diloco_rendezvous(runs):
    check_case(runs, "torchft")


def test_one_inner_step_outer_lr_one_no_momentum_is_data_parallel_sgd_rendezvous(runs):
    check_case(runs, "h1")


def test_diloco_over_groups_that_are_not_the_world_rendezvous(runs):
    from tests.fault_tolerance.workers import SUBGROUPS

    check_case(runs, "subgroups", groups=SUBGROUPS)


def test_in_one_process_the_outer_step_is_nesterov_sgd_on_the_pseudo_gradient():
    from fault_tolerance.diloco import DiLoCo
    from tests.fault_tolerance.workers import flat, loss_of, mlp

    model, reference = mlp(), mlp()
    diloco = DiLoCo(model, torch.optim.AdamW(model.parameters(), lr=0.05), sync_every=2)
    inner = torch.optim.AdamW(reference.parameters(), lr=0.05)
    global_weights = [p.detach().clone() for p in reference.parameters()]
    outer = torch.optim.SGD(global_weights, lr=0.7, momentum=0.9, nesterov=True)
    for step in range(6):
        for m in (model, reference):
            m.zero_grad()
            loss_of(m, 0, step).backward()
        diloco.step()
        inner.step()
        if (step + 1) % 2 == 0:
            with torch.no_grad():
                for g, p in zip(global_weights, reference.parameters()):
                    g.grad = g - p
                outer.step()
                for g, p in zip(global_weights, reference.parameters()):
                    p.copy_(g)
            err = (flat(model) - flat(reference)).abs().max().item()
            assert err <= TOL, f"after outer step {(step + 1) // 2}: {err:.3g}"
    assert diloco.outer_steps == 3 and diloco.inner_steps == 6
