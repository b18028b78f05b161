"""Assignment 5.1.4 — DiLoCo: H local steps per replica group, then one outer step on the averaged pseudo-gradient.

Data parallelism all-reduces every gradient at every step. DiLoCo (Douillard et al. 2023, "DiLoCo: Distributed
Low-Communication Training of Language Models", Algorithm 1) lets each replica group take ``H`` **inner** steps
with its own AdamW on its own data, then synchronises once:

1. the **pseudo-gradient** of group ``i`` is ``Δ_i = θ_global − θ_i`` (how far it moved, signed like a gradient:
   a step downhill ``θ_i = θ_global − lr g`` gives ``Δ_i = lr g``);
2. it is **averaged** across the groups (one all-reduce of the weights' size: the only communication of a round);
3. an **outer** SGD step with Nesterov momentum (the paper's lr 0.7, momentum 0.9, Sec. 3) moves the global
   weights: ``θ_global ← OuterSGD(θ_global, mean Δ)``;
4. every group starts the next round from the new global weights. The inner AdamW state stays each group's own.

So the groups exchange the weights' bytes once per ``H`` steps instead of once per step. With ``H = 1``, an outer lr
of 1 and no momentum, and a plain-SGD inner optimizer, a round is exactly a data-parallel SGD step.
torchft's ``torchft.local_sgd.DiLoCo`` runs the same algorithm (with a torchft ``Manager`` in place of the
process group); ``tests/fault_tolerance`` compares the two.
"""
from __future__ import annotations

import torch

from course.collectives import all_reduce, group_size

OUTER_LR, OUTER_MOMENTUM = 0.7, 0.9  # Douillard et al. 2023, Sec. 3 (the outer optimizer)


class DiLoCo:
    """DiLoCo over the replica groups of ``group`` (one rank per group; see the module docstring).

    Call :meth:`step` in place of ``inner_optimizer.step()``: it steps the inner optimizer and, after every
    ``sync_every``-th inner step, runs :meth:`outer_step` (a collective over ``group``: every rank calls it at the
    same inner step).

    Args:
        model: this group's replica; every rank starts from the same weights.
        inner_optimizer: its optimizer (AdamW in the paper) over ``model.parameters()``.
        sync_every: H, the inner steps per round (>= 1).
        outer_lr, outer_momentum: the outer SGD's; Nesterov momentum when ``outer_momentum > 0``.
        group: the process group across the replica groups (None: the world).

    Attributes:
        global_params: the global weights θ_global (copies, on the parameters' devices).
        outer_optimizer: ``torch.optim.SGD`` over ``global_params``; its momentum buffers persist across rounds.

    Raises:
        ValueError: ``sync_every`` < 1, or an outer lr or momentum out of range.
    """

    def __init__(self, model: torch.nn.Module, inner_optimizer: torch.optim.Optimizer, *, sync_every: int,
                 outer_lr: float = OUTER_LR, outer_momentum: float = OUTER_MOMENTUM, group=None):
        if sync_every < 1:
            raise ValueError(f"sync_every (H) must be >= 1 inner steps per round, not {sync_every}")
        if outer_lr <= 0 or not 0 <= outer_momentum < 1:
            raise ValueError(f"outer_lr must be > 0 and outer_momentum in [0, 1), not {outer_lr}, {outer_momentum}")
        self.model, self.inner_optimizer, self.sync_every, self.group = model, inner_optimizer, sync_every, group
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.global_params = [p.detach().clone() for p in self.params]
        self.outer_optimizer = torch.optim.SGD(self.global_params, lr=outer_lr, momentum=outer_momentum,
                                               nesterov=outer_momentum > 0)
        self.inner_steps = 0
        self.outer_steps = 0

    def step(self) -> bool:
        """One inner step; after every ``sync_every``-th, the outer step. Returns whether the outer step ran."""
        self.inner_optimizer.step()
        self.inner_steps += 1
        if self.inner_steps % self.sync_every:
            return False
        self.outer_step()
        return True

    @torch.no_grad()
    def outer_step(self) -> None:
        """Average the pseudo-gradients ``global − local`` over ``group``, step the outer optimizer on the global
        weights, and load the new global weights into the model. Collective over ``group`` (one all-reduce per
        parameter, in the parameters' order: the same on every rank)."""
        # BEGIN ASSIGN5_1_4
        size = group_size(self.group)
        for local, shared in zip(self.params, self.global_params):
            delta = all_reduce(shared - local, group=self.group)  # the pseudo-gradients, summed over the groups
            shared.grad = delta / size
        self.outer_optimizer.step()
        self.outer_optimizer.zero_grad(set_to_none=True)
        for local, shared in zip(self.params, self.global_params):
            local.copy_(shared)
        # END ASSIGN5_1_4
        self.outer_steps += 1

    def state_dict(self) -> dict:
        """The global weights, the outer optimizer and the counters (what a healing group needs besides the model
        and its inner optimizer)."""
        return {"global_params": [p.detach().clone() for p in self.global_params],
                "outer_optimizer": self.outer_optimizer.state_dict(), "inner_steps": self.inner_steps,
                "outer_steps": self.outer_steps}


def bytes_per_round(model: torch.nn.Module) -> int:
    """Bytes all-reduced across the groups per outer step: every trainable parameter once (its dtype's size)."""
    return sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)
