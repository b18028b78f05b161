"""Point-to-point transfer of activations and gradients between neighbouring stages.

The receiver does not know the shape of what comes (sequence lengths change from batch
to batch), so every tensor travels as two messages: a fixed-size header (dtype code,
number of dimensions, shape) and then the data. Sends are non-blocking (``isend``), so
a rank never waits for its neighbour to post the matching receive — that keeps the
1F1B schedule free of deadlocks; receives block. Messages between two ranks arrive in
the order they were sent.

The same code runs with gloo (CPU tensors) and NCCL (CUDA tensors): the header is
created on the tensor's device.

Source: PyTorch ``torch.distributed`` point-to-point API (send/recv/isend);
Narayanan et al. 2021, Sec. 4.1 (p2p communication between pipeline stages).
"""
from __future__ import annotations

import torch
import torch.distributed as dist

MAX_DIMS = 6
DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int64]


def send_tensor(tensor: torch.Tensor, dst: int) -> list:
    """Start sending ``tensor`` (any shape, up to ``MAX_DIMS`` dims) to rank ``dst``.

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
    return [dist.isend(header, dst), dist.isend(tensor, dst)]


def recv_tensor(src: int, device: torch.device) -> torch.Tensor:
    """Receive the next tensor that rank ``src`` sent with :func:`send_tensor` (blocks until it arrives)."""
    header = torch.zeros(2 + MAX_DIMS, dtype=torch.int64, device=device)
    dist.recv(header, src)
    dtype, ndim = DTYPES[int(header[0])], int(header[1])
    shape = [int(s) for s in header[2:2 + ndim]]
    tensor = torch.empty(shape, dtype=dtype, device=device)
    dist.recv(tensor, src)
    return tensor
