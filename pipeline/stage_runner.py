"""A multi-process pipeline: each rank owns one stage and runs its schedule's action list.

Inside a worker started by :func:`course.launch.launch`, the rank at stage ``s`` of ``p``
(its rank in the pipeline's process group, the ``pp`` group of the run's mesh) builds its
stage (an ``nn.Module``) and a :class:`StageRunner`, then for every training step calls
:meth:`StageRunner.run` with its action list (:mod:`pipeline.schedules`). Activations
go forward to stage s + 1 and their gradients back to stage s - 1 by point-to-point
send/recv in the ``pp`` group (:mod:`pipeline.p2p`); a neighbour is addressed by its
global rank, ``dist.get_global_rank(pp_group, s ± 1)``.

**When messages travel.** A step's :meth:`send` does not send at once, and :meth:`recv` does not
wait: the runner gathers every rank's action list, lays them out on a common clock of unit steps
(:func:`pipeline.metrics.communication_plan`) and, between actions, carries out the batches of
that plan — every message leaves in one batch with the other messages of its step, and the rank
that consumes it receives it in its batch of the same step. That lock-step is what makes the
pipeline safe under NCCL's point-to-point rules (docs/architecture.md, "Point-to-point under
NCCL's rules"); a send that posted at once, followed by a blocking receive from the same
neighbour, would wait forever on GPUs where both neighbours do it. Gradients accumulate in the
stage's parameters over the micro-batches, exactly as in single-process training of the
same micro-batches, so the optimizer step after :meth:`run` is the same.

Several chunks per rank (interleaved 1F1B, Narayanan et al. 2021, Sec. 2.2.2): give the
runner a list of ``v`` modules; chunk ``c`` of the rank at stage ``s`` is virtual stage
``c * p + s`` of ``v * p``, and the actions name their chunk, ``(kind, micro-batch, chunk)``.
Before each step the runner makes that chunk current: :attr:`stage`, :attr:`is_first`,
:attr:`is_last` and :attr:`in_flight` then refer to it, and :meth:`send` / :meth:`recv`
address the neighbouring *virtual* stage (stage ``s ± 1`` taken modulo ``p``: the last
rank's chunk ``c`` feeds the first rank's chunk ``c + 1``). Messages are named by what consumes
them — ``("F", i, s)``, the input of micro-batch ``i`` on virtual stage ``s``; ``("B", i, s)``, the
gradient of that stage's output — and matched by their order in the plan's batches (NCCL has no
tags), so the activations and gradients of several chunks that travel between the same two ranks
cannot be mixed up.

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

The runner also measures what the notebook draws: the start and end of every forward
and backward (seconds since a common origin, :func:`common_clock_origin`; the time spent waiting
for a neighbour is not inside these intervals), the micro-batches in flight (forwarded
but not yet backwarded) and the bytes of activations saved for backward
(:class:`course.saved_tensors.SavedTensorBytes`). Each forward, backward and weight-gradient step is
one span of the course's event recorder (:mod:`course.trace`, row ``compute``): the runner's
``StepResult.events`` are those spans on the origin's scale, and any active recorder gets them too.
Reading the clock synchronises a GPU before and after every step, which costs the overlap of host and
device: a runner built with ``timed=False`` (a training mode's, ``three_d.training``) reads it only
while an event recorder is active — otherwise its steps run untimed and ``StepResult.events`` is empty.

Source: Narayanan et al. 2021, Megatron-LM, Sec. 2.2 (pipeline schedules) and 4.1.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import torch
import torch.distributed as dist
from torch import nn

from course import trace
from course.collectives import global_rank, group_rank, group_size
from course.measure import cpu_seconds, now, timer_name
from course.saved_tensors import SavedTensorBytes
from pipeline.metrics import communication_plan
from pipeline.p2p import exchange_tensors
from pipeline.placement import flatten_pairs, rank_of, stage_of


@dataclass
class StepResult:
    """What one :meth:`StageRunner.run` measured on one rank.

    Attributes:
        losses: ``{micro-batch: loss}`` (last stage only; float values of ``loss_fn``).
        events: ``[(kind, micro-batch, start_s, end_s)]``, kind ``"F"``, ``"B"`` or ``"W"``,
            seconds since the runner's common time origin (the spans the runner recorded,
            :mod:`course.trace`); empty for a step run untimed (``StageRunner(timed=False)`` with no
            recorder active).
        event_chunks: the chunk of each event (all 0 with one chunk per rank).
        event_cpu_s: the CPU seconds this process spent in each event (:func:`course.measure.cpu_seconds`,
            all its threads): the event's cost without the time it waited for a core, which
            :func:`pipeline.metrics.replay` uses to rebuild the timeline on dedicated cores.
            On a GPU it counts only the host's share; use the events' wall time there.
        peak_in_flight: most micro-batches forwarded and not yet backwarded at once.
        peak_activation_bytes: most bytes of tensors saved for backward at once
            (parameters excluded; counted by storage, the same measure on every device).
        timer: the clock of ``events`` (:func:`course.measure.timer_name`).
    """

    losses: dict = field(default_factory=dict)
    events: list = field(default_factory=list)
    event_chunks: list = field(default_factory=list)
    event_cpu_s: list = field(default_factory=list)
    peak_in_flight: int = 0
    peak_activation_bytes: int = 0
    timer: str = ""


def common_clock_origin(device: torch.device, group=None) -> float:
    """The wall-clock time (:func:`course.measure.now`, seconds) of ``group``'s first rank, taken after
    a barrier in ``group`` and broadcast to its ranks.

    Every rank measures its events as ``now(device) - origin`` (the clock read after the device's
    queued work has run, ``StepResult.timer``): on one machine all
    processes read the same clock, so their timelines line up exactly; across nodes they
    line up as well as the nodes' clocks are synchronised (NTP: about a millisecond).
    """
    if not dist.is_initialized():
        return now(device)
    dist.barrier(group=group)
    origin = torch.tensor([now(device)], dtype=torch.float64, device=device)
    dist.broadcast(origin, src=global_rank(group, 0), group=group)
    return float(origin.item())


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
        chunks, n_chunks: this rank's modules and their number ``v``.
        chunk: the chunk of the action being run (None outside :meth:`run`).
        is_first, is_last: the current chunk is the first / last virtual stage; outside
            :meth:`run`, this rank holds it (``s == 0``; ``s == last_rank``: ``p - 1``, or 0 with the V placement).
        placement, last_rank: where the chunks sit; the rank holding the last virtual stage (the loss).

    The constructor is collective in ``group`` (every stage must build its runner): it sets
    the common time origin of the recorded events (:func:`common_clock_origin`).
    """

    def __init__(self, stage: nn.Module, device: torch.device, loss_fn: Callable | None = None, group=None,
                 timed: bool = True, placement: str = "loop"):
        self.group, self.timed, self._timing = group, timed, timed
        self.placement = placement
        self.chunks = list(stage) if isinstance(stage, (list, tuple, nn.ModuleList)) else [stage]
        if not self.chunks:
            raise ValueError("a stage runner needs at least one chunk")
        self.n_chunks, self.chunk = len(self.chunks), None
        self.stage_index, self.n_stages = group_rank(group), group_size(group)
        if placement == "v" and self.n_chunks != 2:
            raise ValueError(f"the V placement runs two chunks per rank (stages r and 2p - 1 - r), got "
                             f"{self.n_chunks}; build them with pipeline.gpt2_stages.gpt2_chunks(..., placement='v')")
        self.device = torch.device(device)
        self._whole = False  # the current backward is a whole one ("BW") in a split list
        if self.is_last and loss_fn is None:
            raise ValueError("the last stage needs a loss_fn")
        self.loss_fn = loss_fn
        self._parameters = [p for c in self.chunks for p in c.parameters()]  # not activations
        self._kind, self._micro = "F", None
        self._plans: dict = {}
        self.origin = common_clock_origin(self.device, group)

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
        return rank_of(self.n_chunks * self.n_stages - 1, self.n_stages, self.placement)

    @property
    def is_first(self) -> bool:
        if self.chunk is None:
            return self.stage_index == 0
        return self.virtual_stage == 0

    @property
    def is_last(self) -> bool:
        if self.chunk is None:
            return self.stage_index == self.last_rank
        return self.virtual_stage == self.n_chunks * self.n_stages - 1

    @property
    def in_flight(self) -> dict:
        """The current chunk's ``{micro-batch: (input, output)}`` forwarded and not yet backwarded."""
        return self._in_flight[self.chunk or 0]

    # ---- helpers the steps call -------------------------------------------------------
    def _neighbour(self, stage: int, direction: str) -> int:
        """The virtual stage that ``stage`` names for the current action; checks it is the right neighbour."""
        step = 1 if (self._kind == "F") == (direction == "send") else -1
        expected = self.stage_index + step
        if stage % self.n_stages != expected % self.n_stages:
            verb = "sends to" if direction == "send" else "receives from"
            raise ValueError(f"in a {'forward' if self._kind == 'F' else 'backward'}, stage {self.stage_index} "
                             f"{verb} stage {expected}, not {stage}")
        return self.virtual_stage + step

    def send(self, tensor: torch.Tensor, stage: int) -> None:
        """Hand ``tensor`` over to the rank of stage ``stage``: ``stage_index + 1`` in a forward (to the
        next virtual stage), ``stage_index - 1`` in a backward (to the previous one), taken modulo ``p``.

        It leaves at this action's step of the communication plan
        (:func:`pipeline.metrics.communication_plan`), in one batch with the other messages of that step.

        Raises:
            ValueError: ``tensor`` is None; ``stage`` is not the neighbour the action sends to; nothing
                follows (the last virtual stage sends nothing forward, the first nothing back).
        """
        if tensor is None:  # the usual cause: the received activation was not made to require grad
            raise ValueError(f"stage {self.stage_index} was asked to send None to stage {stage}: in a backward this is "
                             "the input's .grad, which stays None when the activation received in the forward was "
                             "not made to require grad — call .requires_grad_() on what recv() returns (see recv)")
        target = self._neighbour(stage, "send")
        if not 0 <= target < self.n_chunks * self.n_stages:
            raise ValueError(f"virtual stage {self.virtual_stage} is the {'last' if self._kind == 'F' else 'first'} "
                             f"one: its {'forward' if self._kind == 'F' else 'backward'} sends nothing")
        message = (self._kind, self._micro, target)
        if rank_of(target, self.n_stages, self.placement) == self.stage_index:  # the next chunk is on this rank
            self._mailbox[message] = tensor.detach()
        else:
            self._outbox[message] = tensor

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
        self._neighbour(stage, "recv")
        message = (self._kind, self._micro, self.virtual_stage)
        if message not in self._mailbox:
            raise ValueError(f"nothing comes to virtual stage {self.virtual_stage} for {self._kind}{self._micro}: the "
                             f"{'first' if self._kind == 'F' else 'last'} virtual stage "
                             f"{'takes its input from the data' if self._kind == 'F' else 'starts from its loss'}")
        return self._mailbox.pop(message)

    def _communicate(self, ops: list[tuple]) -> None:
        """Carry out one batch of the plan: send what this rank's actions handed over, receive what comes."""
        sends, sources, names = [], [], []
        for kind, peer, message in ops:
            if kind == "send":
                if message not in self._outbox:
                    what = "output" if message[0] == "F" else "input's gradient"
                    raise ValueError(f"{'F' if message[0] == 'F' else 'B'}{message[1]} of this rank should have sent "
                                     f"its {what} to virtual stage {message[2]} (call send() in the step)")
                sends.append((self._outbox.pop(message), global_rank(self.group, peer)))
            else:
                sources.append(global_rank(self.group, peer))
                names.append(message)
        for message, tensor in zip(names, exchange_tensors(sends, sources, self.device, self.group)):
            self._mailbox[message] = tensor

    def compute_forward(self, i: int, x: torch.Tensor) -> torch.Tensor:
        """The stage's forward of micro-batch ``i`` (timed); on the last stage, its loss instead."""
        start = self._start_timer()
        with SavedTensorBytes(exclude=self._parameters) as saved:  # course.saved_tensors: by storage
            y = self.stage(x)
            if self.is_last:
                y = self.loss_fn(y, self.targets[i])
        self._record("F", i, start)
        if self.is_last:
            self.result.losses[i] = y.detach()  # made floats at the end of run(): no host sync per micro-batch
        self._activation_bytes[(self.chunk, i)] = saved.activation_bytes
        self._inputs[(self.chunk, i)] = x
        return y

    def compute_backward(self, i: int, y: torch.Tensor, grad: torch.Tensor | None) -> None:
        """Back-propagate ``grad`` (None on the last stage: ``y`` is the loss) through micro-batch ``i`` (timed).

        With a split backward (the action list has ``W`` actions), only the input's
        gradient: :meth:`compute_input_grad`; the weights wait for :meth:`backward_weight_step`."""
        key = (self.chunk, i)
        x = self._inputs.pop(key)
        start = self._start_timer()
        if self._split and not self._whole:
            self.compute_input_grad(x, y, grad)
            self._deferred[key] = (y, grad)
        else:
            torch.autograd.backward(y, grad)
            self._activation_bytes.pop(key, None)
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
        start = self._start_timer()
        # BEGIN ASSIGN5_2_6
        y, grad = self._deferred.pop(key)
        params = [p for p in self.stage.parameters() if p.requires_grad]
        torch.autograd.backward(y, grad, inputs=params)
        # END ASSIGN5_2_6
        self._record("W", i, start)
        self._activation_bytes.pop(key, None)

    def _start_timer(self) -> float | None:
        """The clock at the start of a step, or None if this step is not timed (no clock read, nothing waited for)."""
        if not self._timing:
            return None
        start = now(self.device)  # course.measure: on a GPU, after the work queued before has run
        self._cpu_start = cpu_seconds()
        return start

    def _record(self, kind: str, i: int, start: float | None) -> None:
        if start is None:  # untimed (see timed)
            return
        end = now(self.device)  # ... and after this event's kernels have run
        chunk, cpu = self.chunk or 0, cpu_seconds() - self._cpu_start
        span = trace.record(f"{kind}{i}" if self.n_chunks == 1 else f"{kind}{i}.{chunk}", "compute", start, end,
                            kind=kind, micro_batch=i, chunk=chunk, stage=self.virtual_stage, cpu_s=cpu)
        self.result.events.append((kind, i, span.start - self.origin, span.end - self.origin))
        self.result.event_chunks.append(chunk)
        self.result.event_cpu_s.append(cpu)

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

    def _plan(self, actions: list[tuple]) -> dict:
        """This rank's part of the communication plan of every rank's ``actions`` (gathered in the group)."""
        if group_size(self.group) == 1:
            everyone = [list(actions)]
        else:
            everyone = [None] * self.n_stages
            dist.all_gather_object(everyone, list(actions), group=self.group)
        key = tuple(tuple(map(tuple, a)) for a in everyone)
        if key not in self._plans:
            self._plans = {key: communication_plan([list(map(tuple, a)) for a in everyone], self.placement)}
        return self._plans[key][self.stage_index]

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
        self._activation_bytes: dict = {}
        self._outbox: dict = {}
        self._mailbox: dict = {}
        self._micro = None
        self.result = StepResult(timer=timer_name(self.device))
        self._timing = self.timed or trace.active()  # the same for every action of the step
        plan = self._plan(actions)
        batches = sorted(plan["batches"].items())
        try:
            for action, step in zip(actions, plan["steps"]):
                kind, i = action[0], action[1]
                chunk = action[2] if len(action) > 2 else 0
                if not 0 <= chunk < self.n_chunks:
                    raise ValueError(f"action {action} names chunk {chunk}, but this rank has {self.n_chunks}")
                while batches and batches[0][0] < step:  # what earlier steps hand over, before this action
                    self._communicate(batches.pop(0)[1])
                self.chunk, self._kind, self._micro = chunk, ("B" if kind == "BW" else kind), i
                self._whole = kind == "BW"
                if kind == "F":
                    self.forward_step(i)
                elif kind in ("B", "BW"):
                    self.backward_step(i)
                elif kind == "W":
                    self.backward_weight_step(i)
                else:
                    raise ValueError(f"unknown action {kind!r} (use 'F', 'B', 'BW' or 'W')")
                live = sum(len(d) for d in self._in_flight) + len(self._deferred)
                self.result.peak_in_flight = max(self.result.peak_in_flight, live)
                self.result.peak_activation_bytes = max(self.result.peak_activation_bytes,
                                                        sum(self._activation_bytes.values()))
            self.chunk = None
            for _, ops in batches:
                self._communicate(ops)
        finally:
            self.chunk, self._whole = None, False
        self.result.losses = {i: float(loss) for i, loss in self.result.losses.items()}
        if self._deferred:
            raise ValueError(f"the weight gradients (W) of {sorted(self._deferred)} (chunk, micro-batch) never ran: "
                             "every W must run within the step, before the optimizer step")
        if self._outbox:
            raise ValueError(f"messages {sorted(self._outbox)} were sent but no step of the plan carries them")
        return self.result
