"""What the GPU tier's tests share: the skip rule, running one worker on NCCL and on gloo, comparing.

Every test of ``tests/gpu`` launches the same worker twice — on ``n`` GPUs with NCCL (the run's group
``"cpu:gloo,cuda:nccl"``) and on the CPU with gloo — and compares what the ranks computed. Workers
return host copies (``.cpu()``) of what they computed, so results can be compared in this process.
On a machine with fewer GPUs than a test needs, the test is skipped and the reason says so.
"""
from __future__ import annotations

import pytest
import torch

TIMEOUT = 600  # seconds one launch may take (a GPU run builds CUDA contexts and NCCL communicators)
# pytest's limit of a GPU test (tests/gpu/conftest.py sets it on each test that names none): its launches, each
# bounded by TIMEOUT — on_nccl_and_gloo makes two — and a minute to build and compare.
TEST_TIMEOUT = 2 * TIMEOUT + 60


def visible_gpus() -> int:
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def need_gpus(n: int) -> None:
    """Skip the calling test unless ``n`` CUDA GPUs are visible."""
    have = visible_gpus()
    if have < n:
        why = "this machine has no CUDA GPU" if have == 0 else f"this machine has {have}"
        pytest.skip(f"GPU tier: needs {n} CUDA GPUs (NCCL); {why}")


def on_nccl_and_gloo(worker, world_size: int, *args, timeout: float = TIMEOUT) -> tuple[dict, dict]:
    """``(NCCL results, gloo results)``: ``worker`` launched on ``world_size`` GPUs, then on the CPU."""
    from course.launch import launch

    need_gpus(world_size)
    nccl = launch(worker, world_size, *args, device="cuda", backend="nccl", timeout=timeout)
    gloo = launch(worker, world_size, *args, device="cpu", backend="gloo", timeout=timeout)
    return nccl, gloo


def host(tree):
    """``tree`` with every tensor moved to the CPU (what a worker returns)."""
    if torch.is_tensor(tree):
        return tree.detach().cpu()
    if isinstance(tree, dict):
        return {k: host(v) for k, v in tree.items()}
    if isinstance(tree, (list, tuple)):
        return type(tree)(host(v) for v in tree)
    return tree


def assert_same(gpu, cpu, what: str, rtol: float = 1e-4, atol: float = 1e-5) -> None:
    """``gpu`` equals ``cpu`` (nested dicts, lists, tensors, numbers) within the tolerances: the same
    computation on another device differs by rounding only (kernels add in other orders)."""
    if isinstance(cpu, dict):
        assert set(gpu) == set(cpu), f"{what}: keys differ: {sorted(set(gpu) ^ set(cpu))}"
        for k in cpu:
            assert_same(gpu[k], cpu[k], f"{what}[{k!r}]", rtol, atol)
    elif isinstance(cpu, (list, tuple)):
        assert len(gpu) == len(cpu), f"{what}: {len(gpu)} entries on NCCL, {len(cpu)} on gloo"
        for i, (g, c) in enumerate(zip(gpu, cpu)):
            assert_same(g, c, f"{what}[{i}]", rtol, atol)
    elif torch.is_tensor(cpu):
        torch.testing.assert_close(gpu.float(), cpu.float(), rtol=rtol, atol=atol,
                                   msg=lambda m: f"{what}: NCCL on GPUs and gloo on the CPU differ: {m}")
    elif isinstance(cpu, float):
        assert gpu == pytest.approx(cpu, rel=rtol, abs=atol), f"{what}: {gpu} (NCCL) != {cpu} (gloo)"
    else:
        assert gpu == cpu, f"{what}: {gpu!r} (NCCL) != {cpu!r} (gloo)"


def multi30k_dir() -> str:
    """The Multi30k folder a GPU test's run script reads, found by the course's resolution order
    (:func:`course.data.resolve_data_dir`: ``$LLMSYS_DATA_DIR`` — where Modal's ``--gpu-tests`` stages it on its
    volume —, ``data/multi30k``, ``../shared/data/multi30k``, else a download into ``data/multi30k``).

    Raises:
        course.data.DataNotFoundError: none holds the files and the download failed; it says where to put them.
    """
    from course.data import resolve_data_dir

    return str(resolve_data_dir())
