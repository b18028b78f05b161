"""GPU tier: course.measure on a GPU — the stopwatch includes the kernels a block queued (a host clock
read without synchronising would not), stamps keep their order without waiting, and the memory meter
reports the device's peak allocation of the block, reset for each measurement; the event recorder's spans
wait for the kernels too, and a profile holds the CUDA kernels."""
import pytest
import torch

from tests.gpu.support import need_gpus

pytestmark = pytest.mark.gpu


def test_stopwatch_waits_for_the_queued_kernels():
    import time

    from course.measure import Stopwatch

    need_gpus(1)
    device = torch.device("cuda", 0)
    torch.cuda._sleep(1000)  # warm up
    torch.cuda.synchronize(device)
    cycles = int(0.2 * torch.cuda.get_device_properties(device).clock_rate * 1e3)  # ~0.2 s of spinning
    with Stopwatch(device) as sw:
        host_start = time.time()
        torch.cuda._sleep(cycles)
        host_queued = time.time() - host_start  # what an unsynchronised host clock would report
    assert sw.timer == "host-clock+cuda-sync"
    assert sw.seconds > 0.1 > host_queued, (sw.seconds, host_queued)


def test_stamps_follow_the_device_without_waiting():
    from course.measure import seconds, stamp

    need_gpus(1)
    device = torch.device("cuda", 0)
    cycles = int(0.1 * torch.cuda.get_device_properties(device).clock_rate * 1e3)
    a = stamp(device)
    torch.cuda._sleep(cycles)
    b = stamp(device)
    assert seconds(b) - seconds(a) > 0.05


def test_memory_meter_reports_the_device_peak_of_the_block():
    from course.measure import MemoryMeter

    need_gpus(1)
    device = torch.device("cuda", 0)
    big = torch.empty(64 * 2**20, dtype=torch.uint8, device=device)  # before: not this block's peak
    del big
    with MemoryMeter(device) as m:
        x = torch.empty(16 * 2**20, dtype=torch.uint8, device=device)
        del x
    assert m.measure.startswith("torch.cuda.max_memory_allocated")
    assert 16 * 2**20 <= m.peak_bytes - m.start_bytes < 64 * 2**20


def test_recorded_spans_wait_for_the_queued_kernels():
    """course.trace on a GPU: a span (and an optimizer step's span) ends after the kernels it queued."""
    from course import trace

    need_gpus(1)
    device = torch.device("cuda", 0)
    cycles = int(0.2 * torch.cuda.get_device_properties(device).clock_rate * 1e3)
    weight = torch.zeros(4, device=device, requires_grad=True)
    weight.grad = torch.ones(4, device=device)
    optimizer = torch.optim.SGD([weight], lr=0.1)
    with trace.recording(trace.Recorder(device)) as recorder:
        with trace.span("spin", "compute"):
            torch.cuda._sleep(cycles)
        torch.cuda._sleep(cycles)  # queued before the optimizer step: its span starts once this has run
        optimizer.step()
    spin, = [s for s in recorder.spans if s.name == "spin"]
    step, = [s for s in recorder.spans if s.name == "optimizer"]
    assert spin.end - spin.start > 0.1 and step.start - spin.end > 0.1 and recorder.timer == "host-clock+cuda-sync"


def test_a_profile_on_a_gpu_holds_its_kernels(tmp_path):
    from course.profiler import StepProfiler

    need_gpus(1)
    device = torch.device("cuda", 0)
    x = torch.randn(256, 256, device=device)
    with StepProfiler(tmp_path / "p.json", 3, device, "rank 0") as prof:
        for _ in range(3):
            (x @ x).sum().item()
            prof.step()
    import json

    events = json.loads((tmp_path / "p.json").read_text())["traceEvents"]
    assert any(e.get("cat") == "kernel" for e in events), "CUDA kernels recorded"


def test_memory_meter_measures_every_stage_gpu():
    """A one-process pipeline's devices (stage s on cuda:s): the clock waits for the last stage's GPU too, and
    the meter reports each GPU's peak and which one is the largest."""
    import time

    from course.measure import MemoryMeter, now

    need_gpus(2)
    devices = [torch.device("cuda", 0), torch.device("cuda", 1)]
    for d in devices:
        torch.cuda.synchronize(d)
    cycles = int(0.2 * torch.cuda.get_device_properties(devices[1]).clock_rate * 1e3)  # ~0.2 s on cuda:1 only
    start = time.time()
    with torch.cuda.device(devices[1]):
        torch.cuda._sleep(cycles)
    assert now(devices) - start > 0.1, "the clock must wait for the second stage's GPU"
    with MemoryMeter(devices) as m:
        small = torch.empty(4 * 2**20, dtype=torch.uint8, device=devices[0])
        large = torch.empty(32 * 2**20, dtype=torch.uint8, device=devices[1])
        del small, large
    grew = {d: m.peak_bytes_by_device[d] - m.start_bytes_by_device[d] for d in ("cuda:0", "cuda:1")}
    assert 4 * 2**20 <= grew["cuda:0"] < 32 * 2**20 <= grew["cuda:1"], grew
    assert m.peak_bytes == max(m.peak_bytes_by_device.values()) == m.peak_bytes_by_device[m.peak_device]
