"""Point-to-point transfer of activations and gradients between pipeline stages, safe under NCCL.

The receiver does not know the shape of what comes (sequence lengths change from batch to
batch, and micro-batches may differ in size), so every tensor travels as a fixed-size header
(dtype code, number of dimensions, shape) and then its data. The stage runner hands over all
the messages of one step of its communication plan (:func:`pipeline.metrics.communication_plan`)
in one call of :func:`exchange_tensors`, which runs two batches on every rank involved: first the
headers of every message, then the data. Each batch is one ``batch_isend_irecv`` (an NCCL
group call), posted by both ends of every message at the same step of the plan, so a send never
waits for a receive stuck behind another send — the rules NCCL holds a program to and gloo does
not (docs/architecture.md, "Point-to-point under NCCL's rules"; Megatron-LM exchanges shapes
the same way, in a batch of their own before the data).

Headers and data live on the stage's device (NCCL: CUDA). Peers are addressed by their
**global** rank, and every transfer names the pipeline's process group (the ``pp`` group of the
run's mesh). The data messages are counted by :class:`course.collectives.CommCounter` (kind
``send``/``recv``, group ``pp``); the headers are not.

Sources: PyTorch ``torch.distributed.batch_isend_irecv``; Narayanan et al. 2021, Sec. 4.1
(point-to-point communication between pipeline stages); Megatron-LM
``p2p_communication._communicate_shapes``.
"""
from __future__ import annotations

import torch

from course.collectives import P2P, exchange

MAX_DIMS = 6
DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int64]


def _header(tensor: torch.Tensor) -> torch.Tensor:
    if tensor.dim() > MAX_DIMS or tensor.dtype not in DTYPES:
        raise ValueError(f"cannot send a {tensor.dim()}-dim {tensor.dtype} tensor (max {MAX_DIMS} dims, {DTYPES})")
    header = torch.zeros(2 + MAX_DIMS, dtype=torch.int64, device=tensor.device)
    header[0] = DTYPES.index(tensor.dtype)
    header[1] = tensor.dim()
    header[2:2 + tensor.dim()] = torch.tensor(tensor.shape, dtype=torch.int64, device=tensor.device)
    return header


def exchange_tensors(sends: list[tuple[torch.Tensor, int]], sources: list[int], device: torch.device,
                     group=None) -> list[torch.Tensor]:
    """Send every ``(tensor, dst)`` of ``sends`` and receive one tensor from every rank of ``sources``.

    Both ends of a message must call this at the same step, listing the messages between them in
    the same order (each peer's sends on one side in the order of its receives on the other).

    Args:
        sends: ``(tensor of any shape up to MAX_DIMS dims, destination's global rank)``.
        sources: the global rank each received tensor comes from (one entry per message).
        device: where the received tensors are put (this stage's device).
        group: the pipeline's process group.

    Returns:
        The received tensors, in the order of ``sources``.

    Raises:
        ValueError: a tensor with too many dimensions or an unsupported dtype.
    """
    sends = [(t.detach().contiguous(), dst) for t, dst in sends]
    headers_in = [torch.zeros(2 + MAX_DIMS, dtype=torch.int64, device=device) for _ in sources]
    ops = [P2P("send", _header(t), dst) for t, dst in sends] + [P2P("recv", h, src)
                                                                 for h, src in zip(headers_in, sources)]
    if ops:
        exchange(ops, group, counted=False)
    received = []
    for header in headers_in:
        code, ndim, *shape = header.tolist()
        received.append(torch.empty(shape[:ndim], dtype=DTYPES[code], device=device))
    ops = [P2P("send", t, dst) for t, dst in sends] + [P2P("recv", t, src) for t, src in zip(received, sources)]
    if ops:
        exchange(ops, group)
    return received
