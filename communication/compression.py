"""Assignment 5.4.3 — gradient compression: top-k sparsification with error feedback, and PowerSGD.

**Top-k with error feedback** (Stich, Cordonnier & Jaggi 2018, "Sparsified SGD with Memory";
Lin et al. 2018, "Deep Gradient Compression", Sec. 3.1): each rank sends only the k entries
of largest magnitude of ``g + e`` (its gradient plus the *residual* e of what it did not send
before) and keeps the rest, ``e <- (g + e) - sent``, for the next step. Nothing is lost, only
delayed: the sum of what was sent over the steps plus the residual equals the sum of the
gradients. Without the residual (plain top-k) small coordinates are never sent and training
stalls or diverges. A rank sends k values and k indices instead of n values.

**PowerSGD** (Vogels, Karimireddy & Jaggi 2019, "PowerSGD: Practical Low-Rank Gradient
Compression for Distributed Optimization", Alg. 1): a gradient matrix M (n x m) is replaced by
a rank-r product P Q^T from one step of power iteration, ``P = M Q; all-reduce P;
orthogonalize P; Q = M^T P; all-reduce Q``, with error feedback and Q reused (warm start) from
the step before: it sends r (n + m) numbers instead of n m. The reference is torch's
``torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook`` on a DDP model;
:class:`PowerSGDReducer` is the same algorithm on our own data-parallel loop (per tensor, not
per DDP bucket), compared with it in notebooks/04_communication.ipynb.
"""
from __future__ import annotations

import torch
import torch.distributed as dist


