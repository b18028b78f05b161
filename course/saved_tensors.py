"""The one counter of activation memory: the bytes autograd saves for the backward pass, counted by storage.

On the CPU there is no allocator that says who holds what, so the course counts bytes **by storage**:
two tensors that view one storage (a parameter that is a view of a flat buffer, a tied embedding and
LM head, a tensor saved by two operations) count once, with the storage's full size, and a freed storage
(resized to 0 bytes) counts 0 (:func:`storage_bytes`). Activations are what autograd saves for the
backward pass while :class:`SavedTensorBytes` is active (``torch.autograd.graph.saved_tensors_hooks``);
the same measure on every device.

Used by the pipeline's stage runner (each micro-batch's activations, ``StepResult.peak_activation_bytes``),
the memory part (activations next to parameters, gradients and optimizer state; activation
checkpointing) and the tensor-parallel part (per transformer block, against Korthikanti et al. 2022,
Sec. 4.2, Table 2).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterable

import torch


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


@dataclass
class SavedStorage:
    """One storage autograd saved: its bytes, the dtype and shape of the tensor it was last saved as
    (under this key), the ``key`` it was saved under, and whether it is excluded (a parameter's)."""

    nbytes: int
    dtype: str
    shape: tuple
    key: object
    excluded: bool


class SavedTensorBytes:
    """Counts the bytes autograd saves for the backward pass while active (``with SavedTensorBytes() as s:``).

    Each saved tensor's storage is counted once (``bytes``), so a tensor saved by two operations, or a
    parameter saved by every layer that uses it, counts once; ``parameter_bytes`` is the part that
    belongs to the storages of ``exclude`` (e.g. the parameters), which are not activations;
    ``activation_bytes = bytes - parameter_bytes``.

    Args:
        exclude: tensors whose storages are not activations (the parameters), or a function returning
            them, called again whenever a storage not seen before is saved (ZeRO-3 allocates a layer's full
            parameters just before its forward pass).
        key: ``key()`` is called at each save and each storage is kept in :attr:`storages` under it;
            :meth:`bytes_by_key` adds them up per key, each storage once per key (e.g. the transformer
            block running, set by forward hooks; None: outside any). Without ``key`` only the totals
            are kept (the cheapest count, as the stage runner needs it for every micro-batch).

    Attributes:
        count: tensors saved (a storage saved twice counts twice here).
        storages: with ``key``: ``{(key, storage pointer): SavedStorage}``.
    """

    def __init__(self, exclude: Iterable[torch.Tensor] | Callable[[], Iterable[torch.Tensor]] = (),
                 key: Callable[[], object] | None = None):
        self._exclude = exclude
        self._key = key
        self._excluded: set[int] = set()
        self._seen: set[int] = set()
        self.storages: dict[tuple, SavedStorage] = {}
        self.bytes = 0
        self.parameter_bytes = 0
        self.count = 0

    def _exclusions(self) -> set[int]:
        tensors = self._exclude() if callable(self._exclude) else self._exclude
        return {t.untyped_storage().data_ptr() for t in tensors if t.untyped_storage().nbytes()}

    def _pack(self, t: torch.Tensor) -> torch.Tensor:
        s = t.untyped_storage()
        ptr = s.data_ptr()
        self.count += 1
        new = ptr not in self._seen
        if new and callable(self._exclude):
            self._excluded = self._exclusions()
        excluded = ptr in self._excluded
        if new:
            self._seen.add(ptr)
            self.bytes += s.nbytes()
            if excluded:
                self.parameter_bytes += s.nbytes()
        if self._key is not None:
            key = self._key()
            self.storages[(key, ptr)] = SavedStorage(s.nbytes(), str(t.dtype).replace("torch.", ""), tuple(t.shape),
                                                     key, excluded)
        return t

    @property
    def activation_bytes(self) -> int:
        return self.bytes - self.parameter_bytes

    def bytes_by_key(self, activations_only: bool = True) -> dict:
        """``{key: bytes}``: the storages saved under each key (each once per key; parameters left out
        unless ``activations_only`` is False)."""
        out: dict = {}
        for (key, _), s in self.storages.items():
            if activations_only and s.excluded:
                continue
            out[key] = out.get(key, 0) + s.nbytes
        return out

    def __enter__(self) -> "SavedTensorBytes":
        if not callable(self._exclude):
            self._exclude = list(self._exclude)
            self._excluded = self._exclusions()
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, lambda t: t)
        self._hooks.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self._hooks.__exit__(*exc)
