"""The planner's tables as text (``project/plan.py``): the prediction, and prediction beside measurement."""
from __future__ import annotations


def _bytes(n: float) -> str:
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if abs(n) >= size:
            return f"{n / size:.2f} {unit}"
    return f"{n:.0f} B"


def _seconds(t: float) -> str:
    return f"{t * 1e3:.2f} ms" if t < 1 else f"{t:.3f} s"


def format_prediction(config, prediction: dict) -> str:
    """Memory per stage (one rank of it; activations include the recomputed block's with checkpointing), the
    step time's terms, communication per group and MFU."""
    d = config
    lines = [f"plan: {d.preset}, {d.devices} x {prediction['hardware']} (dp {d.dp}, pp {d.pp}, tp {d.tp}, cp {d.cp}, "
             f"ep {d.ep}), batch {d.batch_size} x {d.model_max_length} tokens, {d.micro_batches} micro-batches, "
             f"{d.schedule}, ZeRO-{d.zero}{f' (ZeRO++ {d.zeropp})' if getattr(d, 'zeropp', '') else ''}, "
             f"{d.precision}, checkpointing {'on' if d.activation_checkpointing else 'off'},"
             f" sequence parallel {'on' if d.sequence_parallel else 'off'}", ""]
    lines.append(f"{'stage':>5} {'params':>11} {'grads':>11} {'optimizer':>11} {'activations':>12} {'total':>11} "
                 f"{'compute':>11} {'comm':>11}")
    for s in prediction["stages"]:
        m = s["memory"]
        lines.append(f"{s['stage']:>5} {_bytes(m['params']):>11} {_bytes(m['grads']):>11} {_bytes(m['optimizer']):>11} "
                     f"{_bytes(m['activations'] + m['recompute']):>12} {_bytes(m['total']):>11} {_seconds(s['compute_s']):>11} "
                     f"{_seconds(sum(s['comm_s'].values())):>11}")
    lines.append("")
    exposed = prediction.get("exposed_s", {})
    per_group = ", ".join(f"{g} {_seconds(t)}" for g, t in sorted(exposed.items()) if t > 0) or "none"
    hidden = ", ".join(f"{g} {_seconds(t)}" for g, t in sorted(prediction.get("hidden_s", {}).items()) if t > 0)
    lines.append(f"step (replayed, overlap {'on' if prediction.get('overlap') else 'off'}): compute "
                 f"{_seconds(prediction['compute_s'])} (critical stage) + bubble {_seconds(prediction['bubble_s'])} "
                 f"({prediction['bubble']:.1%}; the schedule's formula {prediction.get('bubble_theory', 0):.1%}) + "
                 f"exposed communication {_seconds(prediction['comm_s'])} ({per_group}) = "
                 f"{_seconds(prediction['step_s'])}")
    lines.append(f"hidden behind computation: {hidden or 'none'}; limited by: {prediction.get('limit', '?')}")
    if "efficiency" in prediction:
        lines.append(f"compute at {prediction['efficiency']:.1%} of the peak ({prediction['efficiency_source']})")
    lines.append(f"memory: {_bytes(prediction['memory_bytes'])} on the fullest rank of "
                 f"{_bytes(prediction['device_memory_bytes'])} ({'fits' if prediction['fits'] else 'does NOT fit'})")
    lines.append(f"MFU: {prediction['mfu']:.1%} ({prediction['model_flops'] / 1e12:.3g} TFLOP of model FLOPs per step, "
                 f"{prediction['tokens'] / prediction['step_s']:.4g} tokens/s, peak "
                 f"{prediction['peak_flops'] / 1e12:.4g} TFLOP/s per device)")
    return "\n".join(lines)


def format_comparison(rows: list[dict]) -> str:
    """Prediction beside measurement, one term per line, with the relative error."""
    lines = ["", f"{'term':40} {'stage':>5} {'predicted':>12} {'measured':>12} {'error':>8}"]
    for r in rows:
        seconds = r["term"].startswith(("step", "time"))
        show = _seconds if seconds else _bytes
        lines.append(f"{r['term']:40} {str(r['stage']):>5} {show(r['predicted']):>12} {show(r['measured']):>12} "
                     f"{r['error']:>+8.1%}")
    return "\n".join(lines)
