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


# Bytes per parameter of (parameters, gradients, optimizer state) with Adam (Rajbhandari et al. 2020, ZeRO,
# Sec. 3.1 and Table 1): "fp32" is this course's training (fp32 weights, fp32 gradients, fp32 exp_avg and
# exp_avg_sq; --precision bf16 autocasts the products but keeps these, so it is "fp32" here too); "bf16" is
# mixed-precision Adam as Megatron-LM and DeepSpeed run it: 16-bit weights and gradients, and an fp32 master
# copy of the weights with fp32 momentum and variance in the optimizer (K = 12).
BYTES_PER_PARAMETER: dict[str, tuple[int, int, int]] = {"fp32": (4, 4, 8), "bf16": (2, 2, 12)}


def model_state_bytes(stage: int, n_params: int, dp: int, precision: str = "fp32") -> dict[str, float]:
    """Per-rank bytes of ``params``, ``grads`` and ``optimizer`` state of ``n_params`` parameters under ZeRO
    ``stage`` over ``dp`` ranks with the Adam of ``precision`` (:data:`BYTES_PER_PARAMETER`):
    :func:`zero_formula_bytes` with ``p, g, k`` = 4, 4, 8 (``"fp32"``) or 2, 2, 12 (``"bf16"``, mixed precision:
    ``2 + 2 + 12 = 16`` bytes per parameter before sharding, Rajbhandari et al. 2020, Table 1).

    Raises:
        ValueError: an unknown precision or stage.
    """
    if precision not in BYTES_PER_PARAMETER:
        raise ValueError(f"precision must be one of {tuple(BYTES_PER_PARAMETER)}, not {precision!r}")
    p, g, k = BYTES_PER_PARAMETER[precision]
    return zero_formula_bytes(stage, n_params, dp, p, g, k)


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


ACTIVATION_MODELS = ("korthikanti", "course")


def layer_activation_bytes(s: int, b: int, h: int, a: int, t: int = 1, *, sequence_parallel: bool = False,
                           checkpointing: bool = False, element_bytes: int = 2, dropout: bool = True,
                           mask_bytes: int = 1, attention_scores: bool = True,
                           implementation: str = "korthikanti") -> float:
    """Bytes one transformer layer keeps for the backward pass, for one micro-batch, on one tp rank
    (Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer Models", Sec. 4).

    Per layer, in elements of ``element_bytes`` (16-bit in the paper) and, with ``dropout``, masks of
    ``mask_bytes`` (1-byte booleans on GPUs; the CPU keeps the scaled noise, an element):

    * the inputs of the two layer norms (2 sbh) and the two residual dropout masks (2 sbh masks): replicated
      over the tp ranks, split with ``sequence_parallel``;
    * the inputs of the QKV and of the first MLP projection (2 sbh): replicated; with sequence parallelism
      Megatron-LM keeps this rank's part of the sequence and gathers it again in the backward pass (``/ t``),
      the course's column-parallel layer keeps the gathered input (``implementation="course"``);
    * split over tp: Q, K, V and the output projection's input (4 sbh), the GeLU's input and the second MLP
      projection's input (4 sbh each): 12 sbh / t. The course's GPT-2 blocks use ``transformers``' tanh GeLU
      written as elementwise operations, whose autograd keeps four inner-width tensors instead of its input
      (x, tanh(.), x / 2, 1 + tanh(.)): 12 sbh / t more (``implementation="course"``);
    * attention scores (split over tp): the softmax output (a s^2 b / t), and with dropout its mask and
      output (the paper's 5 a s^2 b bytes); none with ``attention_scores=False`` (blockwise attention with
      an online softmax keeps only the log-sum-exp, as the context-parallel attention does).

    ``implementation="korthikanti"`` with 2-byte elements, 1-byte masks and dropout is Table 2:
    ``s b h (10 + 24/t + 5 a s/(h t))`` with tensor parallelism, ``s b h / t (34 + 5 a s / h)`` with
    sequence parallelism too. The layer norms' mean and inverse deviation (4 s b elements) are left out.
    With ``checkpointing`` (every layer recomputed, Sec. 4.3) a layer keeps only its input, ``s b h``
    elements (``/ t`` with sequence parallelism); recomputing one layer at a time in the backward pass
    needs one layer's full activations on top (the same call without checkpointing).

    Args:
        s: tokens per sequence (per context-parallel rank); b: sequences per micro-batch; h: hidden size;
        a: attention heads; t: tensor-parallel size.

    Returns:
        bytes (float).

    Raises:
        ValueError: an unknown implementation.
    """
    if implementation not in ACTIVATION_MODELS:
        raise ValueError(f"implementation must be one of {ACTIVATION_MODELS}, not {implementation!r}")
    e, m = element_bytes, (mask_bytes if dropout else 0)
    sp = t if sequence_parallel else 1
    sbh = s * b * h
    if checkpointing:
        return e * sbh / sp
    norms = sbh * (2 * e + 2 * m) / sp
    inputs = 2 * e * sbh / (sp if implementation == "korthikanti" else 1)
    split = 12 * e * sbh / t + (12 * e * sbh / t if implementation == "course" else 0.0)
    scores = a * s * s * b * (e + (e + m if dropout else 0)) / t if attention_scores else 0.0
    return norms + inputs + split + scores


def head_activation_bytes(s: int, b: int, h: int, vocab_size: int, t: int = 1, *, element_bytes: int = 2,
                          logits_bytes: int = 4) -> float:
    """Bytes the output layer keeps for one micro-batch on one tp rank: the final layer norm's and the LM
    head's inputs (``2 s b h`` elements; the head's input is gathered over tp) and the cross-entropy's
    softmax over this rank's ``V / t`` vocabulary entries in fp32 (``logits_bytes``; Korthikanti et al. 2022,
    Sec. 4.3: "4 s b v / t")."""
    return 2 * element_bytes * s * b * h + logits_bytes * s * b * vocab_size / t
