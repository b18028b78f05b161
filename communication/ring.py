"""Assignment 5.4.1 — all-reduce written from point-to-point messages: the ring and recursive doubling.

**Ring** (Patarasuk & Yuan 2009, "Bandwidth optimal all-reduce algorithms for clusters of
workstations"; the algorithm of NCCL and Horovod): the p ranks of the group stand in a
ring, group rank r sends to ``(r + 1) % p`` and receives from ``(r - 1) % p``. The tensor
is cut into p chunks (``torch.tensor_split``: when p does not divide the size, the first
``numel % p`` chunks are one element longer).

* *reduce-scatter*, p - 1 steps: in step s rank r sends chunk ``(r - s) % p`` to the right
  and adds the chunk ``(r - s - 1) % p`` it receives from the left into its own copy. After
  the last step rank r holds the full sum of chunk ``(r + 1) % p``.
* *all-gather*, p - 1 steps: in step s rank r sends chunk ``(r + 1 - s) % p`` (complete) to
  the right and overwrites chunk ``(r - s) % p`` with the one it receives.

Each rank sends ``2 (p - 1) / p`` of the tensor in ``2 (p - 1)`` messages, whatever p is:
the least any all-reduce can send, so the ring is the choice for large messages. Its time
is about ``2 (p - 1) (alpha + N / p * beta)``: the latency term grows with p.

**Recursive doubling** (Thakur, Rabenseifner & Gropp 2005, "Optimization of collective
communication operations in MPICH", Sec. 4): in round k rank r exchanges its whole
(partial-sum) tensor with rank ``r XOR 2**k``; after ``log2 p`` rounds every rank has the
sum. Each rank sends ``log2 p`` whole tensors (more bytes than the ring) in only ``log2 p``
messages (less latency): the choice for small messages. When p is not a power of two,
the ``p - q`` ranks above the largest power of two q first send their tensor to rank
``r - q``, which adds it; the q ranks do recursive doubling; rank ``r - q`` then sends the
result back.

**Under NCCL's rules** (docs/architecture.md, "Point-to-point under NCCL's rules"): a rank that
sends to a peer and receives from the same peer must post both together — one
``batch_isend_irecv``, here :func:`course.collectives.send_recv` — or two ranks that each send first
wait for each other's receive forever on GPUs (a ring of two: left and right are one rank; every
pairwise exchange of recursive doubling). Where one side only sends and the other only receives
(the folding of the extra ranks) plain ``isend``/``recv`` in the same order on both sides is safe.

**Order of additions.** Integers are summed exactly, so both functions equal
``dist.all_reduce`` bit for bit. Floating-point addition is not associative: the ring adds
chunk c in the order ``c+1, c+2, ..., c`` around the ring (a different order for each
chunk), recursive doubling adds pairs of partial sums, gloo adds in yet another order —
the results agree to rounding (about p * eps relative), and every rank of one call holds the
same bits.
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from course.collectives import global_rank, group_rank, group_size, isend, recv, send_recv

OPS = ("sum", "avg")


def _check(tensor: torch.Tensor, op: str) -> None:
    if op not in OPS:
        raise ValueError(f"op must be one of {OPS}, not {op!r}")
    if op == "avg" and not (tensor.is_floating_point() or tensor.is_complex()):
        raise TypeError(f"op='avg' needs a floating-point tensor (got {tensor.dtype}); "
                        "use op='sum' and divide, or convert the tensor to float first")
    if not dist.is_initialized():
        raise RuntimeError("all-reduce needs a process group: run it inside course.launch.launch")


def _finish(tensor: torch.Tensor, flat: torch.Tensor, op: str, p: int) -> torch.Tensor:
    if op == "avg":
        flat.div_(p)
    if flat.data_ptr() != tensor.data_ptr() or not tensor.is_contiguous():
        tensor.copy_(flat.view_as(tensor))
    return tensor


def _prepare(tensor: torch.Tensor, op: str, group) -> tuple[int, int, torch.Tensor]:
    """Checks, then ``(group size, rank in the group, a flat view of tensor)`` — or a flat
    contiguous copy when no flat view shares its storage (written back by :func:`_finish`)."""
    _check(tensor, op)
    flat = tensor.detach().reshape(-1)
    if not flat.is_contiguous() or flat.data_ptr() != tensor.data_ptr():
        flat = flat.contiguous().clone()
    return group_size(group), group_rank(group), flat


def ring_all_reduce(tensor: torch.Tensor, op: str = "sum", group=None, trace: list | None = None) -> torch.Tensor:
    """All-reduce ``tensor`` in place over ``group`` with the ring algorithm (send/recv only).

    Args:
        tensor: any shape and dtype, the same shape and dtype on every rank of ``group``.
        op: ``"sum"`` or ``"avg"`` (the sum divided by the group size; floating point only).
        group: the process group (None: the world). Peers are addressed by global rank.
        trace: if a list, one dict per message this rank sends is appended:
            ``{"phase": "reduce_scatter"|"all_gather", "step", "rank", "send_chunk",
            "recv_chunk", "dst", "src"}`` (group ranks), for drawing the ring.

    Returns:
        ``tensor`` (same shape), now holding the sum (or mean) over the group on every rank.

    Raises:
        ValueError: unknown ``op``. TypeError: ``op="avg"`` on an integer tensor.
        RuntimeError: no process group.
    """
    p, r, flat = _prepare(tensor, op, group)
    if p == 1:
        return _finish(tensor, flat, op, p)
    # BEGIN ASSIGN5_4_1
    chunks = torch.tensor_split(flat, p)          # views into flat; sizes differ by at most one
    right, left = global_rank(group, (r + 1) % p), global_rank(group, (r - 1) % p)
    for phase in ("reduce_scatter", "all_gather"):
        for step in range(p - 1):
            if phase == "reduce_scatter":
                send_c, recv_c = (r - step) % p, (r - step - 1) % p
            else:
                send_c, recv_c = (r + 1 - step) % p, (r - step) % p
            if trace is not None:
                trace.append({"phase": phase, "step": step, "rank": r, "send_chunk": send_c, "recv_chunk": recv_c,
                              "dst": (r + 1) % p, "src": (r - 1) % p})
            # one batch: with p = 2 left and right are the same rank, which sends to us as we send to it
            incoming = send_recv(chunks[send_c].contiguous(), right, torch.empty_like(chunks[recv_c]), left, group)
            if phase == "reduce_scatter":
                chunks[recv_c].add_(incoming)
            else:
                chunks[recv_c].copy_(incoming)
    # END ASSIGN5_4_1
    return _finish(tensor, flat, op, p)


def tree_all_reduce(tensor: torch.Tensor, op: str = "sum", group=None) -> torch.Tensor:
    """All-reduce ``tensor`` in place over ``group`` by recursive doubling (send/recv only).

    Any group size: when p is not a power of two, the ranks above the largest power of
    two q fold their tensor into rank ``r - q`` first and get the result back at the end
    (Thakur et al. 2005, Sec. 4). Partial sums are always added lower rank first, so every
    rank ends with the same bits.

    Args, Returns, Raises: as :func:`ring_all_reduce` (no ``trace``).
    """
    p, r, flat = _prepare(tensor, op, group)
    if p == 1:
        return _finish(tensor, flat, op, p)
    # BEGIN ASSIGN5_4_1
    q = 1 << (p.bit_length() - 1)                 # largest power of two <= p
    buf = torch.empty_like(flat)
    if r >= q:                                     # extra rank: fold into r - q, wait for the result
        isend(flat, global_rank(group, r - q), group=group).wait()
        recv(flat, global_rank(group, r - q), group=group)
        return _finish(tensor, flat, op, p)
    if r + q < p:                                  # partner of an extra rank: add its tensor (lower rank first)
        recv(buf, global_rank(group, r + q), group=group)
        flat.add_(buf)
    k = 1
    while k < q:
        peer = global_rank(group, r ^ k)
        send_recv(flat, peer, buf, peer, group)    # both ranks send and receive: one batch
        if r ^ k < r:                               # the same order of addition on both sides
            flat.copy_(buf.add_(flat))
        else:
            flat.add_(buf)
        k <<= 1
    if r + q < p:
        isend(flat, global_rank(group, r + q), group=group).wait()
    # END ASSIGN5_4_1
    return _finish(tensor, flat, op, p)
