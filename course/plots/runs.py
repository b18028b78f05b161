"""Plots of training runs, drawn from results files (:func:`course.results.load_results`): throughput,
loss curves, and the comparison of modes."""
from __future__ import annotations


def _plt():
    import matplotlib.pyplot as plt

    return plt


def plot_throughput(df, by: str = "config.world_size", title: str = "Data-parallel throughput"):
    """Bar charts of training time per epoch (s) and tokens/s (all ranks together) per value of ``by``.

    ``df`` has one row per results file; rank 0's rows are used.
    """
    plt = _plt()
    rows = df[df["rank"] == 0].sort_values(by)
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(9, 3.2))
    labels = [str(v) for v in rows[by]]
    ax1.bar(labels, rows["training_time"], color="tab:blue")
    ax1.set(xlabel=by.split(".")[-1], ylabel="seconds per epoch", title="training time")
    tps = rows["global_tokens_per_sec"] if "global_tokens_per_sec" in rows else rows["tokens_per_sec"]
    ax2.bar(labels, tps, color="tab:green")
    ax2.set(xlabel=by.split(".")[-1], ylabel="tokens / s (all ranks)", title="throughput")
    fig.suptitle(title)
    fig.tight_layout()
    return fig


def plot_loss_curves(df, label: str = "config.world_size", title: str = "Training loss"):
    """Per-step training loss of rank 0 (column ``train_losses``), one line per value of ``label``."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(6, 3.2))
    for _, row in df[df["rank"] == 0].sort_values(label).iterrows():
        ax.plot(range(1, len(row["train_losses"]) + 1), row["train_losses"], label=f"{label.split('.')[-1]}={row[label]}")
    ax.set(xlabel="step", ylabel="loss (nats/token)", title=title)
    ax.legend()
    fig.tight_layout()
    return fig


def plot_modes(df, modes: list[str]):
    """Bars of seconds per epoch and tokens/s for each mode (rank 0's results rows)."""
    plt = _plt()
    rows = df[df["rank"] == 0].set_index("config.mode").loc[modes]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 3.2))
    ax1.bar(modes, rows["training_time"], color="tab:blue")
    ax1.set(ylabel="seconds (same batches)", title="training time")
    ax2.bar(modes, rows["tokens_per_sec"], color="tab:green")
    ax2.set(ylabel="tokens / s", title="throughput")
    for ax in (ax1, ax2):
        ax.tick_params(axis="x", labelsize=8)
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
