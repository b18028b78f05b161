"""GPU tier: the launcher on GPUs — the group is ``cpu:gloo,cuda:nccl`` with rank r on ``cuda:LOCAL_RANK``
(spawn mode and torchrun), host tensors go over gloo and CUDA tensors over NCCL in the same group,
``--device auto`` picks the GPUs, a collective that times out on NCCL ends the run naming the rank,
and a run script trains on the GPUs and records the clock and memory measure it used."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.gpu.support import need_gpus

pytestmark = pytest.mark.gpu
REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("world_size", [2, 4, 8])
def test_spawned_ranks_get_their_gpu_and_a_mixed_group(world_size):
    from course.launch import launch
    from tests.gpu.workers import group_worker

    need_gpus(world_size)
    out = launch(group_worker, world_size, device="cuda", timeout=300)
    total = world_size * (world_size + 1) / 2
    for rank, r in out.items():
        assert r["device"] == f"cuda:{rank}" and r["local_rank"] == rank
        assert r["group_backend"] == "cpu:gloo,cuda:nccl" and r["backend"] == "nccl"
        assert "gloo" in r["dist_backend"] and "nccl" in r["dist_backend"], r["dist_backend"]
        assert r["host_sum"] == r["device_sum"] == total


def test_torchrun_ranks_use_local_rank_and_auto_picks_the_gpus():
    need_gpus(2)
    env = {k: v for k, v in os.environ.items() if k != "LLMSYS_DEVICE"}  # --device auto as a user has it
    result = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                             str(REPO / "tests/gpu/report_devices.py")], cwd=REPO, env=env, capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    reports = [json.loads(line.split("REPORT ", 1)[1]) for line in result.stdout.splitlines() if "REPORT " in line]
    assert sorted(r["rank"] for r in reports) == [0, 1]
    for r in reports:
        assert r["device"] == f"cuda:{r['local_rank']}" and r["group_backend"] == "cpu:gloo,cuda:nccl", r


def test_more_ranks_than_gpus_is_refused_before_anything_starts():
    from course.launch import launch, visible_gpus
    from tests.gpu.workers import group_worker

    need_gpus(1)
    with pytest.raises(ValueError, match=f"need {visible_gpus() + 1} GPUs"):
        launch(group_worker, visible_gpus() + 1, device="cuda")


def test_an_nccl_timeout_ends_the_run_naming_the_rank():
    from course.launch import RankFailure, launch
    from tests.gpu.workers import nccl_hang_worker

    need_gpus(2)
    with pytest.raises(RankFailure) as info:
        launch(nccl_hang_worker, 2, device="cuda", collective_timeout=10, timeout=240)
    first = str(info.value).splitlines()[0]
    # the watchdog aborts rank 0 (SIGABRT), or torch raises the timeout in rank 0's Python code
    assert first.startswith(("rank 0 failed", "rank(s) [1] never reached", "rank 0 raised")), str(info.value)[:3000]
    assert "SIGABRT" in first or "time" in str(info.value).lower(), str(info.value)[:3000]


def test_data_parallel_script_trains_on_the_gpus(tmp_path):
    from tests.gpu.support import multi30k_dir

    need_gpus(2)
    result = subprocess.run([sys.executable, "project/run_data_parallel.py", "--dp", "2", "--device", "cuda",
                             "--preset", "tiny", "--max_batches", "3", "--n_bleu", "4", "--max_val_batches", "1",
                             "--max_train_examples", "2000", "--vocab_size", "1000", "--data_dir", multi30k_dir(),
                             "--workdir", str(tmp_path), "--quiet", "--timeout", "800"], cwd=REPO, capture_output=True,
                            text=True, timeout=900)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    for rank in range(2):
        r = json.loads((tmp_path / f"rank{rank}_results_epoch0.json").read_text())
        assert r["config"]["device"] == "cuda" and r["config"]["backend"] == "nccl"
        assert r["timer"] == "host-clock+cuda-sync"
        assert r["memory"].startswith("torch.cuda.max_memory_allocated") and r["peak_memory_bytes"] > 0
