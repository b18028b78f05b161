"""The launcher's device rules, checked on the CPU (docs/architecture.md, "Devices and back-ends").

The GPU paths are checked by rule here — with the CUDA queries and ``init_process_group`` replaced by
stand-ins — and for real by the GPU tier (``pytest -m gpu``, ``tests/gpu``):

* one decision: ``--device auto`` follows ``$LLMSYS_DEVICE`` (the suite pins ``cpu``), else picks the GPUs
  when this node has one per rank — also when torchrun/Slurm gave each process one GPU of its own;
* more ranks on a node than GPUs, gloo for CUDA tensors, CUDA without GPUs: refused before anything starts;
* the GPU index is LOCAL_RANK (or Slurm's local id), never the global rank;
* on CUDA the group is formed as ``init_process_group("cpu:gloo,cuda:nccl", device_id=cuda:LOCAL_RANK)``
  with NCCL's watchdog set to abort and tear the rank down;
* a rank killed by SIGABRT (how NCCL's watchdog ends a rank) is reported as ``rank R failed: ...``;
* the default suite leaves the GPU tier out; ``pytest -m gpu`` lists it, skipped without CUDA.
"""
from __future__ import annotations

import multiprocessing
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

import course.launch as L

REPO = Path(__file__).resolve().parents[2]
TORCHRUN_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "SLURM_LOCALID", "SLURM_NTASKS_PER_NODE",
                "OMPI_COMM_WORLD_LOCAL_RANK", "CUDA_VISIBLE_DEVICES", "LLMSYS_DEVICE")


@pytest.fixture
def node(monkeypatch):
    """A fake node: ``node(gpus, **env)`` makes the launcher see ``gpus`` GPUs and exactly ``env``."""
    def make(gpus: int, **env):
        for name in TORCHRUN_ENV:
            monkeypatch.delenv(name, raising=False)
        for name, value in env.items():
            monkeypatch.setenv(name, str(value))
        monkeypatch.setattr(L, "visible_gpus", lambda: gpus)
    return make


def test_the_suite_pins_workers_to_the_cpu(monkeypatch):
    assert os.environ.get("LLMSYS_DEVICE") == "cpu", "conftest.py pins what --device auto means for the tests"
    monkeypatch.setattr(L, "visible_gpus", lambda: 8)
    assert L.resolve_device_backend("auto", "auto", 2) == ("cpu", "gloo")


def test_auto_picks_the_gpus_when_each_rank_has_one(node):
    node(4)
    assert L.resolve_device_backend("auto", "auto", 4) == ("cuda", "nccl")
    assert L.resolve_device_backend("auto", "auto", 8) == ("cpu", "gloo")  # too few GPUs: the CPU, as documented
    node(0)
    assert L.resolve_device_backend("auto", "auto", 2) == ("cpu", "gloo")
    node(4, LLMSYS_DEVICE="cpu")
    assert L.resolve_device_backend("auto", "auto", 2) == ("cpu", "gloo")
    node(4, LLMSYS_DEVICE="cuda")
    assert L.resolve_device_backend("auto", "auto", 2) == ("cuda", "nccl")
    node(4, LLMSYS_DEVICE="tpu")
    with pytest.raises(ValueError, match="LLMSYS_DEVICE"):
        L.resolve_device_backend("auto", "auto", 2)


def test_auto_under_torchrun_with_one_gpu_per_process(node):
    """Slurm (--gpus-per-task=1) or a per-rank CUDA_VISIBLE_DEVICES: each process sees one GPU, not four."""
    node(1, RANK=6, WORLD_SIZE=8, LOCAL_RANK=2, LOCAL_WORLD_SIZE=4, CUDA_VISIBLE_DEVICES="2")
    assert L.resolve_device_backend("auto", "auto", 8) == ("cuda", "nccl")
    assert L.gpu_index(2, 4, 1) == 0  # its one GPU is cuda:0 inside the process
    node(4, RANK=6, WORLD_SIZE=8, LOCAL_RANK=2, LOCAL_WORLD_SIZE=4)
    assert L.resolve_device_backend("auto", "auto", 8) == ("cuda", "nccl")
    assert L.gpu_index(2, 4, 4) == 2
    node(1, RANK=1, WORLD_SIZE=2, LOCAL_RANK=1, LOCAL_WORLD_SIZE=2)  # one shared GPU, nothing narrowed: not enough
    assert L.resolve_device_backend("auto", "auto", 2) == ("cpu", "gloo")


