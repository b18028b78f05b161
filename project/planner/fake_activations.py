"""One micro-batch's activations on a fake rank (:mod:`project.planner.fake_mesh`), measured alone: after the
forward pass, and at their peak in the backward pass (``MemTracker``'s activations and temporaries read after every
operation), beside the planner's (:func:`project.planner.memory.stage_memory`),
in :func:`project.planner.fake_mesh.measure_activations`; :func:`tracker_bytes` reads MemTracker's snapshots.

:func:`meta_autocast` lets the course's checkpointing (:mod:`memory.checkpointing`) ask autocast about the meta
device, here and in :func:`project.planner.fake_mesh.build_rank`.

Sources: PyTorch's ``MemTracker`` (torch.distributed._tools.mem_tracker) and ``TorchDispatchMode``; Korthikanti
et al. 2022 (the activations the planner counts).
"""
from __future__ import annotations

import contextlib

import torch


@contextlib.contextmanager
def meta_autocast():
    """Inside: autocast's queries about the ``meta`` device answer for the CPU (``torch.is_autocast_enabled``,
    ``torch.get_autocast_dtype``, ``torch.autocast``), restored on exit.

    autocast knows no meta device (``torch.get_autocast_dtype("meta")`` raises), and the course's
    :class:`memory.checkpointing.CheckpointFunction` records and replays the autocast state of its inputs'
    device, as ``torch.utils.checkpoint`` does: with this, it runs unchanged on the fake rank's meta tensors,
    with the CPU's autocast state (off in fp32 runs). Only for a process of its own (the fake world's).
    """
    real = torch.is_autocast_enabled, torch.get_autocast_dtype, torch.autocast

    def cpu(device_type):
        return "cpu" if device_type == "meta" else device_type

    class Autocast(real[2]):
        def __init__(self, device_type, *args, **kwargs):
            super().__init__(cpu(device_type), *args, **kwargs)

    torch.is_autocast_enabled = lambda *device_type: real[0](*map(cpu, device_type))
    torch.get_autocast_dtype = lambda device_type: real[1](cpu(device_type))
    torch.autocast = Autocast
    try:
        yield
    finally:
        torch.is_autocast_enabled, torch.get_autocast_dtype, torch.autocast = real


def _peak_watch(tracker):
    """A dispatch mode that reads ``tracker``'s current snapshot after every operation and keeps the one where
    activations and temporaries together peaked (``.peak``, ``.op``): ``MemTracker``'s own peak snapshot is
    taken where the *total* peaks, which in a backward pass is where the gradients are complete, not where the
    activations are."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class PeakWatch(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.peak, self.op = {"Activation": 0, "Temp": 0}, None

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            now = tracker_bytes(tracker, "current")
            if now["Activation"] + now["Temp"] > self.peak["Activation"] + self.peak["Temp"]:
                self.peak, self.op = now, str(func)
            return out

    return PeakWatch()


def activation_peak(stage, x, activation_checkpointing: bool) -> dict:
    """One micro-batch's forward and backward pass of a fake rank's ``stage`` on its input ``x``
    (:func:`project.planner.fake_mesh.meta_stage`; no ZeRO, no optimizer: they change no activation), with
    activation checkpointing if asked (:func:`memory.checkpointing.apply_activation_checkpointing`), under torch's
    ``MemTracker``. The backward pass starts from a gradient of ones for the stage's output (on the last stage: for
    its logits, no loss).

    Returns:
        ``{"blocks", "after_forward": MemTracker's categories after the forward pass, "peak": the categories where
        Activation + Temp peaked (during the backward pass), "op": the operation that made that peak}``; bytes.
    """
    from memory.checkpointing import apply_activation_checkpointing
    from torch.distributed._tools.mem_tracker import MemTracker

    if activation_checkpointing:
        apply_activation_checkpointing(list(stage.h.values()))
    tracker = MemTracker()
    tracker.track_external(stage, x)
    watch = _peak_watch(tracker)
    with tracker, meta_autocast(), watch:
        out = stage(x)
        after_forward = tracker_bytes(tracker, "current")
        out.backward(torch.ones_like(out))
    return {"blocks": list(stage.blocks), "after_forward": after_forward, "peak": watch.peak,
            "op": watch.op}


def tracker_bytes(tracker, kind: str) -> dict[str, int]:
    """A ``MemTracker`` snapshot (``"current"`` or ``"peak"``) as ``{category: bytes}`` summed over devices (the
    meta device's tensors, and the optimizer's step counters, which AdamW keeps on the CPU); categories are
    MemTracker's: ``Parameter, Buffer, Gradient, Activation, Temp, Optstate, Other, Total``. A peak snapshot
    is per device: the categories at the moment that device's total peaked."""
    out: dict[str, int] = {}
    for per_device in tracker.get_tracker_snapshot(kind).values():
        for category, nbytes in per_device.items():
            name = getattr(category, "value", category)
            out[name] = out.get(name, 0) + nbytes
    return out
