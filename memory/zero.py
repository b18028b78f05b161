"""Assignments 5.5.1 and 5.5.2 — ZeRO stages 1 and 2: optimizer state (and gradients) sharded over dp.

Plain data parallelism keeps on every rank a full copy of the parameters (4 bytes each in
fp32), their gradients (4) and Adam's two moments (8): 16 bytes per parameter, whatever the
number of ranks. ZeRO (Rajbhandari et al. 2020, "ZeRO: Memory Optimizations Toward Training
Trillion Parameter Models", Sec. 5.1 and Fig. 1) removes the redundancy:

* **ZeRO-1** (P_os): the parameters are laid out in one flat fp32 buffer of ``padded``
  elements (the parameter count rounded up to a multiple of dp, so that every rank owns a
  slice of the same length: ``reduce_scatter``/``all_gather`` need equal chunks); dp rank
  r owns ``flat[r * padded/dp : (r+1) * padded/dp]``. Gradients are all-reduced as in data
  parallelism and divided by dp, each rank steps Adam on its slice only (so it holds only
  1/dp of the moments), and the updated slices are all-gathered back into every rank's
  flat buffer. Memory ``4Ψ + 4Ψ + 8Ψ/dp`` bytes (fp32).
* **ZeRO-2** (P_os+g): the gradients are reduce-scattered (summed, and each rank receives
  the sum of its own slice only) and divided by dp, so a rank keeps ``4Ψ/dp`` bytes of
  gradient after the reduction. Memory ``4Ψ + (4 + 8)Ψ/dp``.

Communication: an all-reduce is a reduce-scatter followed by an all-gather, so both stages
move the same bytes as data parallelism, ``2Ψ`` elements per rank (ring; Sec. 7.2.1).

Here the gradients of the whole model are reduced after the backward pass (one bucket);
DeepSpeed reduces buckets while the backward pass still runs, so that the full gradient
never exists at once — our ZeRO-2 frees it right after the reduction.

The optimizer is any ``torch.optim`` class, stepped over one parameter that is a *view* of
this rank's slice of the flat buffer: Adam is element-wise, so stepping the slice gives
bit for bit what stepping the whole model gives on those elements.
"""
from __future__ import annotations

import torch
from torch import nn

from course import collectives