@pytest.mark.parametrize("gpus, world_size, env, message", [
    (2, 4, {}, "4 ranks on this node need 4 GPUs .* but 2 are visible"),
    (4, 16, dict(RANK=0, WORLD_SIZE=16, LOCAL_RANK=0, LOCAL_WORLD_SIZE=8), "8 ranks on this node need 8 GPUs"),
    (1, 2, {}, "2 ranks on this node need 2 GPUs .* but 1 is visible"),
    (0, 2, {}, "no CUDA GPU is visible; use --device cpu"),
])
def test_cuda_with_too_few_gpus_is_refused(node, gpus, world_size, env, message):
    node(gpus, **env)
    with pytest.raises(ValueError, match=message):
        L.resolve_device_backend("cuda", "auto", world_size)


def test_backends_that_cannot_serve_the_device_are_refused(node):
    node(2)
    with pytest.raises(ValueError, match="gloo cannot send or receive CUDA tensors"):
        L.resolve_device_backend("cuda", "gloo", 2)
    with pytest.raises(ValueError, match="nccl backend needs --device cuda"):
        L.resolve_device_backend("cpu", "nccl", 2)
    assert L.process_group_backend("cuda", "nccl") == "cpu:gloo,cuda:nccl"
    assert L.process_group_backend("cpu", "gloo") == "gloo"


def test_the_gpu_index_is_the_local_rank_never_the_global_rank(node):
    node(8, RANK=13, WORLD_SIZE=16, LOCAL_RANK=5, LOCAL_WORLD_SIZE=8)
    assert L.local_rank_from_env(13, 16) == 5
    node(8, RANK=13, WORLD_SIZE=16, SLURM_LOCALID=5, SLURM_NTASKS_PER_NODE=8)
    assert L.local_rank_from_env(13, 16) == 5
    node(8, RANK=13, WORLD_SIZE=16, LOCAL_WORLD_SIZE=8)
    with pytest.raises(ValueError, match="LOCAL_RANK is not set"):
        L.local_rank_from_env(13, 16)
    node(2, RANK=1, WORLD_SIZE=2)  # one node (torchrun --standalone leaves nothing to guess)
    assert L.local_rank_from_env(1, 2) == 1


def test_a_cuda_rank_forms_a_mixed_group_on_its_local_gpu(node, monkeypatch):
    """``setup_worker`` on CUDA, with the CUDA calls and init_process_group recorded instead of made."""
    node(4, RANK=5, WORLD_SIZE=8, LOCAL_RANK=1, LOCAL_WORLD_SIZE=4)
    monkeypatch.delenv("TORCH_NCCL_ASYNC_ERROR_HANDLING", raising=False)
    calls = {}
    monkeypatch.setattr(torch.cuda, "set_device", lambda d: calls.setdefault("set_device", d))
    monkeypatch.setattr(dist, "init_process_group", lambda **kw: calls.setdefault("init", kw))
    monkeypatch.setattr(L, "_CONTEXT", None)
    ctx = L.setup_worker(5, 8, 1, "cuda", "nccl", None, 30.0, store=object())
    assert calls["set_device"] == torch.device("cuda", 1)
    assert calls["init"]["backend"] == "cpu:gloo,cuda:nccl"
    assert calls["init"]["device_id"] == torch.device("cuda", 1)
    assert calls["init"]["rank"] == 5 and calls["init"]["world_size"] == 8
    assert (ctx.device, ctx.backend, ctx.group_backend, ctx.local_rank) == (torch.device("cuda", 1), "nccl",
                                                                          "cpu:gloo,cuda:nccl", 1)
    assert os.environ["TORCH_NCCL_ASYNC_ERROR_HANDLING"] == "1"
    monkeypatch.setattr(L, "_CONTEXT", None)


