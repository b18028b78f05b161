"""Checkpoints move between kinds of device (issue 38, item 7), ungraded: a checkpoint written on CPU holds no
CUDA random generator, one written on GPUs does. Resuming builds the state to load as its own device would
(:func:`course.checkpoint.rng_state`: with a CUDA generator on GPUs), so each direction is checked here without
a GPU — the GPU side's template made as on a GPU, ``torch.cuda.get_rng_state`` standing in for the device's. One
process, no process group (DCP's single-process path).
"""
from __future__ import annotations

import random

import pytest
import torch

# DCP's single-process path says it assumes one process: it is what these tests use
pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")


@pytest.fixture
def fake_cuda_rng(monkeypatch):
    """torch.cuda's generator state as a GPU gives it (a byte tensor on the host), without a GPU."""
    state = torch.arange(16, dtype=torch.uint8)
    monkeypatch.setattr(torch.cuda, "get_rng_state", lambda device=None: state.clone())
    return state


def _state(device, weight: float) -> dict:
    from course.checkpoint import rng_state

    return {"w": torch.full((8,), weight), "rng_rank0": rng_state(device)}


def test_a_cpu_checkpoint_resumes_on_a_gpu(tmp_path, fake_cuda_rng):
    from course.checkpoint import load_checkpoint, save_checkpoint, set_rng_state

    torch.manual_seed(3)
    random.seed(3)
    saved = _state(torch.device("cpu"), 1.0)
    assert "cuda" not in saved["rng_rank0"]
    path = save_checkpoint(tmp_path, 1, saved)
    expected = torch.rand(4)  # what the CPU generator draws after the save

    torch.manual_seed(99)
    template = _state(torch.device("cuda", 0), 0.0)  # as a GPU run builds it: with a CUDA generator
    assert "cuda" in template["rng_rank0"]
    loaded = load_checkpoint(path, template)
    assert torch.equal(loaded["w"], torch.full((8,), 1.0))
    assert "cuda" not in loaded["rng_rank0"], "the CUDA generator was asked of a checkpoint that has none"
    set_rng_state(loaded["rng_rank0"], torch.device("cuda", 0))  # sets no CUDA state: none was saved
    assert torch.equal(torch.rand(4), expected)


def test_a_gpu_checkpoint_resumes_on_cpu(tmp_path, fake_cuda_rng):
    from course.checkpoint import load_checkpoint, save_checkpoint

    torch.manual_seed(5)
    saved = _state(torch.device("cuda", 0), 2.0)  # as a GPU run writes it
    path = save_checkpoint(tmp_path, 1, saved)
    expected = torch.rand(4)

    torch.manual_seed(99)
    loaded = load_checkpoint(path, _state(torch.device("cpu"), 0.0))
    assert torch.equal(loaded["w"], torch.full((8,), 2.0)) and "cuda" not in loaded["rng_rank0"]
    torch.set_rng_state(loaded["rng_rank0"]["torch"])
    assert torch.equal(torch.rand(4), expected)


def test_a_gpu_checkpoint_resumes_on_a_gpu_with_its_cuda_generator(tmp_path, fake_cuda_rng):
    from course.checkpoint import load_checkpoint, save_checkpoint

    path = save_checkpoint(tmp_path, 1, _state(torch.device("cuda", 0), 2.0))
    template = _state(torch.device("cuda", 0), 0.0)
    template["rng_rank0"]["cuda"].zero_()
    loaded = load_checkpoint(path, template)
    assert torch.equal(loaded["rng_rank0"]["cuda"], fake_cuda_rng)


def test_an_entry_the_checkpoint_lacks_is_still_an_error(tmp_path):
    from torch.distributed.checkpoint.api import CheckpointException

    from course.checkpoint import load_checkpoint, save_checkpoint

    path = save_checkpoint(tmp_path, 1, _state(torch.device("cpu"), 1.0))
    with pytest.raises(CheckpointException, match="Missing key in checkpoint state_dict: extra"):
        load_checkpoint(path, {**_state(torch.device("cpu"), 0.0), "extra": torch.zeros(2)})
