"""Choosing ``(dp, pp, tp)``: rank the factorisations by prediction and by measurement, and MFU.

Notebook 06 predicts each factorisation's step time and memory per rank with the planner
(``project/plan.py``), measures them (:mod:`three_d.factorisation_benchmark`) and compares the two
orders with :func:`compare_rankings`. :func:`mfu` is the field's model FLOPs utilisation and
:data:`PUBLISHED` the figures papers report for large GPU runs.
"""
from __future__ import annotations


def ranks(values: dict, *, largest_first: bool = False) -> dict:
    """``{key: place}`` with place 1 for the smallest value (the largest with ``largest_first``); ties share the
    better place."""
    order = sorted(values.values(), reverse=largest_first)
    return {k: order.index(v) + 1 for k, v in values.items()}


def spearman(a: dict, b: dict) -> float:
    """Spearman's rank correlation of two ``{key: place}`` over their common keys (1: the same order, -1: the
    reverse; ``nan`` with fewer than two keys or a constant ranking)."""
    keys = [k for k in a if k in b]
    if len(keys) < 2:
        return float("nan")
    xs, ys = [a[k] for k in keys], [b[k] for k in keys]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    sxy = sum((x - mx) * (y - my) for x, y in zip(xs, ys))
    sxx, syy = sum((x - mx) ** 2 for x in xs), sum((y - my) ** 2 for y in ys)
    return sxy / (sxx * syy) ** 0.5 if sxx and syy else float("nan")


def compare_rankings(predicted: dict, measured: dict, quantity: str) -> list[dict]:
    """One row per key of ``predicted`` and ``measured`` (``{(dp, pp, tp): value}``, smaller is better: seconds
    or bytes): both values, their ratio ``predicted / measured`` and both places. Sorted by measured place.

    Raises:
        ValueError: the two do not hold the same factorisations.
    """
    if set(predicted) != set(measured):
        raise ValueError(f"predicted and measured {quantity} cover different factorisations: "
                         f"{sorted(set(predicted) ^ set(measured))}")
    p_rank, m_rank = ranks(predicted), ranks(measured)
    rows = [{"dp·pp·tp": "·".join(map(str, key)), f"predicted {quantity}": predicted[key],
             f"measured {quantity}": measured[key], "predicted / measured": predicted[key] / measured[key],
             "predicted place": p_rank[key], "measured place": m_rank[key]} for key in predicted]
    return sorted(rows, key=lambda r: (r["measured place"], r["predicted place"]))


def mfu(model_flops_per_step: float, step_s: float, n_devices: int, peak_flops: float) -> float:
    """Model FLOPs utilisation: the model's FLOPs of one step (forward and backward, ``6 N`` per token plus
    attention, recomputation not counted) over what ``n_devices`` devices at ``peak_flops`` FLOP/s each could
    do in ``step_s`` seconds (Chowdhery et al. 2022, PaLM, App. B).

    Raises:
        ValueError: a non-positive time, device count or peak.
    """
    if step_s <= 0 or n_devices < 1 or peak_flops <= 0:
        raise ValueError(f"mfu needs step_s > 0, n_devices >= 1 and peak_flops > 0 (got {step_s}, {n_devices}, "
                         f"{peak_flops})")
    return model_flops_per_step / (step_s * n_devices * peak_flops)


def megatron_flops_per_step(batch: int, seq: int, layers: int, hidden: int, vocab: int, *,
                            recomputation: bool = True) -> float:
    """FLOPs of one training step of a GPT as Narayanan et al. 2021 count them (Sec. 5.1):
    ``96 B s l h^2 (1 + s / 6h + V / 16 l h)`` with full activation recomputation (the forward pass runs twice:
    hardware FLOPs); without it (``recomputation=False``) the blocks' forward runs once:
    ``72 B s l h^2 (1 + s / 6h) + 6 B s h V`` — the model FLOPs MFU counts."""
    blocks = 72.0 * batch * seq * layers * hidden ** 2 * (1 + seq / (6 * hidden))
    if recomputation:
        blocks *= 96.0 / 72.0
    return blocks + 6.0 * batch * seq * hidden * vocab


# Published utilisation of large runs; "counted" says which FLOPs the numerator holds.
PUBLISHED = [
    {"run": "Megatron-LM, 1T-parameter GPT, 3072 A100 (dp 6 x pp 64 x tp 8)", "utilisation": 0.52,
     "counted": "hardware FLOPs: 96 B s l h^2 (...) counts the recomputed forward pass",
     "source": "Narayanan et al. 2021, Table 1 and Sec. 5.1 (163 TFLOP/s per GPU of 312)"},
    {"run": "PaLM 540B, 6144 TPU v4", "utilisation": 0.462, "counted": "model FLOPs (MFU)",
     "source": "Chowdhery et al. 2022, Table 3 and App. B (57.8% counting rematerialisation: HFU)"},
    {"run": "GPT-3 175B, V100 (as PaLM estimates it)", "utilisation": 0.213, "counted": "model FLOPs (MFU)",
     "source": "Chowdhery et al. 2022, Table 3"},
]
