"""Which assumption moves a prediction most, and what a whole training run would take and cost.

:func:`sensitivity` predicts a configuration again with one of the planner's figures moved by a stated factor at a
time — the compute peak (every FLOP-bound kernel), the memory bandwidth reached, each link's bus bandwidth, the
micro-batch size — and reports how much the step moves. :func:`time_to_train` turns a prediction into the days and
GPU-hours of a run of ``D`` tokens (Kaplan et al. 2020: ``C = 6 N D`` FLOPs, N the parameters that multiply; the
days at the predicted MFU) and a cost at a price per GPU-hour, which is an assumption the caller states (no price
is built in).
"""
from __future__ import annotations

from dataclasses import replace

FACTOR = 0.10  # each figure moved down and up by 10 %


def _predict(config, hardware):
    from project.planner.step import predict

    return predict(config, hardware).step_s


def scaled_links(hardware, factor: float):
    """``hardware`` with every link's achievable bus bandwidth times ``factor``."""
    def scale(link):
        return None if link is None else replace(link, efficiency=link.efficiency * factor)

    notes = dict(hardware.notes)
    if "pcie" in notes:
        notes["pcie"] = scale(notes["pcie"])
    return replace(hardware, intra=scale(hardware.intra), inter=scale(hardware.inter), notes=notes)


def sensitivity(config, hardware, factor: float = FACTOR) -> list[dict]:
    """Rows ``{"assumption", "low", "high"}``: the step's relative change when one figure is ``1 - factor`` and
    ``1 + factor`` times the planner's (ordered by the larger change): the compute peak, the memory bandwidth, the
    links' bus bandwidth, and the micro-batch (half and twice the sequences per micro-batch; None where the batch
    does not split so)."""
    from project.planner.config import PlanConfig

    base = _predict(config, hardware)
    rows = []
    for name, make in (("compute peak (GEMMs and attention)",
                        lambda f: replace(hardware, peak_flops={k: v * f for k, v in hardware.peak_flops.items()})),
                       ("memory bandwidth reached",
                        lambda f: replace(hardware, memory_efficiency=hardware.memory_efficiency * f)),
                       ("links' bus bandwidth", lambda f: scaled_links(hardware, f))):
        low, high = (_predict(config, make(f)) / base - 1 for f in (1 - factor, 1 + factor))
        rows.append({"assumption": f"{name} x{1 - factor:g} / x{1 + factor:g}", "low": low, "high": high})
    m = config.micro_batches
    changed = []
    for micro in (m * 2, m // 2):  # half / twice the sequences per micro-batch
        try:
            values = config.record() | {"micro_batches": micro}
            changed.append(_predict(PlanConfig.for_test(**values), hardware) / base - 1 if micro >= 1 else None)
        except ValueError:  # a batch that does not split so (course.config.ConfigError)
            changed.append(None)
    if any(c is not None for c in changed):
        rows.append({"assumption": "sequences per micro-batch x0.5 / x2", "low": changed[0], "high": changed[1]})
    return sorted(rows, key=lambda r: -max(abs(r["low"] or 0), abs(r["high"] or 0)))


def time_to_train(config, prediction, tokens: float, price_per_gpu_hour: float) -> dict:
    """A run of ``tokens`` tokens at the predicted step: ``{"parameters" (N), "flops" (6 N D), "days" (D over the
    predicted tokens/s), "days_from_mfu" (6 N D over the devices' peak times the predicted MFU: the rule of thumb,
    shorter than ``days`` by attention's share of the model FLOPs, which 6 N D leaves out), "gpu_hours", "cost"
    (at ``price_per_gpu_hour``, the caller's stated assumption)}``."""
    model = config.model
    n = sum(model.matmul_weights(config.vocab_size).values())
    flops = 6.0 * n * tokens
    seconds = tokens / (prediction.tokens / prediction.step_s)
    seconds_mfu = flops / (config.devices * prediction.peak_flops * prediction.mfu)
    gpu_hours = seconds / 3600 * config.devices
    return {"parameters": n, "flops": flops, "days": seconds / 86400, "days_from_mfu": seconds_mfu / 86400,
            "gpu_hours": gpu_hours, "cost": gpu_hours * price_per_gpu_hour, "price_per_gpu_hour": price_per_gpu_hour}
