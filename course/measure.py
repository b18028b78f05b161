"""One timer and one memory meter that are right on every device (docs/architecture.md, "Measuring on GPUs").

A GPU runs its kernels, NCCL's included, asynchronously: a call returns once its work is *queued*. So
the host clock read after a CUDA call measures the time to queue it, and process memory (RSS) says
nothing about the GPU's. What the course reads instead:

* **time**: :func:`now` — the wall clock (``time.time()``, seconds; comparable between the processes
  of one machine, and across nodes as far as their clocks agree) read **after**
  ``torch.cuda.synchronize(device)`` on a CUDA device, so everything queued before has finished
  (communication included: a collective's ``wait()`` puts its completion on the device's stream).
  :class:`Stopwatch` times a block with it. On the CPU the clock is read as it is. Where waiting
  would change what is measured (communication meant to overlap the backward pass), :func:`stamp`
  takes a CUDA event instead and :func:`seconds` reads it afterwards on the same scale.
  :func:`timer_name` says which was used (``"host-clock"`` or ``"host-clock+cuda-sync"``). ``device`` may
  also be a list of devices — the GPUs of a one-process pipeline (``pipeline.training``, stage s on
  ``cuda:s``) — and then every one of them is synchronised before the clock is read.
  :func:`cpu_seconds` is not a clock but a cost: the CPU seconds this process has used (all its threads),
  which leave out the time it waited for a core — what a machine with more ranks than cores needs to
  rebuild a timeline as if each rank had a core of its own (``pipeline.metrics.replay``).
* **memory**: :class:`MemoryMeter` — on CUDA the peak of ``torch.cuda.max_memory_allocated`` during
  the block (the counter is reset when the block starts), on the CPU the process's peak resident set
  size (``ru_maxrss``, which cannot be reset: the peak since the process started).
  :func:`memory_name` says which. Given a list of devices, the meter reports each GPU's peak
  (``peak_bytes_by_device``) and the largest (``peak_bytes``, on ``peak_device``). The bytes of tensors autograd saves for the backward pass
  (:class:`course.saved_tensors.SavedTensorBytes`, used by ``pipeline.StageRunner``, the memory and the
  tensor-parallel parts) are counted by storage and mean the same on both devices.

Spans of a run on this clock (compute, communication, steps) are kept by the one event recorder,
:mod:`course.trace`; repeated measurements (warm-up, repeats, median and spread) by the one benchmark
harness, :mod:`course.benchmarking`.

Synchronising costs the overlap between host and device it waits for: use these where a result is
measured (timelines, benchmarks, epoch times), not inside code that is meant to overlap.
"""
from __future__ import annotations

import resource
import sys
import time

import torch

HOST_CLOCK = "host-clock"
SYNCED_CLOCK = "host-clock+cuda-sync"
HOST_MEMORY = "peak RSS (ru_maxrss, since the process started)"
CUDA_MEMORY = "torch.cuda.max_memory_allocated (reset per measurement)"


def _cuda(device) -> torch.device | None:
    if device is None:
        return None
    device = torch.device(device)
    return device if device.type == "cuda" else None


def _cudas(devices) -> list[torch.device]:
    """The CUDA devices of ``devices`` (one device, None, or a list or tuple of devices), each once, in order."""
    found = []
    for device in devices if isinstance(devices, (list, tuple)) else [devices]:
        cuda = _cuda(device)
        if cuda is not None and cuda not in found:
            found.append(cuda)
    return found


def synchronize(device=None) -> None:
    """Wait until everything queued on ``device`` (a device, or a list of devices: each of them) has run
    (nothing to wait for on the CPU)."""
    for cuda in _cudas(device):
        torch.cuda.synchronize(cuda)


def now(device=None) -> float:
    """Seconds on the wall clock (``time.time()``), read after :func:`synchronize` of ``device`` (a device or a
    list of devices)."""
    synchronize(device)
    return time.time()


def cpu_seconds() -> float:
    """CPU seconds this process has used so far, all its threads (``time.process_time``). A cost, not a
    clock: differences of two readings say how much CPU a piece of work took, not when it ran. On a GPU it
    counts only the host's share."""
    return time.process_time()


def timer_name(device=None) -> str:
    """What :func:`now` measures on ``device``: ``"host-clock"`` or ``"host-clock+cuda-sync"``."""
    return SYNCED_CLOCK if _cudas(device) else HOST_CLOCK


class Stopwatch:
    """Seconds a block takes on ``device`` (``with Stopwatch(device) as sw: ...; sw.seconds``).

    The clock is read after synchronising the device at the start and at the end, so the time is
    that of the work the block queued, not of queueing it; ``start``/``end`` are :func:`now` readings.
    ``lap()`` gives the seconds since the start (synchronising again) without ending the block.
    """

    def __init__(self, device=None):
        self.device = device
        self.start = self.end = None
        self.timer = timer_name(device)

    def __enter__(self) -> "Stopwatch":
        self.start = now(self.device)
        return self

    def lap(self) -> float:
        return now(self.device) - self.start

    def __exit__(self, *exc) -> None:
        self.end = now(self.device)

    @property
    def seconds(self) -> float:
        if self.start is None or self.end is None:
            raise RuntimeError("Stopwatch.seconds is known once the with block has ended")
        return self.end - self.start


