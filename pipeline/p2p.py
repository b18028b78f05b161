"""Point-to-point transfer of activations and gradients between neighbouring stages.

The receiver does not know the shape of what comes (sequence lengths change from batch
to batch), so every tensor travels as two messages: a fixed-size header (dtype code,
number of dimensions, shape) and then the data. Sends are non-blocking (``isend``), so
a rank never waits for its neighbour to post the matching receive — that keeps the
1F1B schedule free of deadlocks; receives block. Messages between two ranks arrive in
the order they were sent.

The same code runs with gloo (CPU tensors) and NCCL (CUDA tensors): the header is
created on the tensor's device.

Peers are addressed by their **global** rank, and every transfer names the pipeline's
process group (the ``pp`` group of the run's mesh): a stage's neighbour is
``dist.get_global_rank(pp_group, stage ± 1)`` (:class:`pipeline.stage_runner.StageRunner`).
The data messages are counted by :class:`course.collectives.CommCounter` (kind ``send``
/ ``recv``, group ``pp``); the small headers are not.

Source: PyTorch ``torch.distributed`` point-to-point API (send/recv/isend);
Narayanan et al. 2021, Sec. 4.1 (p2p communication between pipeline stages).
"""
from __future__ import annotations

import torch

from course.collectives import isend, recv

MAX_DIMS = 6
DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int64]


def send_tensor(tensor: torch.Tensor, dst: int, group=None, tag: int = 0) -> list:
    """Start sending ``tensor`` (any shape, up to ``MAX_DIMS`` dims) to global rank ``dst`` of ``group``.

    ``tag`` keeps apart streams of messages between the same two ranks (the interleaved
    schedule sends activations and gradients of several chunks between one pair of ranks);
    within a tag, messages arrive in the order they were sent.

    Returns:
        The pending ``dist.Work`` handles; keep them (and so the tensors) until ``wait()``.

    Raises:
        ValueError: too many dimensions or an unsupported dtype.
    """
    if tensor.dim() > MAX_DIMS or tensor.dtype not in DTYPES:
        raise ValueError(f"cannot send a {tensor.dim()}-dim {tensor.dtype} tensor (max {MAX_DIMS} dims, {DTYPES})")
    tensor = tensor.detach().contiguous()
    header = torch.zeros(2 + MAX_DIMS, dtype=torch.int64, device=tensor.device)
    header[0] = DTYPES.index(tensor.dtype)
    header[1] = tensor.dim()
    header[2:2 + tensor.dim()] = torch.tensor(tensor.shape, dtype=torch.int64)
    return [isend(header, dst, group, counted=False, tag=tag), isend(tensor, dst, group, tag=tag)]


def recv_tensor(src: int, device: torch.device, group=None, tag: int = 0) -> torch.Tensor:
    """Receive the next tensor that global rank ``src`` of ``group`` sent with :func:`send_tensor` and ``tag`` (blocking)."""
    header = torch.zeros(2 + MAX_DIMS, dtype=torch.int64, device=device)
    recv(header, src, group, counted=False, tag=tag)
    dtype, ndim = DTYPES[int(header[0])], int(header[1])
    shape = [int(s) for s in header[2:2 + ndim]]
    tensor = torch.empty(shape, dtype=dtype, device=device)
    return recv(tensor, src, group, tag=tag)