def test_torchrun_mode_takes_local_rank_for_the_gpu(node, monkeypatch):
    node(8, RANK=13, WORLD_SIZE=16, LOCAL_RANK=5, LOCAL_WORLD_SIZE=8, MASTER_ADDR="127.0.0.1", MASTER_PORT="1")
    seen = {}
    monkeypatch.setattr(L, "die_with_parent", lambda pid: None)
    monkeypatch.setattr(L.signal, "signal", lambda *a: None)
    monkeypatch.setattr(L.faulthandler, "enable", lambda **kw: None)
    monkeypatch.setattr(L, "_attempt_store", lambda *a: None)
    monkeypatch.setattr(L, "teardown_worker", lambda: None)
    monkeypatch.setattr(L, "setup_worker", lambda rank, ws, local_rank, device_type, *rest, **kw:
                        seen.update(rank=rank, local_rank=local_rank, device_type=device_type))
    out = L.launch(lambda rank, ws: rank * 10, 16, device="cuda")
    assert out == {13: 130}
    assert seen == {"rank": 13, "local_rank": 5, "device_type": "cuda"}


def aborting_worker(rank, world_size):
    if rank == 1:
        time.sleep(1)
        os.abort()  # what NCCL's watchdog does to a rank whose collective timed out
    dist.barrier()


@pytest.mark.fresh_processes  # no pooled ranks of earlier tests alive: the check below counts every child
def test_a_rank_killed_by_sigabrt_is_reported_by_rank_and_cause():
    with pytest.raises(L.RankFailure) as info:
        L.launch(aborting_worker, 2, timeout=60, collective_timeout=60)
    lines = str(info.value).splitlines()
    assert info.value.rank == 1
    assert lines[0].startswith("rank 1 failed: killed by SIGABRT (on GPUs: NCCL's watchdog"), lines[:3]
    assert re.search(r"at .*test_launch_devices\.py:\d+ in aborting_worker", lines[1]), lines[:3]
    # reported on the abort, not after the survivor's 60 s collective timeout or the launch's: said by the
    # report (no wait timed out), not timed
    assert "timed out" not in str(info.value) and "did not finish within" not in str(info.value), str(info.value)
    assert not multiprocessing.active_children()


def test_the_gpu_tier_is_left_out_by_default_and_listed_with_m_gpu():
    def collect(*args):
        result = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:randomly",
                                 "tests/gpu", *args], cwd=REPO, capture_output=True, text=True, timeout=240)
        return result.stdout
    default = collect()
    assert "no tests collected (" in default and "deselected" in default, default[-2000:]
    listed = [line for line in collect("-m", "gpu").splitlines() if line.startswith("tests/gpu/")]
    assert len(listed) >= 15, listed
    for line in listed:
        assert not re.search(r"a5_\d", line), f"a GPU test must not carry a key string: {line}"


@pytest.mark.skipif(torch.cuda.is_available(), reason="on a GPU machine the tier runs for real: pytest -m gpu")
def test_without_cuda_every_gpu_test_is_skipped_with_its_reason():
    result = subprocess.run([sys.executable, "-m", "pytest", "-m", "gpu", "-q", "-rs", "-p", "no:randomly",
                             "tests/gpu"], cwd=REPO, capture_output=True, text=True, timeout=300)
    skipped = [line for line in result.stdout.splitlines() if line.startswith("SKIPPED")]
    assert skipped and all("CUDA GPU" in line and "this machine has no CUDA GPU" in line for line in skipped), \
        result.stdout[-3000:]
    assert re.search(r"\b(\d+) skipped\b", result.stdout) and " passed" not in result.stdout and \
        " failed" not in result.stdout, result.stdout[-2000:]
    assert int(re.search(r"\b(\d+) skipped\b", result.stdout).group(1)) >= 15
