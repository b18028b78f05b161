"""Plots of training runs, drawn from results files (:func:`course.results.load_results`): throughput,
loss curves, and the comparison of modes."""
from __future__ import annotations


def _plt():
    import matplotlib.pyplot as plt

    return plt


def plot_throughput(df, by: str = "config.world_size", title: str = "Data-parallel throughput"):
    """Bar charts of training time (s, the run's steps) and tokens/s (all ranks together) per value of ``by``.

    ``df`` has one row per results file; rank 0's rows are used. One run per bar: for a speed
    comparison use :func:`plot_repeated_timings`, which shows the spread of repeated runs.
    """
    plt = _plt()
    rows = df[df["rank"] == 0].sort_values(by)
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(9, 3.2))
    labels = [str(v) for v in rows[by]]
    ax1.bar(labels, rows["training_time"], color="tab:blue")
    steps = sorted(set(rows["steps"])) if "steps" in rows else []
    timer = f", {rows['timer'].iloc[0]}" if "timer" in rows and rows["timer"].notna().any() else ""  # course.measure
    ax1.set(xlabel=by.split(".")[-1], ylabel=f"seconds ({'/'.join(map(str, steps))} steps{timer})" if steps
            else f"seconds{timer}", title="training time")
    tps = rows["global_tokens_per_sec"] if "global_tokens_per_sec" in rows else rows["tokens_per_sec"]
    ax2.bar(labels, tps, color="tab:green")
    ax2.set(xlabel=by.split(".")[-1], ylabel="tokens / s (all ranks)", title="throughput")
    fig.suptitle(title)
    fig.tight_layout()
    return fig


def plot_repeated_timings(df, by: str, value: str, ylabel: str, title: str = ""):
    """Median of repeated measurements per value of ``by``, with min–max error bars.

    ``df`` has one row per repetition, with columns ``by`` and ``value``.
    """
    plt = _plt()
    stats = df.groupby(by)[value].agg(["median", "min", "max"]).sort_index()
    fig, ax = plt.subplots(figsize=(5, 3.2))
    labels = [str(v) for v in stats.index]
    ax.bar(labels, stats["median"], color="tab:green",
           yerr=[stats["median"] - stats["min"], stats["max"] - stats["median"]], capsize=6)
    counts = df.groupby(by)[value].count()
    ax.set(xlabel=by, ylabel=ylabel, title=title or f"median of {counts.min()} runs, min–max bars")
    fig.tight_layout()
    return fig


def plot_loss_curves(df, label: str = "config.world_size", title: str = "Training loss"):
    """Per-step training loss (column ``train_losses``), one line per value of ``label``.

    Each rank's loss is the mean over its own shard; the line is the mean over a run's ranks
    at each step, i.e. the mean of the shard means (with one rank, the batch's own loss).
    """
    import numpy as np

    plt = _plt()
    fig, ax = plt.subplots(figsize=(6, 3.2))
    for value, rows in sorted(df.groupby(label), key=lambda item: item[0]):
        curves = np.array([list(losses) for losses in rows["train_losses"]], dtype=float)  # ranks x steps
        ax.plot(range(1, curves.shape[1] + 1), curves.mean(axis=0), label=f"{label.split('.')[-1]}={value}")
    ax.set(xlabel="step", ylabel="loss (nats/token)", title=title)
    ax.legend()
    fig.tight_layout()
    return fig


def plot_loss_difference(runs, reference: str = "tp", title: str = "Training loss minus the tp run's, per step"):
    """Per-step ``loss(block) - loss(reference)`` of rank 0 (``runs`` has a ``block`` column, see notebook 03)."""
    plt = _plt()
    rank0 = runs[runs["rank"] == 0].set_index("block")
    base = rank0.loc[reference, "train_losses"]
    fig, ax = plt.subplots(figsize=(6, 3.2))
    for block, losses in rank0["train_losses"].items():
        if block != reference:
            ax.plot(range(1, len(losses) + 1), [a - b for a, b in zip(losses, base)], label=block)
    ax.axhline(0.0, color="grey", lw=0.8)
    ax.set(xlabel="step", ylabel=f"loss - {reference} loss (nats/token)", title=title)
    ax.legend()
    fig.tight_layout()
    return fig


def plot_grouped_bars(df, ylabel: str, title: str = ""):
    """One group of bars per row of ``df`` (its index on the x axis), one bar per column."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(5, 3.2))
    width = 0.8 / max(1, len(df.columns))
    positions = range(len(df.index))
    for k, column in enumerate(df.columns):
        ax.bar([x + (k - (len(df.columns) - 1) / 2) * width for x in positions], df[column], width, label=str(column))
    ax.set_xticks(list(positions), [str(v) for v in df.index])
    ax.set(xlabel=str(df.index.name or ""), ylabel=ylabel, title=title)
    ax.legend()
    fig.tight_layout()
    return fig
