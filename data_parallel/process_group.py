"""Assignment 5.1.2 (part 1) — joining and leaving the process group.

Every rank of a data-parallel run calls :func:`setup` with its rank, the world size and
the address of a rendezvous (rank 0's host and a free port): ``torch.distributed`` then
connects the processes, and collectives such as ``all_reduce`` can run. The course's
launcher (:mod:`course.launch`) does the same for every script; this is the by-hand
version (PyTorch, "Writing Distributed Applications with PyTorch", process groups).
"""
from __future__ import annotations

import datetime
import os

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
