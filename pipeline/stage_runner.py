"""A multi-process pipeline: each rank owns one stage and runs its schedule's action list.

Inside a worker started by :func:`course.launch.launch`, the rank at stage ``s`` of ``p``
(its rank in the pipeline's process group, the ``pp`` group of the run's mesh) builds its
stage (an ``nn.Module``) and a :class:`StageRunner`, then for every training step calls
:meth:`StageRunner.run` with its action list (:mod:`pipeline.schedules`). Activations
go forward to stage s + 1 and their gradients back to stage s - 1 by point-to-point
send/recv in the ``pp`` group (:mod:`pipeline.p2p`); a neighbour is addressed by its
global rank, ``dist.get_global_rank(pp_group, s ± 1)``.

**When messages travel.** A step's :meth:`send` does not send at once, and :meth:`recv` does not
wait: the runner's messaging (:class:`pipeline.stage_messages.StageMessages`) carries every message
in lock-step with the neighbour's, in the batches of a communication plan of every rank's action list
— what makes the pipeline safe under NCCL's point-to-point rules (docs/architecture.md,
"Point-to-point under NCCL's rules"). Gradients accumulate in the
stage's parameters over the micro-batches, exactly as in single-process training of the
same micro-batches, so the optimizer step after :meth:`run` is the same.

Several chunks per rank (interleaved 1F1B, Narayanan et al. 2021, Sec. 2.2.2): give the
runner a list of ``v`` modules; chunk ``c`` of the rank at stage ``s`` is virtual stage
``c * p + s`` of ``v * p``, and the actions name their chunk, ``(kind, micro-batch, chunk)``.
Before each step the runner makes that chunk current: :attr:`stage`, :attr:`is_first`,
:attr:`is_last` and :attr:`in_flight` then refer to it, and :meth:`send` / :meth:`recv`
address the neighbouring *virtual* stage (stage ``s ± 1`` taken modulo ``p``: the last
rank's chunk ``c`` feeds the first rank's chunk ``c + 1``). Messages name the virtual stage that
consumes them (:mod:`pipeline.stage_messages`), so the activations and gradients of several chunks
that travel between the same two ranks cannot be mixed up.

V placement (ZB-V, DualPipeV; :func:`pipeline.placement.stage_of`): ``StageRunner(..., placement="v")``
with two chunks per rank; chunk 0 of rank ``s`` is stage ``s``, chunk 1 stage ``2p - 1 - s``. The
chain runs down the ranks and back up, so rank 0 holds both the first stage (the data) and the last
(the loss), and the last rank hands stage ``p - 1``'s output to stage ``p`` inside itself. A
``("BW", i, chunk)`` action is the whole backward (input and weights in one pass) in a list whose other
backwards are split; a pair ``("F&B", forward, backward)`` runs as its forward, then its backward
(:func:`pipeline.placement.flatten_pairs`).

Split backward (ZB-H1, Qi et al. 2024, Sec. 2): if an action list contains ``("W", i)``
actions, ``("B", i)`` computes only the gradient with respect to the stage's input,
``torch.autograd.grad(output, input, grad, retain_graph=True)`` — the graph is kept — and
hands it upstream at the end of its step; ``("W", i)`` later computes the weight gradients,
``torch.autograd.backward(output, grad, inputs=parameters)``, and frees the graph. This
simple split re-traverses the stage's graph in ``W`` (the weight gradients of a layer
need the gradient of its output), so ``W`` costs about a whole backward here; torch's
``torch.distributed.pipelining`` keeps the intermediate gradients from ``B`` to avoid
that. :meth:`run` raises if a weight gradient is still pending at its end: the
optimizer step that follows would miss it.

The runner is three parts: this module executes the action list; :mod:`pipeline.stage_messages`
sends and receives in the pipeline's group; :mod:`pipeline.stage_measure` measures what the notebook
draws (each step's span on a common clock, micro-batches in flight, saved activation bytes:
:class:`StepResult`). A runner built with ``timed=False`` (a training mode's, ``three_d.training``) reads
the clock only while an event recorder is active.

Source: Narayanan et al. 2021, Megatron-LM, Sec. 2.2 (pipeline schedules) and 4.1.
"""
from __future__ import annotations

from typing import Callable

import torch
from torch import nn

