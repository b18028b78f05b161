"""The planner's tables as text: the prediction with its breakdown, what limits a plan, prediction beside
measurement."""
from __future__ import annotations

CLASS_NAMES = {"gemm": "matrix products", "attention": "attention core", "memory": "memory-bound kernels",
               "contention": "SMs held by collectives"}


def readable_bytes(n: float) -> str:
    """Bytes in GB (10^9), MB or KB, the unit convention of the planner's tables and the calculators."""
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if abs(n) >= size:
            return f"{n / size:.2f} {unit}"
    return f"{n:.0f} B"


def readable_seconds(t: float) -> str:
    return f"{t * 1e3:.2f} ms" if t < 1 else f"{t:.3f} s"


def limiting_term(config, hardware, prediction) -> str:
    """What limits the step most: ``"memory"`` when it does not fit, else the largest of the bubble and each
    group's exposed communication as a share of the step (a tp group that spans nodes is named so), or the
    largest kernel class when none of them is over 10 % of it."""
    from project.planner.communication import group_placement

    if not prediction.fits:
        return (f"memory ({prediction.memory_bytes / 1e9:.0f} of {prediction.usable_memory_bytes / 1e9:.0f} GB usable "
                f"of {prediction.device_memory_bytes / 1e9:.0f})")
    terms = {"bubble": prediction.bubble_s} | {f"exposed {g}": t for g, t in prediction.exposed_s.items()}
    name, seconds = max(terms.items(), key=lambda kv: kv[1])
    share = seconds / prediction.step_s
    if share < 0.10:
        kind, t = max(prediction.compute_by_class.items(), key=lambda kv: kv[1])
        return f"compute ({CLASS_NAMES[kind]} {t / prediction.step_s:.0%})"
    if name in ("exposed tp", "exposed cp", "exposed dp") and hardware.inter is not None:
        if group_placement(hardware, config, name.split()[1])[1] > 1:
            name += " across nodes"
    return f"{name} {share:.0%}"


def fit_message(config, prediction) -> str:
    """What to change when the prediction does not fit the device's memory (empty when it fits)."""
    if prediction.fits:
        return ""
    worst = max(prediction.stages, key=lambda s: s.memory.total)
    mem = worst.memory
    parts = ", ".join(f"{k} {v / 1e9:.1f}" for k, v in mem.categories().items())
    hints = []
    if config.zero < 3 and config.dp * config.cp > 1:
        hints.append(f"--zero {config.zero + 1}")
    if not config.activation_checkpointing:
        hints.append("--activation_checkpointing")
    hints += ["a larger --tp or --pp", "more --micro_batches (smaller micro-batches)"]
    return (f"--preset {config.preset} does not fit: stage {worst.stage} needs {mem.total / 1e9:.1f} GB per device "
            f"({parts} GB) and a {config.hardware} has {prediction.usable_memory_bytes / 1e9:.0f} GB usable (of "
            f"{prediction.device_memory_bytes / 1e9:.0f}, {1 - prediction.usable_memory_bytes / prediction.device_memory_bytes:.0%} "
            f"left to the allocator); try " + ", ".join(hints))


def format_breakdown(prediction) -> str:
    """Where the step goes: each kernel class, the bubble, each group's exposed communication and the optimizer,
    in seconds and as a share of the step."""
    shares = prediction.shares()
    seconds = {k: v for k, v in prediction.compute_by_class.items()} | {"bubble": prediction.bubble_s} | \
        {f"exposed {g}": t for g, t in prediction.exposed_s.items()} | {"optimizer": prediction.optimizer_s}
    rows = [f"  {CLASS_NAMES.get(k, k):28} {readable_seconds(seconds[k]):>12} {shares[k]:>7.1%}"
            for k in seconds if seconds[k] > 0]
    return "\n".join(["where the step goes (critical stage):", *rows])


