"""The measuring of a pipeline stage: its steps' times, micro-batches in flight and activation bytes.

A :class:`pipeline.stage_runner.StageRunner` owns one :class:`StageMeter`. It measures what the
notebook draws: the start and end of every forward, backward and weight-gradient step (seconds since
a common origin, :func:`common_clock_origin`; the time spent waiting for a neighbour is not inside
these intervals), the micro-batches in flight (forwarded but not yet backwarded) and the bytes of
activations saved for backward (:class:`course.saved_tensors.SavedTensorBytes`). Each step is one
span of the course's event recorder (:mod:`course.trace`, row ``compute``): ``StepResult.events`` are
those spans on the origin's scale, and any active recorder gets them too.

Reading the clock (:func:`course.measure.now`) synchronises a GPU before and after every step, which
costs the overlap of host and device: a meter built with ``timed=False`` reads it only while an event
recorder is active — otherwise its steps run untimed and ``StepResult.events`` is empty.

Source: Narayanan et al. 2021, Megatron-LM, Sec. 2.2 (the pipeline bubble these timelines show).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from course import trace
from course.collectives import global_rank
from course.measure import cpu_seconds, now, timer_name
from course.saved_tensors import SavedTensorBytes


@dataclass
class StepResult:
    """What one :meth:`pipeline.stage_runner.StageRunner.run` measured on one rank.

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

    def timeline(self, stage: int, column: str) -> list[dict]:
        """The events as a results file's timeline rows: ``{"stage", "kind", "micro_batch", "start", "end",
        column}``, one per event, ``column`` ``"chunk"`` (from :attr:`event_chunks`) or ``"cpu_s"``
        (:attr:`event_cpu_s`).

        Raises:
            KeyError: another ``column``.
        """
        values = {"chunk": self.event_chunks, "cpu_s": self.event_cpu_s}[column]
        return [{"stage": stage, "kind": k, "micro_batch": i, "start": a, "end": b, column: v}
                for (k, i, a, b), v in zip(self.events, values)]


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


class StageMeter:
    """Times one rank's steps and counts its micro-batches in flight and saved activation bytes.

    Args:
        device: this rank's device (its clock, :func:`course.measure.now`).
        parameters: the stage's parameters (left out of the saved activation bytes).
        virtual_stages: this rank's chunks (a span is named ``F3.1`` with several, ``F3`` with one).
        timed: time every step; False: only while an event recorder is active (:func:`course.trace.active`).
            Settable later (attribute ``timed``).
        group: the pipeline's process group, whose first rank's clock is the origin.

    Attributes:
        origin: the common time origin (:func:`common_clock_origin`) of the recorded events.
        result: the :class:`StepResult` of the step being measured (:meth:`start`).

    The constructor is collective in ``group`` (:func:`common_clock_origin`).
    """

    def __init__(self, device: torch.device, parameters, virtual_stages: int, timed: bool = True, group=None):
        self.device, self.virtual_stages, self.timed, self.timing = device, virtual_stages, timed, timed
        self._parameters = list(parameters)  # not activations
        self._activation_bytes: dict = {}
        self.result = StepResult(timer=timer_name(device))
        self.origin = common_clock_origin(device, group)

    def start(self) -> StepResult:
        """A new step: an empty :class:`StepResult` (returned, and kept as :attr:`result`); whether its
        steps are timed is decided here, the same for every action of the step."""
        self.result = StepResult(timer=timer_name(self.device))
        self._activation_bytes = {}
        self.timing = self.timed or trace.active()
        return self.result

    def saved_tensors(self) -> SavedTensorBytes:
        """A context that counts the bytes saved for backward inside it (by storage, parameters excluded)."""
        return SavedTensorBytes(exclude=self._parameters)

    def hold(self, key, nbytes: int) -> None:
        """The activations of ``key`` (``(chunk, micro-batch)``) take ``nbytes`` until :meth:`release`."""
        self._activation_bytes[key] = nbytes

    def release(self, key) -> None:
        """The activations of ``key`` are freed (nothing if none are held)."""
        self._activation_bytes.pop(key, None)

    def start_timer(self) -> float | None:
        """The clock at the start of a step, or None if this step is not timed (no clock read, nothing waited for)."""
        if not self.timing:
            return None
        start = now(self.device)  # course.measure: on a GPU, after the work queued before has run
        self._cpu_start = cpu_seconds()
        return start

    def record(self, kind: str, i: int, start: float | None, chunk: int, stage: int) -> None:
        """The step ``kind`` of micro-batch ``i`` on ``chunk`` (virtual stage ``stage``) that started at ``start``
        (:meth:`start_timer`) ends now: a span of the recorder and an event of :attr:`result`."""
        if start is None:  # untimed (see timed)
            return
        end = now(self.device)  # ... and after this event's kernels have run
        cpu = cpu_seconds() - self._cpu_start
        span = trace.record(f"{kind}{i}" if self.virtual_stages == 1 else f"{kind}{i}.{chunk}", "compute", start, end,
                            kind=kind, micro_batch=i, chunk=chunk, stage=stage, cpu_s=cpu)
        self.result.events.append((kind, i, span.start - self.origin, span.end - self.origin))
        self.result.event_chunks.append(chunk)
        self.result.event_cpu_s.append(cpu)

    def count(self, in_flight: int) -> None:
        """After an action: ``in_flight`` micro-batches forwarded and not yet done; raise the peaks."""
        self.result.peak_in_flight = max(self.result.peak_in_flight, in_flight)
        self.result.peak_activation_bytes = max(self.result.peak_activation_bytes, sum(self._activation_bytes.values()))

    def finish(self) -> StepResult:
        """The step's losses made floats (one host sync per step, not per micro-batch); returns :attr:`result`."""
        self.result.losses = {i: float(loss) for i, loss in self.result.losses.items()}
        return self.result