from course.collectives import group_rank, group_size
from pipeline.stage_measure import StageMeter, StepResult, common_clock_origin
from pipeline.stage_messages import StageMessages
from pipeline.placement import flatten_pairs, rank_of, stage_of

__all__ = ["StageRunner", "StepResult", "common_clock_origin"]  # the last two live in pipeline.stage_measure


class StageRunner:
    """Runs one rank's action list of a pipeline schedule.

    Args:
        stage: this rank's layers; maps the previous stage's output to this stage's output.
            A list (or ``nn.ModuleList``) of ``v`` modules: this rank's chunks, chunk ``c``
            being virtual stage ``c * p + stage_index``.
        device: this rank's device (``course.launch.context().device``).
        loss_fn: last stage only: ``loss_fn(output, target) -> scalar``, the micro-batch's
            share of the batch loss (e.g. its mean loss divided by the number of micro-batches).
        group: the pipeline's process group (the mesh's ``pp`` group); None: the world.
            This rank's stage is its rank in ``group``, the number of stages its size.
        placement: where the chunks sit in the chain of stages (:func:`pipeline.placement.stage_of`):
            ``"loop"`` (chunk ``c`` is virtual stage ``c * p + stage_index``) or ``"v"`` (two chunks, stages
            ``stage_index`` and ``2p - 1 - stage_index``).
        timed: time every step (:func:`course.measure.now`: on a GPU, synchronising the device before
            and after it) into ``StepResult.events``. False: only while an event recorder is active
            (:func:`course.trace.active`), so that training without ``--trace`` is not slowed down.
            Settable later (attribute ``timed``).

    Attributes:
        stage_index, n_stages: this rank's stage ``s`` and the number of stages ``p``.
        chunks, virtual_stages: this rank's modules (model chunks) and their number ``v``.
        chunk: the chunk of the action being run (None outside :meth:`run`).
        is_first, is_last: the current chunk is the first / last virtual stage; outside
            :meth:`run`, this rank holds it (``s == 0``; ``s == last_rank``: ``p - 1``, or 0 with the V placement).
        placement, last_rank: where the chunks sit; the rank holding the last virtual stage (the loss).

    The constructor is collective in ``group`` (every stage must build its runner): it sets
    the common time origin of the recorded events (:func:`common_clock_origin`).
    """

    def __init__(self, stage: nn.Module, device: torch.device, loss_fn: Callable | None = None, group=None,
                 timed: bool = True, placement: str = "loop"):
        self.group = group
        self.placement = placement
        self.chunks = list(stage) if isinstance(stage, (list, tuple, nn.ModuleList)) else [stage]
        if not self.chunks:
            raise ValueError("a stage runner needs at least one chunk")
        self.virtual_stages, self.chunk = len(self.chunks), None
        self.stage_index, self.n_stages = group_rank(group), group_size(group)
        if placement == "v" and self.virtual_stages != 2:
            raise ValueError(f"the V placement runs two chunks per rank (stages r and 2p - 1 - r), got "
                             f"{self.virtual_stages}; build them with pipeline.gpt2_stages.gpt2_chunks(..., placement='v')")
        self.device = torch.device(device)
        self._whole = False  # the current backward is a whole one ("BW") in a split list
        if self.is_last and loss_fn is None:
            raise ValueError("the last stage needs a loss_fn")
        self.loss_fn = loss_fn
        self.messages = StageMessages(group, self.device, self.stage_index, self.n_stages, self.virtual_stages, placement)
        self.meter = StageMeter(self.device, [p for c in self.chunks for p in c.parameters()], self.virtual_stages,
                                timed, group=group)

    @property
    def timed(self) -> bool:
        """Whether every step is timed (see the class's ``timed``); settable."""
        return self.meter.timed

    @timed.setter
    def timed(self, value: bool) -> None:
        self.meter.timed = value

    @property
    def origin(self) -> float:
        """The common time origin of the recorded events (:func:`common_clock_origin`, seconds)."""
        return self.meter.origin

    # ---- the current chunk ----------------------------------------------------------------
    @property
    def stage(self) -> nn.Module:
        """The current chunk's module (the only one with one chunk per rank)."""
        return self.chunks[self.chunk or 0]

    @property
    def virtual_stage(self) -> int:
        """The current chunk's place in the chain of ``v * p`` virtual stages: ``chunk * p + stage_index``, or
        with the V placement :func:`pipeline.placement.stage_of`."""
        return stage_of(self.stage_index, self.chunk or 0, self.n_stages, self.placement)

    @property
    def last_rank(self) -> int:
        """The rank (in the group) that holds the last virtual stage, where the loss is computed: ``p - 1``, or
        0 with the V placement."""
        return rank_of(self.virtual_stages * self.n_stages - 1, self.n_stages, self.placement)

    @property
    def is_first(self) -> bool:
        if self.chunk is None:
            return self.stage_index == 0
        return self.virtual_stage == 0

    @property
    def is_last(self) -> bool:
        if self.chunk is None:
            return self.stage_index == self.last_rank
        return self.virtual_stage == self.virtual_stages * self.n_stages - 1

    @property
    def in_flight(self) -> dict:
        """The current chunk's ``{micro-batch: (input, output)}`` forwarded and not yet backwarded."""
        return self._in_flight[self.chunk or 0]

    # ---- messaging (pipeline.stage_messages) ----------------------------------------------
    def send(self, tensor: torch.Tensor, stage: int) -> None:
        """Hand ``tensor`` over to the rank of stage ``stage``: ``stage_index + 1`` in a forward (to the
        next virtual stage), ``stage_index - 1`` in a backward (to the previous one), taken modulo ``p``.

        It leaves at this action's step of the communication plan
        (:func:`pipeline.metrics.communication_plan`), in one batch with the other messages of that step.

        Raises:
            ValueError: ``tensor`` is None; ``stage`` is not the neighbour the action sends to; nothing
                follows (the last virtual stage sends nothing forward, the first nothing back).
        """
        self.messages.post(tensor, stage)

    def recv(self, stage: int) -> torch.Tensor:
        """The tensor the rank of stage ``stage`` (modulo ``p``) handed over for the current action, on this
        rank's device: in a forward the current chunk's input (from ``stage_index - 1``), in a backward its
        output's gradient (from ``stage_index + 1``). It arrived in an earlier step's batch of the plan.

        It arrives as a leaf without ``requires_grad``: a stage that back-propagates into it
        must call ``.requires_grad_()`` on it before its forward, or its ``.grad`` stays None.

        Raises:
            ValueError: ``stage`` is not the neighbour the action receives from, or nothing comes (the
                first virtual stage receives no input, the last no gradient).
        """
        return self.messages.take(stage)

    # ---- executing ----------------------------------------------------------------------
    def compute_forward(self, i: int, x: torch.Tensor) -> torch.Tensor:
        """The stage's forward of micro-batch ``i`` (timed); on the last stage, its loss instead."""
        start = self.meter.start_timer()
        with self.meter.saved_tensors() as saved:  # course.saved_tensors: by storage, parameters excluded
            y = self.stage(x)
            if self.is_last:
                y = self.loss_fn(y, self.targets[i])
        self._record("F", i, start)
        if self.is_last:
            self.result.losses[i] = y.detach()  # made floats at the end of run(): no host sync per micro-batch
        self.meter.hold((self.chunk, i), saved.activation_bytes)
        self._inputs[(self.chunk, i)] = x
        return y

    def compute_backward(self, i: int, y: torch.Tensor, grad: torch.Tensor | None) -> None:
        """Back-propagate ``grad`` (None on the last stage: ``y`` is the loss) through micro-batch ``i`` (timed).

        With a split backward (the action list has ``W`` actions), only the input's
        gradient: :meth:`compute_input_grad`; the weights wait for :meth:`backward_weight_step`."""
        key = (self.chunk, i)
        x = self._inputs.pop(key)
        start = self.meter.start_timer()
        if self._split and not self._whole:
            self.compute_input_grad(x, y, grad)
            self._deferred[key] = (y, grad)
        else:
            torch.autograd.backward(y, grad)
            self.meter.release(key)
        self._record("BW" if self._whole else "B", i, start)

    def compute_input_grad(self, x: torch.Tensor, y: torch.Tensor, grad: torch.Tensor | None) -> None:
        """The gradient of ``y`` (the loss on the last stage, else the output, with ``grad`` its
        gradient) with respect to the input ``x`` only, into ``x.grad``; the graph is kept for the
        weight gradients. Nothing to do if ``x`` does not require grad (the first stage's token ids)."""
        # BEGIN ASSIGN5_2_6
        if x.requires_grad:
            (x.grad,) = torch.autograd.grad(y, (x,), grad, retain_graph=True)
        # END ASSIGN5_2_6

    def backward_weight_step(self, i: int) -> None:
        """``("W", i)``: the weight gradients of micro-batch ``i`` on the current chunk, accumulated into
        the chunk's parameters' ``.grad``, from the output and output gradient kept by its ``B``
        (``self._deferred[(chunk, i)]``, removed); frees its graph and saved activations (timed).

        Raises:
            ValueError: ``W`` before the micro-batch's ``B``.
        """
        key = (self.chunk, i)
        if key not in self._deferred:
            raise ValueError(f"W of micro-batch {i} (chunk {self.chunk}) before its B")
        start = self.meter.start_timer()
        # BEGIN ASSIGN5_2_6
        y, grad = self._deferred.pop(key)
        params = [p for p in self.stage.parameters() if p.requires_grad]
        torch.autograd.backward(y, grad, inputs=params)
        # END ASSIGN5_2_6
        self._record("W", i, start)
        self.meter.release(key)

    def _record(self, kind: str, i: int, start: float | None) -> None:
        self.meter.record(kind, i, start, self.chunk or 0, self.virtual_stage)

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

    def run(self, actions: list[tuple], inputs: list | None = None,
            targets: list | None = None) -> StepResult:
        """Run ``actions`` (e.g. ``one_f_one_b_actions(stage_index, p, m)``) for one batch.

        An action is ``(kind, micro-batch)`` or ``(kind, micro-batch, chunk)``; kind ``"F"``,
        ``"B"``, ``"W"`` (a list with ``W`` actions splits the backward, see the module docstring) or ``"BW"``
        (a whole backward in such a list); or a pair ``("F&B", forward, backward)``, run forward first.

        Args:
            inputs: first stage: the ``m`` micro-batch inputs (e.g. input_ids (mb, seq)).
            targets: last stage: the ``m`` micro-batch targets for ``loss_fn``.

        Gradients are accumulated into the stage's ``.grad`` (zero them before, step after).

        Raises:
            ValueError: an unknown action kind or chunk; the first stage without ``inputs``;
                weight gradients (``W``) missing at the end of the list.
        """
        actions = flatten_pairs(actions)  # a pair ("F&B", forward, backward) runs as its two actions
        self.chunk = None
        if self.is_first and inputs is None:
            raise ValueError("the first stage needs the micro-batch inputs")
        self.inputs, self.targets = inputs, targets
        self._in_flight: list[dict] = [{} for _ in self.chunks]
        self._inputs: dict = {}
        self._deferred: dict = {}
        self._split = any(a[0] == "W" for a in actions)
        self.messages.start()
        self.result = self.meter.start()  # timed or not: the same for every action of the step
        plan = self.messages.plan(actions)
        batches = sorted(plan["batches"].items())
        try:
            for action, step in zip(actions, plan["steps"]):
                kind, i = action[0], action[1]
                chunk = action[2] if len(action) > 2 else 0
                if not 0 <= chunk < self.virtual_stages:
                    raise ValueError(f"action {action} names chunk {chunk}, but this rank has {self.virtual_stages}")
                while batches and batches[0][0] < step:  # what earlier steps hand over, before this action
                    self.messages.communicate(batches.pop(0)[1])
                self.chunk = chunk
                self.messages.at("B" if kind == "BW" else kind, i, self.virtual_stage)
                self._whole = kind == "BW"
                if kind == "F":
                    self.forward_step(i)
                elif kind in ("B", "BW"):
                    self.backward_step(i)
                elif kind == "W":
                    self.backward_weight_step(i)
                else:
                    raise ValueError(f"unknown action {kind!r} (use 'F', 'B', 'BW' or 'W')")
                self.meter.count(sum(len(d) for d in self._in_flight) + len(self._deferred))
            self.chunk = None
            for _, ops in batches:
                self.messages.communicate(ops)
        finally:
            self.chunk, self._whole = None, False
        self.meter.finish()
        if self._deferred:
            raise ValueError(f"the weight gradients (W) of {sorted(self._deferred)} (chunk, micro-batch) never ran: "
                             "every W must run within the step, before the optimizer step")
        self.messages.check_delivered()
        return self.result
