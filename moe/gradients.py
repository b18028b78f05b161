"""Gradient averaging under expert parallelism × data parallelism: two kinds of parameters, two groups.

On the device mesh (docs/architecture.md, "The device mesh"; :mod:`course.mesh`), the D = dp × cp
ranks of a stage and tp rank hold the same **dense** parameters and see different tokens. The
expert-parallel groups are carved out of those D ranks: numbering them ``f = dp_rank * cp +
cp_rank``, the ranks with the same ``f // ep`` form an **ep group** (together they hold every
expert, ``E / ep`` each, and exchange tokens), and the ranks with the same ``f % ep`` form an
**edp group** (expert data parallel: they hold replicas of the same experts). For D = 4, ep = 2::

    f:            0      1      2      3
    experts:     0,1    2,3    0,1    2,3        (E = 4)
    ep groups:   [0, 1]        [2, 3]            tokens travel inside these
    edp groups:  [0, 2] and [1, 3]               replicas of the same experts

The training loss is the mean of the D ranks' losses, ``L = (1/D) sum_r L_r``. So:

* a dense parameter's gradient is the **mean over the D ranks** (``mesh.dp_cp_group``), as in
  plain data parallelism;
* an expert's gradient on a rank already **sums** the contributions of every rank of its ep
  group, whose tokens it processed (the all-to-all's backward pass brought them back). Summing
  those partial sums over the expert's replicas (``mesh.edp_group``) covers all D ranks once,
  so the expert's gradient is that sum over the edp group divided by **D** — the mean over its
  edp group (D / ep replicas) divided by ep, not the mean over the edp group alone.

With ep = 1 the edp group is the whole dp × cp group and both rules are plain averaging. Every rank
of a group must join each all-reduce: a parameter without a gradient (an expert that received no
token) takes part with zeros. (Megatron-Core: ``expert_data_parallel_group`` and the expert
gradient scaling of ``DistributedDataParallel``.)
"""
from __future__ import annotations

import torch

from course.collectives import all_reduce, group_size


def _all_reduce_flat(params: list[torch.nn.Parameter], group, divisor: int) -> None:
    """``p.grad = (sum of p.grad over group) / divisor`` for every p, as one all-reduce of a flat buffer."""
    if not params:
        return
    flat = all_reduce(torch.cat([p.grad.reshape(-1) for p in params]), group=group) / divisor
    offset = 0
    for p in params:
        p.grad.copy_(flat[offset:offset + p.numel()].view_as(p.grad))
        offset += p.numel()


def sync_moe_gradients(model, dense_group, expert_group) -> None:
    """Make every gradient of ``model`` the gradient of the mean loss of the dp × cp ranks (module docstring).

    Args:
        model: an :class:`moe.gpt2.MoEGPT2` (or anything with ``dense_parameters()`` and
            ``expert_parameters()``) after the backward pass of this rank's loss.
        dense_group: the ranks that hold the same dense parameters (``mesh.dp_cp_group``; None: the world).
        expert_group: the replicas of this rank's experts (``mesh.edp_group``).

    Collective in both groups; leaves the result in every ``p.grad``.
    """
    for p in model.parameters():
        if p.grad is None:
            p.grad = torch.zeros_like(p)
    dense, experts = model.dense_parameters(), model.expert_parameters()
    # BEGIN ASSIGN5_8_3
    ranks = group_size(dense_group)
    _all_reduce_flat(dense, dense_group, ranks)
    _all_reduce_flat(experts, expert_group, ranks)
    # END ASSIGN5_8_3