def topk_compress(grad: torch.Tensor, residual: torch.Tensor, ratio: float
                  ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Top-k of ``grad + residual`` by magnitude, and the new residual (error feedback).

    Args:
        grad: this step's gradient, any shape.
        residual: what was not sent before, the shape of ``grad`` (zeros at the first step).
        ratio: fraction of the entries to send, 0 < ratio <= 1; k = max(1, ceil(ratio * numel)).

    Returns:
        ``(indices, values, new_residual)``: ``indices`` (k,) int64 into the flattened tensor,
        ``values`` (k,) the entries of ``grad + residual`` there, ``new_residual`` (shape of
        ``grad``) = ``grad + residual`` with those k entries set to zero.

    Raises:
        ValueError: ``ratio`` outside (0, 1].
    """
    if not 0 < ratio <= 1:
        raise ValueError(f"top-k ratio must be in (0, 1], not {ratio}")
    k = max(1, int(-(-ratio * grad.numel() // 1)))
    indices = values = new_residual = None
    # BEGIN ASSIGN5_4_3
    acc = (grad + residual).reshape(-1)
    indices = acc.abs().topk(k, sorted=False).indices
    values = acc[indices]
    new_residual = acc.clone()
    new_residual[indices] = 0
    new_residual = new_residual.view_as(grad)
    # END ASSIGN5_4_3
    return indices, values, new_residual


def topk_decompress(indices: torch.Tensor, values: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """The dense tensor (shape and dtype of ``like``) with ``values`` (k,) at the flat ``indices`` (k,), zeros
    elsewhere: one rank's top-k (:func:`topk_compress`), whose indices are distinct — each entry is written
    once, the same on every device (several ranks' top-k are summed by :func:`topk_sum`)."""
    out = torch.zeros(like.numel(), dtype=values.dtype, device=values.device)
    out[indices] = values
    return out.view_as(like)


def topk_sum(parts: list[tuple[torch.Tensor, torch.Tensor]], like: torch.Tensor) -> torch.Tensor:
    """The dense sum (shape and dtype of ``like``) of several ranks' top-k, ``parts[r] = (indices, values)`` of
    group rank r (each with distinct indices, :func:`topk_compress`), **added in rank order**.

    A coordinate chosen by several ranks is ``((v_0 + v_1) + v_2) + ...`` over the ranks that chose it, in
    rank order, on every rank and every device, so the replicas stay bitwise equal. (One ``index_add_``
    of all the pairs concatenated would add repeated indices with CUDA atomics, in an order that varies
    from run to run and from rank to rank: with three or more ranks the replicas drift apart in the last
    bits: ``torch.use_deterministic_algorithms`` lists ``index_add`` on CUDA as nondeterministic.)
    """
    total = torch.zeros(like.numel(), dtype=like.dtype, device=like.device)
    for indices, values in parts:  # rank order; one rank's indices are distinct: read, add, write back once each
        total[indices] += values
    return total.view_as(like)


class TopKReducer:
    """Data-parallel gradient averaging with top-k sparsification and error feedback.

    In :meth:`finish` every gradient is compressed with :func:`topk_compress` (one residual per
    parameter, kept on this rank), the (indices, values) of all ranks are all-gathered in
    ``group`` and summed into a dense gradient, in rank order (:func:`topk_sum`: the same bits on
    every rank, so the replicas stay equal), divided by the group size. ``bytes_sent``
    counts what this rank put on the wire per step (values and int64 indices), ``dense_bytes``
    what the uncompressed gradients would be.

    Args:
        model: this rank's replica. group: the data-parallel group. ratio: see :func:`topk_compress`.
    """

    def __init__(self, model: torch.nn.Module, group=None, ratio: float = 0.01):
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.group, self.ratio = group, ratio
        self.world_size = dist.get_world_size(group)
        self.residuals = [torch.zeros_like(p) for p in self.params]
        self.bytes_sent = self.dense_bytes = 0

    def before_backward(self) -> None:
        pass

    def finish(self) -> None:
        self.bytes_sent = self.dense_bytes = 0
        for i, p in enumerate(self.params):
            grad = p.grad if p.grad is not None else torch.zeros_like(p)
            idx, val, self.residuals[i] = topk_compress(grad, self.residuals[i], self.ratio)
            idxs = [torch.empty_like(idx) for _ in range(self.world_size)]
            vals = [torch.empty_like(val) for _ in range(self.world_size)]
            dist.all_gather(idxs, idx, group=self.group)
            dist.all_gather(vals, val, group=self.group)
            dense = topk_sum(list(zip(idxs, vals)), p) / self.world_size  # rank order: bitwise equal replicas
            p.grad = dense
            self.bytes_sent += idx.numel() * idx.element_size() + val.numel() * val.element_size()
            self.dense_bytes += p.numel() * p.element_size()


def _orthogonalize(m: torch.Tensor) -> torch.Tensor:
    """Orthonormal columns spanning ``m`` (n x r), by QR (``torch.linalg.qr``). torch's hook uses Gram-Schmidt
    at rank <= 2 and QR above: the same columns up to sign and rounding."""
    q, _ = torch.linalg.qr(m, mode="reduced")
    return q


class PowerSGDReducer:
    """Data-parallel gradient averaging with PowerSGD (Vogels et al. 2019, Alg. 1), rank ``rank``.

    Gradients of matrices (2-D, or more dims viewed as (shape[0], rest)) larger than rank
    ``rank`` are compressed with error feedback and a warm-started Q; vectors (biases,
    LayerNorm) are all-reduced uncompressed, as torch's ``powerSGD_hook`` does. Before
    ``start_iter`` steps, everything is all-reduced uncompressed (torch's
    ``start_powerSGD_iter``). ``bytes_sent`` / ``dense_bytes`` per step as in :class:`TopKReducer`.

    Args:
        model: this rank's replica. group: the data-parallel group. rank: the matrix rank r.
        start_iter: uncompressed steps first. seed: the same random Q on every rank.
    """

    def __init__(self, model: torch.nn.Module, group=None, rank: int = 1, start_iter: int = 0, seed: int = 0):
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.group, self.rank, self.start_iter = group, rank, start_iter
        self.world_size = dist.get_world_size(group)
        self.step = 0
        g = torch.Generator().manual_seed(seed)
        self.error, self.q = {}, {}
        for i, p in enumerate(self.params):
            if p.dim() >= 2 and min(p.shape[0], p[0].numel()) > rank:
                # On the parameter's device (NCCL all-reduces P and Q); Q drawn on the host from the seeded
                # generator, so every rank and every device starts from the same numbers.
                self.error[i] = torch.zeros(p.shape[0], p[0].numel(), dtype=p.dtype, device=p.device)
                self.q[i] = torch.randn(p[0].numel(), rank, generator=g, dtype=p.dtype, device="cpu").to(p.device)
        self.bytes_sent = self.dense_bytes = 0

    def before_backward(self) -> None:
        pass

    def _all_reduce_mean(self, t: torch.Tensor) -> torch.Tensor:
        dist.all_reduce(t, group=self.group)
        t /= self.world_size
        self.bytes_sent += t.numel() * t.element_size()
        return t

    def finish(self) -> None:
        self.bytes_sent = self.dense_bytes = 0
        compress = self.step >= self.start_iter
        for i, p in enumerate(self.params):
            if p.grad is None:
                p.grad = torch.zeros_like(p)
            self.dense_bytes += p.numel() * p.element_size()
            if not compress or i not in self.q:
                self._all_reduce_mean(p.grad)
                continue
            m = p.grad.reshape(p.shape[0], -1) + self.error[i]
            pm = self._all_reduce_mean(m @ self.q[i])
            pm = _orthogonalize(pm)
            qm = self._all_reduce_mean(m.t() @ pm)
            approx = pm @ qm.t()
            self.error[i] = m - approx
            self.q[i] = qm
            p.grad.copy_(approx.view_as(p))
        self.step += 1


def build_grad_sync(config, model: torch.nn.Module, group):
    """The gradient synchroniser the options of ``project/run_data_parallel.py`` ask for.

    ``--compression topk`` -> :class:`TopKReducer` (``--topk_ratio``), ``powersgd`` ->
    :class:`PowerSGDReducer` (``--powersgd_rank``); otherwise a
    :class:`communication.buckets.BucketedReducer` of ``--bucket_mb`` MB (25 if not given)
    with ``--overlap`` (:func:`data_parallel.training.dp_training` calls it on every rank).
    """
    from communication.buckets import BucketedReducer

    compression = config.compression
    if compression == "topk":
        return TopKReducer(model, group=group, ratio=config.topk_ratio)
    if compression == "powersgd":
        return PowerSGDReducer(model, group=group, rank=config.powersgd_rank)
    return BucketedReducer(model, group=group, bucket_mb=config.bucket_mb or 25.0, overlap=config.overlap)
