"""Ungraded: the one-process pipeline (``--single_process sequential`` / ``pipe``, stage s on ``cuda:s``) is timed
and measured on every stage's GPU, not on ``cuda:0`` alone.

Two GPUs are faked on the CPU: ``torch.cuda``'s synchronize and memory counters are replaced by recorders
with a peak per device, so what :mod:`course.measure` waits for and reports is visible. The former code
read the clock after synchronising ``cuda:0`` only and reported stage 0's peak as ``peak_memory_bytes``.
On GPUs ``tests/gpu/test_measure_cuda.py`` (``test_memory_meter_measures_every_stage_gpu``) measures two
real devices when the machine has them.
"""
from types import SimpleNamespace

import pytest
import torch

from course import epoch_runner, measure

GPUS = [torch.device("cuda", 0), torch.device("cuda", 1)]
PEAKS = {0: 3_000, 1: 7_000}  # bytes: stage 1 (the head) holds more than stage 0


@pytest.fixture
def two_fake_gpus(monkeypatch):
    synced = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: synced.append(torch.device(device)))
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", lambda device=None: None)
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda device=None: 100 * (1 + torch.device(device).index))
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda device=None: PEAKS[torch.device(device).index])
    return synced


def test_the_clock_waits_for_every_stage_gpu(two_fake_gpus):
    measure.now(GPUS)
    assert two_fake_gpus == GPUS, "the clock must wait for the work queued on every stage's GPU"
    assert measure.timer_name(GPUS) == measure.SYNCED_CLOCK and measure.timer_name(["cpu"]) == measure.HOST_CLOCK
    two_fake_gpus.clear()
    measure.now(torch.device("cpu"))
    assert two_fake_gpus == [], "nothing to wait for on the CPU"


def test_the_memory_meter_reports_every_stage_gpu_and_the_largest(two_fake_gpus):
    with measure.MemoryMeter(GPUS) as meter:
        pass
    assert meter.peak_bytes_by_device == {"cuda:0": 3_000, "cuda:1": 7_000}
    assert (meter.peak_bytes, meter.peak_device, meter.start_bytes) == (7_000, "cuda:1", 200)
    assert meter.measure == measure.CUDA_MEMORY
    with measure.MemoryMeter("cpu") as cpu:
        pass
    assert list(cpu.peak_bytes_by_device) == ["cpu"] and cpu.peak_device == "cpu" and cpu.peak_bytes > 0


class _Reached(Exception):
    pass


def test_the_epoch_runner_times_and_measures_the_pipelines_stage_devices(monkeypatch, tmp_path):
    """What :func:`course.epoch_runner.run_epochs` hands the clock and the memory meter for a
    ``--single_process pipe`` run on two GPUs: both devices (the training itself is cut short)."""
    from pipeline.training import PipeTraining

    config = SimpleNamespace(kind="pipe", quiet=True, profile=False, n_epochs=1, workdir=str(tmp_path))
    mode = PipeTraining(config, None, None, None, GPUS, None, None)
    mode.epoch_batches, mode.train_mode = (lambda epoch: ([], 0)), (lambda: None)
    seen = {}

    class Meter:
        def __init__(self, device):
            seen["memory"] = device

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

    def train_epoch(step, batches, n_steps, **kwargs):
        seen["clock"] = kwargs["device"]
        raise _Reached

    monkeypatch.setattr(epoch_runner, "_Checkpoints", lambda mode: SimpleNamespace(resume=lambda: (0, 0, None, None),
                                                                                   resuming=False))
    monkeypatch.setattr(epoch_runner, "MemoryMeter", Meter)
    monkeypatch.setattr(epoch_runner, "train_epoch", train_epoch)
    with pytest.raises(_Reached):
        epoch_runner._run_epochs(mode)
    assert mode.device == GPUS[0] and seen == {"memory": GPUS, "clock": GPUS}