class _Reference:
    """A CUDA event recorded at a known wall-clock time: what :func:`seconds` measures stamps from."""

    def __init__(self, device: torch.device):
        torch.cuda.synchronize(device)
        self.event = torch.cuda.Event(enable_timing=True)
        self.event.record(torch.cuda.current_stream(device))
        torch.cuda.synchronize(device)
        self.time = time.time()


_REFERENCES: dict = {}


def stamp(device=None):
    """A point in time taken **without** waiting for the device: on a GPU a CUDA event recorded on the
    current stream (it completes when the work queued before it has run), on the CPU the wall clock.
    Read it later with :func:`seconds`. For timelines of work that must keep overlapping while it is
    measured (a gradient bucket's all-reduce during the backward pass), where :func:`now` would wait."""
    cuda = _cuda(device)
    if cuda is None:
        return time.time()
    if cuda not in _REFERENCES:
        _REFERENCES[cuda] = _Reference(cuda)
    event = torch.cuda.Event(enable_timing=True)
    event.record(torch.cuda.current_stream(cuda))
    return cuda, event


def seconds(point) -> float:
    """The wall-clock time (seconds, the scale of :func:`now`) of a :func:`stamp` (waits for its event)."""
    if isinstance(point, float):
        return point
    cuda, event = point
    event.synchronize()
    reference = _REFERENCES[cuda]
    return reference.time + reference.event.elapsed_time(event) / 1e3


def peak_rss_bytes() -> int:
    """This process's peak resident set size in bytes (``ru_maxrss``: KiB on Linux, bytes on macOS)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak if sys.platform == "darwin" else peak * 1024)


def memory_name(device=None) -> str:
    """What :class:`MemoryMeter` measures on ``device``."""
    return CUDA_MEMORY if _cudas(device) else HOST_MEMORY


class MemoryMeter:
    """The peak memory of a block on ``device`` (``with MemoryMeter(device) as m: ...; m.peak_bytes``).

    CUDA: ``torch.cuda.max_memory_allocated`` after ``reset_peak_memory_stats`` at the start — the
    most bytes of tensors allocated at once during the block (``start_bytes`` were allocated when it
    began). CPU: the process's peak RSS when the block ends (it includes the interpreter and the
    libraries, and it is never reset). ``measure`` names which (:func:`memory_name`).

    ``device`` may be a list of devices (a one-process pipeline's stages): each GPU is measured on its
    own, ``peak_bytes_by_device`` / ``start_bytes_by_device`` map ``"cuda:s"`` to its bytes, and
    ``peak_bytes`` is the largest of them, reached on ``peak_device`` (``start_bytes`` that device's).
    On the CPU the one entry is ``"cpu"`` (the process's RSS).
    """

    def __init__(self, device=None):
        self.cudas = _cudas(device)
        self.measure = memory_name(device)
        self.start_bytes = self.peak_bytes = self.peak_device = None
        self.start_bytes_by_device: dict[str, int] = {}
        self.peak_bytes_by_device: dict[str, int] = {}

    @property
    def cuda(self) -> torch.device | None:
        """The first GPU measured (None on the CPU)."""
        return self.cudas[0] if self.cudas else None

    def __enter__(self) -> "MemoryMeter":
        for cuda in self.cudas:
            torch.cuda.synchronize(cuda)
            torch.cuda.reset_peak_memory_stats(cuda)
            self.start_bytes_by_device[str(cuda)] = torch.cuda.memory_allocated(cuda)
        if not self.cudas:
            self.start_bytes_by_device["cpu"] = peak_rss_bytes()
        self.start_bytes = next(iter(self.start_bytes_by_device.values()))
        return self

    def __exit__(self, *exc) -> None:
        for cuda in self.cudas:
            torch.cuda.synchronize(cuda)
            self.peak_bytes_by_device[str(cuda)] = torch.cuda.max_memory_allocated(cuda)
        if not self.cudas:
            self.peak_bytes_by_device["cpu"] = peak_rss_bytes()
        self.peak_device = max(self.peak_bytes_by_device, key=self.peak_bytes_by_device.get)  # first of equal peaks
        self.peak_bytes = self.peak_bytes_by_device[self.peak_device]
        self.start_bytes = self.start_bytes_by_device[self.peak_device]


def measures(device=None) -> dict:
    """``{"timer": ..., "memory": ...}``: what a results file records about how it was measured."""
    return {"timer": timer_name(device), "memory": memory_name(device)}
