"""Memory plots: bytes per parameter by category for each ZeRO stage and dp size, measured beside the formulas."""
from __future__ import annotations

CATEGORIES = ("params", "grads", "optimizer")
COLORS = {"params": "tab:blue", "grads": "tab:orange", "optimizer": "tab:green"}


def plot_memory_bars(rows: list[dict], ax=None, title: str | None = None):
    """Stacked bars of measured bytes per parameter (params, grads, optimizer) for each ``(zero, dp)``
    of ``rows`` (``memory.labs.experiments.measure_stage`` results), with the ZeRO formula's total as a
    black tick on each bar. Returns the axes."""
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=(max(6, 0.6 * len(rows)), 3.5))
    labels = [f"Z{r['zero']}\ndp{r['dp']}" for r in rows]
    bottom = [0.0] * len(rows)
    for cat in CATEGORIES:
        values = [r["bytes_per_param"][cat] for r in rows]
        ax.bar(range(len(rows)), values, bottom=bottom, color=COLORS[cat], label=cat)
        bottom = [b + v for b, v in zip(bottom, values)]
    formula = [sum(r["formula_bytes_per_param"].values()) for r in rows]
    ax.scatter(range(len(rows)), formula, marker="_", s=400, color="black", label="ZeRO formula", zorder=3)
    ax.set_xticks(range(len(rows)), labels)
    ax.set_ylabel("bytes per parameter (per rank)")
    measured = f" on {rows[0]['memory'].split(' (')[0]}" if rows and rows[0].get("memory") else ""
    ax.set_title(title or "model state per rank, measured (bars) and formula (ticks)")
    if measured:  # course.measure: what the peak-memory figures of these rows were read from
        ax.set_xlabel(f"peak memory measured{measured}", fontsize=8)
    ax.legend(fontsize=8)
    return ax


def plot_loss_by_precision(curves: dict[str, list[float]], ax=None):
    """Training loss per step for each precision (``{"fp32": [...], "bf16": [...]}``). Returns the axes."""
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=(6, 3.5))
    for name, losses in curves.items():
        ax.plot(range(len(losses)), losses, label=name, marker=".")
    ax.set_xlabel("step")
    ax.set_ylabel("training loss")
    ax.legend()
    return ax


def plot_what_fits(rows: list[dict], device_bytes: float, axes=None):
    """One heatmap per model of ``rows`` (``memory.formulas.what_fits_grid``): GB of model state per rank
    for each ZeRO stage (rows) and dp (columns), the number written in each cell, cells that fit in
    ``device_bytes`` in green and the others in red. Returns the axes."""
    import matplotlib.pyplot as plt
    from matplotlib.colors import ListedColormap

    models = list(dict.fromkeys(r["model"] for r in rows))
    stages = sorted({r["stage"] for r in rows})
    dps = sorted({r["dp"] for r in rows})
    if axes is None:
        _, axes = plt.subplots(1, len(models), figsize=(3.6 * len(models), 2.8), squeeze=False)
        axes = axes[0]
    for ax, model in zip(axes, models):
        cell = {(r["stage"], r["dp"]): r for r in rows if r["model"] == model}
        fits = [[float(cell[(s, d)]["fits"]) for d in dps] for s in stages]
        ax.imshow(fits, cmap=ListedColormap(["#f4b6b6", "#b6e3b6"]), vmin=0, vmax=1, aspect="auto")
        for i, s in enumerate(stages):
            for j, d in enumerate(dps):
                ax.text(j, i, f"{cell[(s, d)]['bytes_per_rank'] / 1e9:.3g}", ha="center", va="center", fontsize=8)
        ax.set_xticks(range(len(dps)), [str(d) for d in dps])
        ax.set_yticks(range(len(stages)), [f"ZeRO-{s}" for s in stages])
        ax.set_xlabel("dp")
        ax.set_title(f"{model}: GB per rank", fontsize=9)
    axes[0].figure.suptitle(f"model state per rank; green fits in {device_bytes / 1e9:g} GB", fontsize=10)
    axes[0].figure.tight_layout()
    return axes


TIMELINE_COLORS = {"Parameter": "tab:blue", "Gradient": "tab:orange", "Optstate": "tab:green",
                   "Activation": "tab:red", "Temp": "tab:gray"}


def plot_memory_timeline(timeline: dict, title: str = "One training step, operation by operation", ax=None):
    """A stacked area of the bytes of each category after every operation of one step
    (``memory.experiments.step_memory_timeline``), the phases shaded and the peak marked. Returns the axes."""
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=(10, 3.6))
    rows = timeline["rows"]
    ops = [r["op"] for r in rows]
    layers = [[r[c] / 2**20 for r in rows] for c in TIMELINE_COLORS]
    ax.stackplot(ops, layers, labels=list(TIMELINE_COLORS), colors=list(TIMELINE_COLORS.values()), alpha=0.85)
    for i, (phase, (first, last)) in enumerate(timeline["phases"].items()):
        ax.axvspan(first, last, color="black", alpha=0.04 * (i % 2 + 1), lw=0)
        ax.text((first + last) / 2, ax.get_ylim()[1] * 0.97, phase, ha="center", va="top", fontsize=8)
    peak = timeline["peak"]
    ax.axvline(peak["op"], color="black", ls=":", lw=1)
    ax.set_xlabel("operation of the step (forward, backward, optimizer)")
    ax.set_ylabel("MiB held")
    ax.set_title(title)
    ax.legend(fontsize=8, loc="upper right")
    return ax
