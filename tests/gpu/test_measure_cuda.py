"""GPU tier: course.measure on a GPU — the stopwatch includes the kernels a block queued (a host clock
read without synchronising would not), stamps keep their order without waiting, and the memory meter
reports the device's peak allocation of the block, reset for each measurement."""
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