def format_prediction(config, prediction) -> str:
    """Memory per stage (one rank of it), the step's terms and its breakdown, FLOPs and MFU."""
    from project.planner.memory import RECOMPUTE_NAMES

    d, p = config, prediction
    model = d.model
    lines = [f"plan: {d.preset} ({model.n_layer} x {model.n_embd}, {model.n_head} heads / {model.n_kv_head} key-value, "
             f"{model.mlp} MLP {model.n_inner}), {d.devices} x {p.hardware} (dp {d.dp}, pp {d.pp}, tp {d.tp}, cp {d.cp}, "
             f"ep {d.ep}), batch {d.batch_size} x {d.model_max_length} tokens, {d.micro_batches} micro-batches, "
             f"{d.schedule}, ZeRO-{d.zero}{f' (ZeRO++ {d.zeropp})' if d.zeropp else ''}, {d.precision}, "
             f"{d.attention_kernel} attention, recomputation: {RECOMPUTE_NAMES[d.recompute]}, sequence parallel "
             f"{'on' if d.sequence_parallel else 'off'}", "",
             f"{'stage':>5} {'params':>11} {'grads':>11} {'optimizer':>11} {'activations':>12} {'in flight':>9} "
             f"{'total':>11} {'compute':>11} {'comm':>11}"]
    for s in p.stages:
        m = s.memory
        lines.append(f"{s.stage:>5} {readable_bytes(m.params):>11} {readable_bytes(m.grads):>11} "
                     f"{readable_bytes(m.optimizer):>11} {readable_bytes(m.activations + m.recompute):>12} "
                     f"{m.in_flight:>9} {readable_bytes(m.total):>11} {readable_seconds(s.compute_s):>11} "
                     f"{readable_seconds(sum(s.comm_s.values())):>11}")
    exposed = ", ".join(f"{g} {readable_seconds(t)}" for g, t in sorted(p.exposed_s.items()) if t > 0) or "none"
    hidden = ", ".join(f"{g} {readable_seconds(t)}" for g, t in sorted(p.hidden_s.items()) if t > 0) or "none"
    lines += ["", f"step (replayed, dp overlap {'on' if p.overlap else 'off'}): compute {readable_seconds(p.compute_s)} "
                  f"(critical stage) + bubble {readable_seconds(p.bubble_s)} + exposed communication "
                  f"{readable_seconds(p.comm_s)} ({exposed}) + optimizer {readable_seconds(p.optimizer_s)} = "
                  f"{readable_seconds(p.step_s)}",
              f"bubble: {p.bubble:.1%} of the step (the schedule's formula for equal stages: {p.bubble_theory:.1%} of "
              f"an ideal step); hidden behind computation: {hidden}; limited by: {p.limit}",
              format_breakdown(p),
              f"matrix products at the GPU's measured or published efficiency by shape ({p.efficiency_source})"
              + (f", at {p.extra['clock_factor']:.1%} of its clock (power limit)" if p.extra.get("clock_factor", 1) < 1
                 else ""),
              f"memory: {readable_bytes(p.memory_bytes)} on the fullest rank of {readable_bytes(p.usable_memory_bytes)} "
              f"usable ({'fits' if p.fits else 'does NOT fit'})",
              f"FLOPs per step: model {p.model_flops / 1e12:.4g} TFLOP (PaLM's 6N + 12 L a d s), hardware "
              f"{p.hardware_flops / 1e12:.4g} TFLOP (as executed: recomputation included, causal attention as run); {p.tokens / p.step_s:.4g} "
              f"tokens/s; MFU {p.mfu:.1%}, HFU {p.hfu:.1%} of {p.peak_flops / 1e12:.4g} TFLOP/s per device"]
    return "\n".join(lines)


def format_comparison(rows: list[dict]) -> str:
    """Prediction beside measurement, one term per line, with the relative error."""
    lines = ["", f"{'term':40} {'stage':>5} {'predicted':>12} {'measured':>12} {'error':>8}"]
    for r in rows:
        show = readable_seconds if r["term"].startswith(("step", "time")) else readable_bytes
        lines.append(f"{r['term']:40} {str(r['stage']):>5} {show(r['predicted']):>12} {show(r['measured']):>12} "
                     f"{r['error']:>+8.1%}")
    return "\n".join(lines)
