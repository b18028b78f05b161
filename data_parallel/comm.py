"""Assignment 5.1.2 — forming the process group, and averaging gradients with all-reduce.

After each rank's backward pass on its own shard, every gradient is all-reduced (summed
over ranks) and divided by the world size, so every rank holds the gradient of the mean
loss over the global batch and the replicas stay identical after ``optimizer.step()``
(Li et al. 2020, PyTorch Distributed, Sec. 3.2; Goyal et al. 2017).
"""
from __future__ import annotations

import datetime
import os

import torch
import torch.distributed as dist


def setup(rank: int, world_size: int, backend: str = "gloo", master_addr: str | None = None,
          master_port: str | int | None = None, timeout_s: float = 120.0) -> None:
    """Join the default process group as ``rank`` of ``world_size``.

    Rendezvous is over TCP at ``master_addr:master_port`` (defaults: the ``MASTER_ADDR``
    and ``MASTER_PORT`` environment variables). ``backend`` is ``gloo`` (CPU) or ``nccl``
    (GPU). ``timeout_s`` bounds every collective, so a missing rank raises instead of hanging.

    Raises:
        ValueError: no address/port given and none in the environment.
    """
    master_addr = master_addr or os.environ.get("MASTER_ADDR")
    master_port = master_port or os.environ.get("MASTER_PORT")
    if not master_addr or not master_port:
        raise ValueError("setup needs master_addr and master_port (or MASTER_ADDR / MASTER_PORT set)")
    # BEGIN ASSIGN5_1_2
    os.environ["MASTER_ADDR"] = str(master_addr)
    os.environ["MASTER_PORT"] = str(master_port)
    dist.init_process_group(backend, rank=rank, world_size=world_size,
                            timeout=datetime.timedelta(seconds=timeout_s))
    # END ASSIGN5_1_2


def cleanup() -> None:
    """Leave and destroy the default process group (after which ``dist.is_initialized()`` is False)."""
    # BEGIN ASSIGN5_1_2
    if dist.is_initialized():
        dist.destroy_process_group()
    # END ASSIGN5_1_2


def average_gradients(model: torch.nn.Module) -> None:
    """Replace every ``param.grad`` by its mean over all ranks, in place.

    Each gradient is all-reduced with ``ReduceOp.SUM`` and divided by the world size.
    Parameters whose ``grad`` is None (unused, or frozen) are skipped. Shapes are
    unchanged; on return every rank holds the same gradients.

    Raises:
        RuntimeError: no process group (call :func:`setup` or run under the launcher).
    """
    if not dist.is_initialized():
        raise RuntimeError("average_gradients needs a process group: run it inside project.launch.launch")
    # BEGIN ASSIGN5_1_2
    world_size = dist.get_world_size()
    for param in model.parameters():
        if param.grad is None:
            continue
        dist.all_reduce(param.grad, op=dist.ReduceOp.SUM)
        param.grad /= world_size
    # END ASSIGN5_1_2
