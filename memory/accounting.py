"""Memory measured, not estimated: bytes held per category, counted by storage, and the ZeRO formulas.

On the CPU there is no allocator that says who holds what, so a category's bytes are the
sizes of the tensors it holds, **counted by storage**: two tensors that view one storage (a
parameter that is a view of a flat buffer, a tied embedding and LM head) count once, with
the storage's full size (the padding of a flat buffer included), and a freed storage
(resized to 0 bytes) counts 0. Activations are what autograd saves for the backward pass,
counted by :class:`SavedTensorBytes` (``torch.autograd.graph.saved_tensors_hooks``). The
process's peak resident set size (``resource.getrusage``, :func:`course.measure.peak_rss_bytes`; on a GPU
``torch.cuda.max_memory_allocated``, :class:`course.measure.MemoryMeter`) is reported beside them: it
includes the Python interpreter, the libraries and the allocator's caches, so it is an upper
bound that moves with the categories but never equals their sum.

The ZeRO paper's per-rank model-state bytes (Rajbhandari et al. 2020, Sec. 5, Fig. 1), for
Ψ parameters, dp ranks, and ``p``/``g``/``k`` bytes of parameter, gradient and optimizer
state per parameter (mixed-precision Adam: 2 + 2 + 12; fp32 Adam as in this course: 4 + 4 + 8):

    ZeRO-0 (DP): (p + g + k) Ψ      ZeRO-1: (p + g) Ψ + k Ψ / dp
    ZeRO-2: p Ψ + (g + k) Ψ / dp    ZeRO-3: (p + g + k) Ψ / dp
"""
from __future__ import annotations

import torch

from course.measure import peak_rss_bytes  # noqa: F401 (the CPU's memory measure, course.measure)


def storage_bytes(tensors) -> int:
    """Bytes of the distinct storages behind ``tensors`` (None entries skipped; each storage once,
    whole; a storage resized to 0 counts 0)."""
    seen, total = set(), 0
    for t in tensors:
        if t is None:
            continue
        s = t.untyped_storage()
        key = (s.data_ptr(), s.nbytes()) if s.nbytes() else ("empty", id(s))
        if key in seen:
            continue
        seen.add(key)
        total += s.nbytes()
    return total


class SavedTensorBytes:
    """Counts the bytes autograd saves for the backward pass while active (``with SavedTensorBytes() as s:``).

    Each saved tensor's storage is counted once (``bytes``), so a tensor saved by two operations,
    or a parameter saved by every layer that uses it, counts once; ``parameter_bytes`` is the
    part that belongs to storages listed in ``exclude`` (e.g. the parameters), which are not
    activations. ``activation_bytes = bytes - parameter_bytes``.
    """

    def __init__(self, exclude=()):
        self._exclude = list(exclude)  # storages looked up at each save: ZeRO-3 re-allocates them
        self._seen: set[int] = set()
        self.bytes = 0
        self.parameter_bytes = 0
        self.count = 0

    def _pack(self, t):
        s = t.untyped_storage()
        ptr = s.data_ptr()
        self.count += 1
        if ptr not in self._seen:
            self._seen.add(ptr)
            self.bytes += s.nbytes()
            if any(e.untyped_storage().data_ptr() == ptr for e in self._exclude if e.untyped_storage().nbytes()):
                self.parameter_bytes += s.nbytes()
        return t

    @property
    def activation_bytes(self) -> int:
        return self.bytes - self.parameter_bytes

    def __enter__(self):
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, lambda t: t)
        self._hooks.__enter__()
        return self

    def __exit__(self, *exc):
        self._hooks.__exit__(*exc)


def zero_formula_bytes(stage: int, n_params: int, dp: int, p: int = 4, g: int = 4, k: int = 8) -> dict[str, float]:
    """Per-rank bytes of parameters, gradients and optimizer state for ZeRO ``stage`` (0 = plain DP),
    from the ZeRO paper (Sec. 5, Fig. 1); ``p``/``g``/``k`` bytes per parameter (fp32 Adam: 4/4/8).

    Raises:
        ValueError: stage not in 0..3.
    """
    if stage not in (0, 1, 2, 3):
        raise ValueError(f"--zero must be 0, 1, 2 or 3, not {stage}")
    psi = n_params
    return {"params": p * psi / (dp if stage >= 3 else 1),
            "grads": g * psi / (dp if stage >= 2 else 1),
            "optimizer": k * psi / (dp if stage >= 1 else 1)}


def optimizer_state_tensors(optimizer) -> list[torch.Tensor]:
    """The tensors of a ``torch.optim`` optimizer's state (Adam: step, exp_avg, exp_avg_sq per parameter)."""
    inner = getattr(optimizer, "optimizer", optimizer)
    return [t for state in inner.state.values() for t in state.values() if torch.is_tensor(t)]


def what_fits(n_params: int, dp: int, device_bytes: float, p: float, g: float, k: float) -> dict[int, bool]:
    """``{stage: fits}``: whether the model state of ``n_params`` parameters fits in ``device_bytes``
    per rank for each ZeRO stage at ``dp`` ranks, with ``p``/``g``/``k`` bytes per parameter
    (activations, buffers and fragmentation not included: a necessary condition, not a sufficient one)."""
    return {stage: sum(zero_formula_bytes(stage, n_params, dp, p, g, k).values()) <= device_bytes
            for stage in (0, 1, 2, 3)}
