"""The launcher: results per rank, a raising rank ends the run, a hung rank is named, nothing is left behind."""
import multiprocessing
import time

import pytest
import torch
import torch.distributed as dist

from course.launch import RankFailure, launch, resolve_device_backend

pytestmark = pytest.mark.fresh_processes  # the launcher's own processes (tests/course/test_launch_pool.py: the pool)


def sum_worker(rank, world_size, offset):
    from course.launch import context

    t = torch.tensor([rank + offset])
    dist.all_reduce(t)
    ctx = context()
    return float(t), ctx.rank, ctx.world_size, str(ctx.device), ctx.backend


def raising_worker(rank, world_size):
    if rank == 1:
        raise ValueError("planted failure on rank 1")
    dist.barrier()  # rank 0 would wait here forever without the launcher


def hanging_worker(rank, world_size):
    if rank == 0:
        dist.all_reduce(torch.ones(1))  # rank 1 never joins this collective
    else:
        time.sleep(120)


def receive_first_worker(rank, world_size):
    buf = torch.zeros(1)
    dist.recv(buf, src=1 - rank)  # both ranks receive before they send: neither message is ever sent
    dist.send(buf, dst=1 - rank)


def whereabouts_worker(rank, world_size):
    import os
    import sys
    from pathlib import Path

    from course.launch import RANK_PRELOAD

    return {"env": os.environ.get("LLMSYS_TEST_MARK"), "cwd": os.getcwd(), "pid": os.getpid(),
            "parent": os.getppid(), "name": Path("/proc/self/comm").read_text().strip(),
            "preloaded": [m for m in RANK_PRELOAD if m in sys.modules],
            "bad_fork": torch.cuda._is_in_bad_fork()}


def test_ranks_are_forked_with_the_callers_environment_and_folder_and_the_preloaded_imports(tmp_path, monkeypatch):
    """A forked rank starts from the fork server's state: it must still see the caller's environment and
    folder at the time of the launch (as a spawned rank would), and find torch and GPT-2 imported."""
    import os

    from course.launch import RANK_PRELOAD

    for mark in ("first", "second"):  # the second launch is forked by the same server, after the change
        monkeypatch.setenv("LLMSYS_TEST_MARK", mark)
        folder = tmp_path / mark
        folder.mkdir()
        monkeypatch.chdir(folder)
        out = launch(whereabouts_worker, 2, timeout=120)
        for rank, seen in out.items():
            assert seen["env"] == mark and seen["cwd"] == str(folder), seen
            assert seen["name"] == f"rank{rank}" and seen["parent"] != os.getpid(), "not forked by the fork server"
            assert seen["preloaded"] == RANK_PRELOAD and not seen["bad_fork"], seen
        assert "PYTORCH_NVML_BASED_CUDA_CHECK" not in os.environ, "the server's setting leaked into the caller"


def test_every_rank_runs_in_one_group():
    out = launch(sum_worker, 3, 1.0, timeout=60)
    assert sorted(out) == [0, 1, 2]
    for rank, (total, r, ws, device, backend) in out.items():
        assert (total, r, ws, device, backend) == (6.0, rank, 3, "cpu", "gloo")


def test_a_raising_rank_ends_the_run_with_its_traceback():
    start = time.monotonic()
    with pytest.raises(RankFailure) as info:
        launch(raising_worker, 2, timeout=60, collective_timeout=30)
    assert info.value.rank == 1
    assert "planted failure on rank 1" in str(info.value) and "Traceback" in str(info.value)
    assert time.monotonic() - start < 30
    assert not multiprocessing.active_children()


def test_a_hung_rank_is_named_and_stopped():
    start = time.monotonic()
    with pytest.raises(RankFailure) as info:
        launch(hanging_worker, 2, timeout=8, collective_timeout=60)
    assert "did not finish within 8 s" in str(info.value) and "[0, 1]" in str(info.value)
    assert time.monotonic() - start < 30
    assert not multiprocessing.active_children(), "the launcher left processes behind"


def test_a_deadlock_names_the_rank_that_never_reached_the_collective():
    """Rank 0 waits in an all-reduce that rank 1 never calls: the error names rank 1, and where it is."""
    start = time.monotonic()
    with pytest.raises(RankFailure) as info:
        launch(hanging_worker, 2, timeout=90, collective_timeout=6)
    message = str(info.value)
    assert "rank(s) [1] never reached the collective that rank 0 timed out in" in message, message
    assert "rank 1:" in message and "hanging_worker" in message, message  # where rank 1 was instead
    assert time.monotonic() - start < 60
    assert not multiprocessing.active_children(), "the launcher left processes behind"


def test_a_deadlock_where_every_rank_waits_is_called_one_and_names_where_each_waited():
    """Both ranks receive first: each times out waiting for the other, and neither is blamed for not arriving."""
    with pytest.raises(RankFailure) as info:
        launch(receive_first_worker, 2, timeout=90, collective_timeout=5)
    message = str(info.value)
    assert "ranks [0, 1] all timed out waiting" in message and "a deadlock" in message, message
    assert "never reached" not in message, message
    assert message.count("receive_first_worker") >= 2, "where each rank waited"
    assert not multiprocessing.active_children(), "the launcher left processes behind"


def test_bad_world_size_and_devices_are_refused_before_spawning():
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="world_size"):
            launch(sum_worker, bad, 0.0)
    with pytest.raises(ValueError, match="nccl"):
        resolve_device_backend("cpu", "nccl")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="no CUDA GPU"):
            resolve_device_backend("cuda", "auto")
        assert resolve_device_backend("auto", "auto") == ("cpu", "gloo")
