"""``Pipe``: a single-process pipeline over per-stage worker threads (GPipe forward schedule).

The batch is cut into micro-batches of ``split_size`` rows; the micro-batches flow through
the stages following the clock-cycle schedule (:func:`pipeline.clock_cycles.clock_cycles`);
in each clock cycle every busy stage works on its own micro-batch at the same time,
each in its own worker thread (:mod:`pipeline.worker`). Autograd records the whole
pipelined forward, so ``loss.backward()`` on the output gives the same gradients as
the un-piped model (the backward pass itself is not pipelined here: PyTorch's autograd
engine runs it).

Source: Huang et al. 2019, GPipe, Sec. 2.2; Kim et al. 2020, torchgpipe, Sec. 3.
"""
from __future__ import annotations

import weakref

import torch
from torch import nn

from pipeline.partition import place, split_module
from pipeline.clock_cycles import clock_cycles
from pipeline.worker import StageWorkers, Task


def _run_stage(partition: nn.Module, batch: torch.Tensor, device: torch.device) -> torch.Tensor:
    """Move ``batch`` to the stage's ``device`` (autograd records the copy) and run the stage."""
    return partition(batch.to(device))


class Pipe(nn.Module):
    """Run an ``nn.Sequential`` as a pipeline of stages.

    Args:
        module: the model as an ``nn.Sequential`` of layers.
        split_size: micro-batch size (rows per micro-batch, >= 1). A batch of B rows
            becomes ``ceil(B / split_size)`` micro-batches; the last may be smaller.
        devices: optional device of each stage, repeats allowed (``["cpu", "cpu"]``
            makes two stages on one CPU). The layers are moved there.
        balance: optional layers per stage (sum = number of layers). Without
            ``devices`` nor ``balance``, stages follow the layers' devices
            (:func:`pipeline.partition.split_module`).

    Shapes:
        ``forward(x)``: x is (B, ...) ; returns (B, ...) on the last stage's device.

    Threads: one worker thread per stage (:class:`pipeline.worker.StageWorkers`), started at
    the first ``forward`` and reused; they stop when the ``Pipe`` is garbage-collected (or
    after a stage raised). On a CPU the stage threads share the machine's cores.

    Raises:
        ValueError: ``split_size`` < 1; a bad ``balance``/``devices``.
    """

    def __init__(self, module: nn.Sequential, split_size: int = 1, *, devices: list | None = None,
                 balance: list[int] | None = None):
        super().__init__()
        if not isinstance(split_size, int) or isinstance(split_size, bool) or split_size < 1:
            raise ValueError(f"split_size is the micro-batch size and must be a whole number >= 1, not {split_size!r}")
        if devices is not None:
            module, balance = place(module, list(devices), balance)
        partitions, stage_devices = split_module(module, balance)
        self.split_size = split_size
        self.partitions = nn.ModuleList(partitions)
        self.devices = stage_devices
        self.in_queues: list = []
        self.out_queues: list = []
        self.record_timeline = False
        self._log: list | None = None
        self._workers: StageWorkers | None = None

    def _start_workers(self) -> None:
        """Start the stage workers on first use; expose their queues as ``in_queues``/``out_queues``."""
        if self._workers is None:
            self._workers = StageWorkers(self.devices)
            weakref.finalize(self, self._workers.close)
        self.in_queues, self.out_queues = self._workers.in_queues, self._workers.out_queues
        self._log = [] if self.record_timeline else None
        self._workers.task_log.log = self._log

    def _stop_workers(self) -> None:
        """Stop the workers (after an error: results of the failed clock cycle may still be queued)."""
        if self._workers is not None:
            self._workers.close()
            self._workers = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Split ``x`` (B, ...) into micro-batches, run every clock cycle, concatenate the outputs.

        Returns:
            (B, ...) on ``self.devices[-1]``, rows in the order of ``x``.
        """
        self._start_workers()
        try:
            # BEGIN ASSIGN5_2_2
            batches = list(torch.split(x, self.split_size, dim=0))
            for schedule in clock_cycles(len(batches), len(self.partitions)):
                self.compute(batches, schedule)
            return torch.cat(batches, dim=0)
            # END ASSIGN5_2_2
        except BaseException:
            self._stop_workers()
            raise

    def compute(self, batches: list[torch.Tensor], schedule: list[tuple[int, int]]) -> None:
        """Run one clock cycle: every task ``(i, j)`` of ``schedule`` on stage ``j``'s worker.

        Puts every task on its stage's input queue before waiting for any result, so the
        stages of one clock cycle run concurrently; then replaces ``batches[i]`` with
        stage ``j``'s output.

        Raises:
            The exception of a stage that raised, re-raised in the caller's thread.
        """
        partitions, devices = self.partitions, self.devices
        # BEGIN ASSIGN5_2_2
        for i, j in schedule:
            batch, partition, device = batches[i], partitions[j], devices[j]
            self.in_queues[j].put(Task(lambda p=partition, b=batch, d=device: _run_stage(p, b, d)))
        for i, j in schedule:
            ok, payload = self.out_queues[j].get()
            if not ok:
                _, exc, traceback = payload
                raise exc.with_traceback(traceback)
            _, output = payload
            batches[i] = output
        # END ASSIGN5_2_2

    @property
    def timeline_origin(self) -> float | None:
        """When the first task of the last ``forward`` started (seconds, :func:`course.measure.now`'s clock)."""
        return min(start for _, start, _ in self._log) if self._log else None

    @property
    def timeline(self) -> list[tuple[int, str, int, float, float]]:
        """Stage tasks of the last ``forward`` when ``record_timeline`` is True:
        ``[(stage, "F", micro-batch, start_s, end_s)]``, seconds since the first task started
        (:attr:`timeline_origin`; the clock of :func:`course.measure.now`, as every span of the course).
        A stage runs its micro-batches in order, so the n-th task of a stage is micro-batch n.
        """
        if not self._log:
            return []
        origin = self.timeline_origin
        seen = [0] * len(self.devices)
        events = []
        for stage, start, end in sorted(self._log, key=lambda e: e[1]):
            events.append((stage, "F", seen[stage], start - origin, end - origin))
            seen[stage] += 1
        return events
