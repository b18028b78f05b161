"""GPU tier: groups whose names meet on NCCL, and checkpoints that move between CPU and GPU (issue 38, items 1, 2, 7).

* On GPUs the process group is bound to the device, so ``init_device_mesh`` makes its groups with
  ``split_group``, named from the number of groups each rank holds: a pipeline of 4 stages (its middle stages in
  no embedding group), then a (1, 2, 2) mesh, then a group without rank 3 and the async-checkpoint group — made
  on 4 GPUs with NCCL as on 4 gloo ranks, every rank holding as many groups as the others after each mesh. Before
  the fix the second mesh's pp groups waited forever (the launch's timeout ends it). CPU side:
  tests/course/test_rendezvous.py (the same worker under the emulated rules).
* A checkpoint written on CPU loads into the state a GPU run builds (with a CUDA generator) and the reverse.
  CPU side: tests/course/test_checkpoint_devices.py.
"""
import random

import pytest
import torch

from tests.gpu.support import need_gpus, on_nccl_and_gloo
from tests.support.rendezvous import meshes_and_checkpoint_group_worker

pytestmark = [pytest.mark.gpu, pytest.mark.filterwarnings("ignore:torch.distributed is disabled")]


def test_two_meshes_and_the_checkpoint_group_on_nccl():
    nccl, gloo = on_nccl_and_gloo(meshes_and_checkpoint_group_worker, 4, [(1, 4, 1), (1, 2, 2)], timeout=300)
    assert nccl == gloo and len({tuple(held) for held in nccl.values()}) == 1, (nccl, gloo)


def test_a_checkpoint_moves_between_cpu_and_gpu(tmp_path):
    from course.checkpoint import load_checkpoint, rng_state, save_checkpoint, set_rng_state

    need_gpus(1)
    gpu = torch.device("cuda", 0)
    torch.manual_seed(3)
    random.seed(3)
    path = save_checkpoint(tmp_path / "cpu", 1, {"w": torch.ones(8), "rng_rank0": rng_state(torch.device("cpu"))})
    expected = torch.rand(4)
    torch.manual_seed(99)
    loaded = load_checkpoint(path, {"w": torch.zeros(8, device=gpu), "rng_rank0": rng_state(gpu)})
    assert torch.equal(loaded["w"].cpu(), torch.ones(8)) and "cuda" not in loaded["rng_rank0"]
    set_rng_state(loaded["rng_rank0"], gpu)
    assert torch.equal(torch.rand(4), expected)

    path = save_checkpoint(tmp_path / "gpu", 1, {"w": torch.full((8,), 2.0, device=gpu), "rng_rank0": rng_state(gpu)})
    loaded = load_checkpoint(path, {"w": torch.zeros(8), "rng_rank0": rng_state(torch.device("cpu"))})
    assert torch.equal(loaded["w"], torch.full((8,), 2.0)) and "cuda" not in loaded["rng_rank0"]