def shard_range(numel: int, dp: int, dp_rank: int) -> tuple[int, int, int]:
    """The slice of a flat buffer of ``numel`` elements that dp rank ``dp_rank`` of ``dp`` owns.

    The buffer is padded with zeros to ``padded``, the smallest multiple of ``dp`` that is
    >= ``numel``, and cut into ``dp`` equal contiguous slices (ZeRO, Sec. 5.1).

    Returns:
        ``(start, end, padded)``: rank ``dp_rank`` owns elements ``start .. end - 1``
        (``end - start == padded // dp``).

    Raises:
        ValueError: ``dp < 1``, ``dp_rank`` outside ``0 .. dp - 1`` or ``numel < 0``.

    Example: ``numel=10, dp=4`` -> padded 12, slices [0,3) [3,6) [6,9) [9,12).
    """
    if dp < 1 or not 0 <= dp_rank < dp or numel < 0:
        raise ValueError(f"shard_range: need dp >= 1, 0 <= dp_rank < dp and numel >= 0, got "
                         f"numel={numel}, dp={dp}, dp_rank={dp_rank}")
    start = end = padded = None
    # BEGIN ASSIGN5_5_1
    padded = -(-numel // dp) * dp
    size = padded // dp
    start, end = dp_rank * size, (dp_rank + 1) * size
    # END ASSIGN5_5_1
    return start, end, padded


def unique_parameters(params) -> list[nn.Parameter]:
    """``params`` in order, each tensor once (a tied embedding / LM-head weight appears once)."""
    seen, out = set(), []
    for p in params:
        if id(p) not in seen:
            seen.add(id(p))
            out.append(p)
    return out


def flatten_into(tensors, padded: int, device=None) -> torch.Tensor:
    """One fp32 vector of ``padded`` elements on ``device`` (None: the first tensor's; the CPU if every
    entry is None): the tensors flattened one after another, then zeros. A None entry (a parameter
    without gradient) is taken as zeros of its parameter's size; pass ``(tensor_or_None, numel)`` pairs.
    The flat buffers of ZeRO and FSDP live on the parameters' device: NCCL reduces and gathers them there."""
    tensors = list(tensors)
    if device is None:
        device = next((t.device for t, _ in tensors if t is not None), "cpu")
    out = torch.zeros(padded, dtype=torch.float32, device=device)
    offset = 0
    for t, n in tensors:
        if t is not None:
            out[offset:offset + n].copy_(t.reshape(-1))
        offset += n
    return out


class ZeroOptimizer:
    """ZeRO stage 1 or 2 over the ``group`` (dp) ranks, around a ``torch.optim`` optimizer.

    Construction re-points every parameter's data to a view of one flat fp32 buffer
    (``self.flat``, ``padded`` elements) and builds ``optimizer_class`` over
    ``self.shard``, a parameter that views this rank's slice ``flat[start:end]``.

    Use it in place of the data-parallel ``average_gradients`` + ``optimizer.step()``::

        opt.zero_grad(); loss.backward(); opt.reduce_gradients(); opt.step()

    Args:
        params: the model's parameters (every rank the same, in the same order; those
            with ``requires_grad=False`` are left alone).
        optimizer_class: e.g. ``torch.optim.Adam`` or ``torch.optim.AdamW``.
        group: the data-parallel process group (None: the world).
        stage: 1 (gradients all-reduced) or 2 (gradients reduce-scattered).
        **defaults: the optimizer's options (``lr=...``).

    Raises:
        ValueError: ``stage`` not 1 or 2, or no trainable parameter.
    """

    def __init__(self, params, optimizer_class=torch.optim.Adam, group=None, stage: int = 1, **defaults):
        if stage not in (1, 2):
            raise ValueError(f"ZeroOptimizer: stage must be 1 or 2 (got {stage}); stage 3 is memory.fsdp")
        self.params = [p for p in unique_parameters(params) if p.requires_grad]
        if not self.params:
            raise ValueError("ZeroOptimizer: no parameter requires a gradient")
        self.group, self.stage = group, stage
        self.dp, self.dp_rank = collectives.group_size(group), collectives.group_rank(group)
        self.numels = [p.numel() for p in self.params]
        self.numel = sum(self.numels)
        self.start, self.end, self.padded = shard_range(self.numel, self.dp, self.dp_rank)
        with torch.no_grad():
            self.flat = flatten_into([(p.detach(), n) for p, n in zip(self.params, self.numels)], self.padded)
            offset = 0
            for p, n in zip(self.params, self.numels):
                p.data = self.flat[offset:offset + n].view_as(p)
                offset += n
        self.shard = nn.Parameter(self.flat[self.start:self.end])  # shares the flat buffer's storage
        self.optimizer = optimizer_class([self.shard], **defaults)
        self.flat_grad: torch.Tensor | None = None  # ZeRO-1: the averaged full gradient

    # -- the training step ---------------------------------------------------------------------

    def zero_grad(self, set_to_none: bool = True) -> None:
        for p in self.params:
            p.grad = None
        self.shard.grad = None
        self.flat_grad = None

    def _local_flat_grad(self) -> torch.Tensor:
        """This rank's gradients (its own batch), flattened into ``padded`` elements (zeros where None)."""
        return flatten_into([(p.grad, n) for p, n in zip(self.params, self.numels)], self.padded, self.flat.device)

    def reduce_gradients(self) -> None:
        """After ``backward``: the mean gradient over dp of this rank's slice into ``self.shard.grad``."""
        if self.stage == 1:
            self._reduce_stage1()
        else:
            self._reduce_stage2()

    def _reduce_stage1(self) -> None:
        """ZeRO-1: all-reduce (SUM) the flat gradient in ``group``, divide by dp, keep it as every
        parameter's ``grad`` (views of ``self.flat_grad``) and give the optimizer this rank's slice
        (``self.shard.grad``, a view too)."""
        local = self._local_flat_grad()
        # BEGIN ASSIGN5_5_1
        self.flat_grad = collectives.all_reduce(local, group=self.group) / self.dp
        offset = 0
        for p, n in zip(self.params, self.numels):
            p.grad = self.flat_grad[offset:offset + n].view_as(p)
            offset += n
        self.shard.grad = self.flat_grad[self.start:self.end]
        # END ASSIGN5_5_1

    def _reduce_stage2(self) -> None:
        """ZeRO-2: reduce-scatter (SUM) the flat gradient in ``group`` so this rank receives the sum
        of its slice only, divide by dp, keep it as ``self.shard.grad`` and free the full gradients
        (every ``param.grad`` becomes None)."""
        local = self._local_flat_grad()
        # BEGIN ASSIGN5_5_2
        for p in self.params:
            p.grad = None
        self.shard.grad = collectives.reduce_scatter(local, 0, group=self.group) / self.dp
        # END ASSIGN5_5_2

    @torch.no_grad()
    def step(self) -> None:
        """Step the optimizer on this rank's slice, then all-gather the updated slices (in ``group``)
        into ``self.flat``, so every rank holds every updated parameter."""
        # BEGIN ASSIGN5_5_1
        self.optimizer.step()
        self.flat.copy_(collectives.all_gather(self.shard.detach(), 0, group=self.group))
        # END ASSIGN5_5_1

    # -- what it holds ---------------------------------------------------------------------------

    def state_tensors(self) -> list[torch.Tensor]:
        """The optimizer state this rank holds (Adam: ``exp_avg``, ``exp_avg_sq``; the step counters
        are scalars and counted too)."""
        return [t for state in self.optimizer.state.values() for t in state.values() if torch.is_tensor(t)]

    def grad_tensors(self) -> list[torch.Tensor]:
        """The gradients this rank holds: every parameter's ``grad`` and the slice's."""
        return [t for t in [p.grad for p in self.params] + [self.shard.grad] if t is not None]

    def param_tensors(self) -> list[torch.Tensor]:
        return list(self.params) + [self.shard]

    def state_dict(self) -> dict:
        return self.optimizer.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.optimizer.load_state_dict(state)

    @property
    def param_groups(self):
        return self.optimizer.param_groups
