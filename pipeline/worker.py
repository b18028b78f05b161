"""Per-stage worker threads of the single-process pipeline (torchgpipe's design).

Each stage gets one worker thread with an input queue and an output queue. The
caller puts a :class:`Task` on a stage's input queue; the worker runs it and puts
``(True, (task, output))`` — or ``(False, exc_info)`` if the task raised — on the
output queue. Because every stage has its own thread, the tasks of one clock cycle
run at the same time: on GPUs each on its own device; on a CPU the threads share the
cores (PyTorch releases the GIL inside its kernels, so two stages can overlap, but two
CPU cores are all they have between them).

One thread per *stage* (not per device, as in torchgpipe) so that several stages on
the same ``cpu`` device still run concurrently. The threads are started once and
reused for every forward (starting threads per batch would also start new OpenMP
thread teams each time).

Source: Kim et al. 2020, torchgpipe, Sec. 3.2.2 (one worker thread per device).
"""
from __future__ import annotations

import sys
import threading
import time
from queue import Queue
from typing import Any, Callable

import torch


class Task:
    """A unit of work for a stage: ``compute()`` returns ``fn()``.

    The autograd mode of the thread that creates the task (``torch.is_grad_enabled()``)
    is recorded and used by the worker thread, since grad mode is per thread in PyTorch.
    """

    def __init__(self, fn: Callable[[], Any]):
        self.fn = fn
        self.grad_enabled = torch.is_grad_enabled()

    def compute(self) -> Any:
        with torch.set_grad_enabled(self.grad_enabled):
            return self.fn()


class Recorder:
    """Where workers log ``(stage, start_s, end_s)`` (``time.perf_counter``) of each task; ``log=None``: off."""

    def __init__(self):
        self.log: list | None = None


def worker(in_queue: Queue, out_queue: Queue, device: torch.device, stage: int = 0,
           recorder: Recorder | None = None) -> None:
    """Run tasks from ``in_queue`` until it yields ``None``; report each outcome on ``out_queue``."""
    device = torch.device(device)
    while True:
        task = in_queue.get()
        if task is None:
            break
        if device.type == "cuda" and recorder is not None and recorder.log is not None:
            torch.cuda.synchronize(device)  # course.measure: read the clock once the queued work has run
        start = time.perf_counter()
        try:
            if device.type == "cuda":
                with torch.cuda.device(device):
                    output = task.compute()
            else:
                output = task.compute()
        except Exception:  # noqa: BLE001 - re-raised in the caller's thread
            out_queue.put((False, sys.exc_info()))
            continue
        log = recorder.log if recorder is not None else None
        if log is not None:
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            log.append((stage, start, time.perf_counter()))
        out_queue.put((True, (task, output)))


class StageWorkers:
    """One daemon worker thread per stage, with its ``in_queues[j]`` and ``out_queues[j]``.

    Args:
        devices: the device of each stage (repeats allowed).
    """

    def __init__(self, devices: list[torch.device]):
        self.in_queues: list[Queue] = [Queue() for _ in devices]
        self.out_queues: list[Queue] = [Queue() for _ in devices]
        self.recorder = Recorder()
        self.threads = [threading.Thread(target=worker, args=(inq, outq, dev, j, self.recorder), daemon=True,
                                         name=f"pipe-stage{j}")
                        for j, (inq, outq, dev) in enumerate(zip(self.in_queues, self.out_queues, devices))]
        for t in self.threads:
            t.start()

    def close(self) -> None:
        """Stop the threads (each finishes its current task first)."""
        for q in self.in_queues:
            q.put(None)
        for t in self.threads:
            if t is not threading.current_thread():
                t.join(timeout=30)
