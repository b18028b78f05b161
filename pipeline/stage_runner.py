"""A multi-process pipeline: each rank owns one stage and runs its schedule's action list.

Inside a worker started by :func:`course.launch.launch`, the rank at stage ``s`` of ``p``
(its rank in the pipeline's process group, the ``pp`` group of the run's mesh) builds its
stage (an ``nn.Module``) and a :class:`StageRunner`, then for every training step calls
:meth:`StageRunner.run` with its action list (:mod:`pipeline.schedules`). Activations
go forward to stage s + 1 and their gradients back to stage s - 1 by point-to-point
send/recv in the ``pp`` group (:mod:`pipeline.p2p`); a neighbour is addressed by its
global rank, ``dist.get_global_rank(pp_group, s ± 1)``. Gradients accumulate in the
stage's parameters over the micro-batches, exactly as in single-process training of the
same micro-batches, so the optimizer step after :meth:`run` is the same.

The runner also measures what the notebook draws: the start and end of every forward
and backward (seconds since a common origin, :func:`common_clock_origin`; the time spent waiting
for a neighbour is not inside these intervals), the micro-batches in flight (forwarded
but not yet backwarded) and the bytes of activations saved for backward.

Source: Narayanan et al. 2021, Megatron-LM, Sec. 2.2 (pipeline schedules) and 4.1.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable

import torch
import torch.distributed as dist
from torch import nn

from course.collectives import global_rank, group_rank, group_size
from pipeline.p2p import recv_tensor, send_tensor


@dataclass
class StepResult:
    """What one :meth:`StageRunner.run` measured on one rank.

    Attributes:
        losses: ``{micro-batch: loss}`` (last stage only; float values of ``loss_fn``).
        events: ``[(kind, micro-batch, start_s, end_s)]``, kind ``"F"`` or ``"B"``,
            seconds since the runner's common time origin.
        peak_in_flight: most micro-batches forwarded and not yet backwarded at once.
        peak_activation_bytes: most bytes of tensors saved for backward at once
            (parameters excluded).
    """

    losses: dict = field(default_factory=dict)
    events: list = field(default_factory=list)
    peak_in_flight: int = 0
    peak_activation_bytes: int = 0


def common_clock_origin(device: torch.device, group=None) -> float:
    """The wall-clock time (``time.time()``, seconds) of ``group``'s first rank, taken after a
    barrier in ``group`` and broadcast to its ranks.

    Every rank measures its events as ``time.time() - origin``: on one machine all
    processes read the same clock, so their timelines line up exactly; across nodes they
    line up as well as the nodes' clocks are synchronised (NTP: about a millisecond).
    """
    if not dist.is_initialized():
        return time.time()
    dist.barrier(group=group)
    origin = torch.tensor([time.time()], dtype=torch.float64, device=device)
    dist.broadcast(origin, src=global_rank(group, 0), group=group)
    return float(origin.item())


class StageRunner:
    """Runs one rank's action list of a pipeline schedule.

    Args:
        stage: this rank's layers; maps the previous stage's output to this stage's output.
        device: this rank's device (``course.launch.context().device``).
        loss_fn: last stage only: ``loss_fn(output, target) -> scalar``, the micro-batch's
            share of the batch loss (e.g. its mean loss divided by the number of micro-batches).
        group: the pipeline's process group (the mesh's ``pp`` group); None: the world.
            This rank's stage is its rank in ``group``, the number of stages its size.

    Attributes:
        stage_index, n_stages: this rank's stage ``s`` and the number of stages ``p``.
        is_first, is_last: ``s == 0``, ``s == p - 1``.

    The constructor is collective in ``group`` (every stage must build its runner): it sets
    the common time origin of the recorded events (:func:`common_clock_origin`).
    """

    def __init__(self, stage: nn.Module, device: torch.device, loss_fn: Callable | None = None, group=None):
        self.stage, self.group = stage, group
        self.stage_index, self.n_stages = group_rank(group), group_size(group)
        self.device = torch.device(device)
        self.is_first, self.is_last = self.stage_index == 0, self.stage_index == self.n_stages - 1
        if self.is_last and loss_fn is None:
            raise ValueError("the last stage needs a loss_fn")
        self.loss_fn = loss_fn
        self._param_storages = {p.untyped_storage().data_ptr() for p in stage.parameters()}
        self.origin = common_clock_origin(self.device, group)

    # ---- helpers the steps call -------------------------------------------------------
    def send(self, tensor: torch.Tensor, stage: int) -> None:
        """Start sending ``tensor`` to the rank of stage ``stage`` (non-blocking; finished by the end of :meth:`run`)."""
        self._pending.append((send_tensor(tensor, global_rank(self.group, stage), self.group), tensor))

    def recv(self, stage: int) -> torch.Tensor:
        """Receive the next tensor from the rank of stage ``stage`` onto this rank's device (blocking).

        It arrives as a leaf without ``requires_grad``: a stage that back-propagates into it
        must call ``.requires_grad_()`` on it before its forward, or its ``.grad`` stays None.
        """
        return recv_tensor(global_rank(self.group, stage), self.device, self.group)

    def compute_forward(self, i: int, x: torch.Tensor) -> torch.Tensor:
        """The stage's forward of micro-batch ``i`` (timed); on the last stage, its loss instead."""
        sizes: dict[int, int] = {}

        def pack(t):
            ptr = t.untyped_storage().data_ptr()
            if ptr not in self._param_storages:
                sizes[ptr] = t.untyped_storage().nbytes()
            return t

        start = time.time()
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            y = self.stage(x)
            if self.is_last:
                y = self.loss_fn(y, self.targets[i])
        self._record("F", i, start)
        if self.is_last:
            self.result.losses[i] = float(y.detach())
        self._activation_bytes[i] = sum(sizes.values())
        return y

    def compute_backward(self, i: int, y: torch.Tensor, grad: torch.Tensor | None) -> None:
        """Back-propagate ``grad`` (None on the last stage: ``y`` is the loss) through micro-batch ``i`` (timed)."""
        start = time.time()
        torch.autograd.backward(y, grad)
        self._record("B", i, start)
        self._activation_bytes.pop(i, None)

    def _record(self, kind: str, i: int, start: float) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        end = time.time()
        self.result.events.append((kind, i, start - self.origin, end - self.origin))

    # ---- the two steps of a schedule ------------------------------------------------------
    def forward_step(self, i: int) -> None:
        """Forward micro-batch ``i``: get its input (data on the first stage, else a receive from
        stage - 1, made to require grad), run :meth:`compute_forward`, send the output to
        stage + 1 (not on the last stage), and keep ``(input, output)`` in ``self.in_flight[i]``
        for the backward."""
        # BEGIN ASSIGN5_2_4
        if self.is_first:
            x = self.inputs[i].to(self.device)
        else:
            x = self.recv(self.stage_index - 1).requires_grad_()
        y = self.compute_forward(i, x)
        if not self.is_last:
            self.send(y, self.stage_index + 1)
        self.in_flight[i] = (x, y)
        # END ASSIGN5_2_4

    def backward_step(self, i: int) -> None:
        """Backward micro-batch ``i``: take ``self.in_flight[i]``, receive the output's gradient
        from stage + 1 (none on the last stage), run :meth:`compute_backward`, send the input's
        gradient to stage - 1 (not on the first stage)."""
        # BEGIN ASSIGN5_2_4
        x, y = self.in_flight.pop(i)
        grad = None if self.is_last else self.recv(self.stage_index + 1)
        self.compute_backward(i, y, grad)
        if not self.is_first:
            self.send(x.grad, self.stage_index - 1)
        # END ASSIGN5_2_4

    def run(self, actions: list[tuple[str, int]], inputs: list | None = None,
            targets: list | None = None) -> StepResult:
        """Run ``actions`` (e.g. ``one_f_one_b_actions(stage_index, p, m)``) for one batch.

        Args:
            inputs: first stage: the ``m`` micro-batch inputs (e.g. input_ids (mb, seq)).
            targets: last stage: the ``m`` micro-batch targets for ``loss_fn``.

        Gradients are accumulated into the stage's ``.grad`` (zero them before, step after).

        Raises:
            ValueError: an unknown action kind; the first stage without ``inputs``.
        """
        if self.is_first and inputs is None:
            raise ValueError("the first stage needs the micro-batch inputs")
        self.inputs, self.targets = inputs, targets
        self.in_flight: dict[int, tuple] = {}
        self._activation_bytes: dict[int, int] = {}
        self._pending: list = []
        self.result = StepResult()
        for kind, i in actions:
            if kind == "F":
                self.forward_step(i)
            elif kind == "B":
                self.backward_step(i)
            else:
                raise ValueError(f"unknown action {kind!r} (use 'F' or 'B')")
            self.result.peak_in_flight = max(self.result.peak_in_flight, len(self.in_flight))
            self.result.peak_activation_bytes = max(self.result.peak_activation_bytes,
                                                    sum(self._activation_bytes.values()))
        for works, _ in self._pending:
            for work in works:
                work.wait()
        self._pending = []
        return self.result
