"""Memory arithmetic from the papers: model state of Adam training per ZeRO stage, what fits on a
device, and the activations of one transformer layer. Plain arithmetic (no torch): the notebook
checks each formula against bytes measured on the course's model.

Model state (Rajbhandari et al. 2020, "ZeRO: Memory Optimizations Toward Training Trillion Parameter
Models", Sec. 3.1; per ZeRO stage Sec. 5, Fig. 1 and Table 1). Bytes per parameter:

* ``"fp32"`` Adam, as this course trains: parameter 4, gradient 4, Adam's two moments 4 + 4 = 8.
* ``"mixed"`` precision Adam: fp16/bf16 parameter 2, fp16/bf16 gradient 2, and the optimizer's
  fp32 state ``K = 12``: the fp32 *master* copy of the parameter 4, momentum 4, variance 4.
  Total 16 bytes per parameter: the paper's 1.5B GPT-2 needs at least 24 GB.

Activations (Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer
Models", Sec. 4.1, Eqs. 1-3, Sec. 5 and Table 2), per layer, for sequence ``s``, micro-batch ``b``,
width ``h``, ``a`` heads, tensor-parallel size ``t``, 16-bit values and 1-byte dropout masks:
``s b h (34 + 5 a s / h)`` on one device. :func:`activation_bytes_per_layer` keeps the paper's
tensor-by-tensor count but lets the bytes of a value (4 in fp32) and of a mask (0 without dropout) vary.
"""
from __future__ import annotations

from memory.accounting import zero_formula_bytes

ADAM_BYTES_PER_PARAMETER = {"fp32": {"params": 4, "grads": 4, "optimizer": 8},
                            "mixed": {"params": 2, "grads": 2, "optimizer": 12}}
RECOMPUTE = ("none", "selective", "full")


def adam_bytes_per_parameter(precision: str = "mixed") -> dict[str, int]:
    """Bytes per parameter of parameters, gradients and optimizer state for Adam in ``precision``
    (``"mixed"``: 2 + 2 + 12, ZeRO Sec. 3.1; ``"fp32"``: 4 + 4 + 8).

    Raises:
        ValueError: ``precision`` not ``"mixed"`` or ``"fp32"``.
    """
    if precision not in ADAM_BYTES_PER_PARAMETER:
        raise ValueError(f"precision must be one of {sorted(ADAM_BYTES_PER_PARAMETER)}, not {precision!r}")
    return dict(ADAM_BYTES_PER_PARAMETER[precision])


def model_state_bytes(stage: int, n_params: int, dp: int, precision: str = "mixed") -> dict[str, float]:
    """Per-rank bytes ``{"params", "grads", "optimizer"}`` of Adam training of ``n_params`` parameters
    with ZeRO ``stage`` (0 = plain data parallelism) over ``dp`` ranks (ZeRO Sec. 5, Fig. 1:
    for Ψ = 7.5e9, dp = 64, mixed precision: 120, 31.4, 16.6 and 1.9 GB for stages 0-3).

    Raises:
        ValueError: a stage outside 0..3, ``dp < 1``, or an unknown precision.
    """
    if dp < 1:
        raise ValueError(f"dp must be >= 1, not {dp}")
    b = adam_bytes_per_parameter(precision)
    return zero_formula_bytes(stage, n_params, dp, b["params"], b["grads"], b["optimizer"])


def what_fits_grid(models: dict[str, int], device_bytes: float, stages=(0, 1, 2, 3), dps=(1, 2, 4, 8, 16, 64),
                   precision: str = "mixed") -> list[dict]:
    """One row per (model, stage, dp): ``{"model", "n_params", "stage", "dp", "bytes_per_rank",
    "fits"}`` — whether the model state alone (no activations, buffers or fragmentation: a
    necessary condition, not a sufficient one) fits in ``device_bytes`` per rank."""
    rows = []
    for name, n in models.items():
        for stage in stages:
            for dp in dps:
                total = sum(model_state_bytes(stage, n, dp, precision).values())
                rows.append({"model": name, "n_params": n, "stage": stage, "dp": dp,
                             "bytes_per_rank": total, "fits": total <= device_bytes})
    return rows


def activation_bytes_per_layer(s: int, b: int, h: int, a: int, t: int = 1, sequence_parallel: bool = False,
                               recompute: str = "none", value_bytes: float = 2, mask_bytes: float = 1) -> float:
    """Bytes one transformer layer keeps for the backward pass (Korthikanti et al. 2022, Sec. 4-5, Table 2).

    The paper's count, tensor by tensor, in units of ``s·b·h`` (``e = value_bytes``, ``m = mask_bytes``):
    attention: input of Q/K/V ``e``, Q and K ``2e``, V ``e``, input of the output projection ``e``,
    its dropout mask ``m``, and per head ``s·s`` softmax output ``e``, its dropout mask ``m`` and
    the dropped-out scores ``e`` (``(2e + m)·a·s/h``); MLP: input ``e``, the two ``4h``-wide
    tensors ``8e``, dropout mask ``m``; two layer norms' inputs ``2e``. With ``e = 2, m = 1``:
    ``34 + 5 a s / h``.

    * tensor parallelism over ``t``: the attention and MLP insides (``12e`` and the ``s·s`` part)
      are split, the rest (``4e + 2m``) is not: Eq. 2, ``10 + 24/t + 5 a s/(h t)``;
    * with ``sequence_parallel`` everything is split: Eq. 3, ``(34 + 5 a s/h) / t``;
    * ``recompute="selective"`` drops the ``s·s`` part (recomputed; Sec. 5, Eq. 6);
    * ``recompute="full"`` keeps only the layer's input, ``e`` (``2 s b h``; split by ``t`` with SP).

    Raises:
        ValueError: an unknown ``recompute`` or a non-positive size.
    """
    if recompute not in RECOMPUTE:
        raise ValueError(f"recompute must be one of {RECOMPUTE}, not {recompute!r}")
    if min(s, b, h, a, t) < 1:
        raise ValueError(f"s, b, h, a and t must be >= 1, got s={s} b={b} h={h} a={a} t={t}")
    e, m = value_bytes, mask_bytes
    sbh = s * b * h
    if recompute == "full":
        return e * sbh / (t if sequence_parallel else 1)
    unsplit = 4 * e + 2 * m
    split = 12 * e + (0 if recompute == "selective" else (2 * e + m) * a * s / h)
    return sbh * ((unsplit + split) / t if sequence_parallel else unsplit + split / t)
