"""Plots of mixture-of-experts runs: the all-to-all between ranks, tokens per expert over training, and
the choices a capacity factor drops (notebooks/08_mixture_of_experts.ipynb)."""
from __future__ import annotations


def _plt():
    import matplotlib.pyplot as plt

    return plt


def plot_all_to_all(sent, title: str = "Rows sent by the dispatch all-to-all"):
    """Heat map of an all-to-all: ``sent[i][j]`` rows from rank i (row) to rank j (column), numbers written in.

    The diagonal stays on its rank; everything else crosses the network. The combine all-to-all is the
    same picture transposed.
    """
    import numpy as np

    plt = _plt()
    matrix = np.asarray(sent, dtype=float)
    fig, ax = plt.subplots(figsize=(4.2, 3.6))
    image = ax.imshow(matrix, cmap="Blues")
    for i in range(matrix.shape[0]):
        for j in range(matrix.shape[1]):
            ax.text(j, i, f"{int(matrix[i, j])}", ha="center", va="center",
                    color="white" if matrix[i, j] > matrix.max() / 2 else "black")
    ax.set_xticks(range(matrix.shape[1]))
    ax.set_yticks(range(matrix.shape[0]))
    ax.set(xlabel="to rank (holds those experts)", ylabel="from rank (where the tokens live)", title=title)
    fig.colorbar(image, ax=ax, label="rows (token copies)")
    fig.tight_layout()
    return fig


def plot_tokens_per_expert(runs: dict, block: int = 0, title: str = "Share of the choices each expert gets"):
    """One panel per run: each expert's share of the router's choices at every step (MoE block ``block``).

    ``runs`` maps a label to a (steps, blocks, E) array of tokens per expert (results files'
    ``routing["tokens_per_expert"]``). A dashed line marks the even share 1/E.
    """
    import numpy as np

    plt = _plt()
    fig, axes = plt.subplots(1, len(runs), figsize=(4.2 * len(runs), 3.2), sharey=True, squeeze=False)
    for ax, (label, counts) in zip(axes[0], runs.items()):
        counts = np.asarray(counts, dtype=float)[:, block, :]
        share = counts / counts.sum(axis=1, keepdims=True)
        for e in range(share.shape[1]):
            ax.plot(range(1, len(share) + 1), share[:, e], label=f"expert {e}")
        ax.axhline(1.0 / share.shape[1], color="grey", ls="--", lw=0.8)
        ax.set(xlabel="step", title=label)
    axes[0][0].set_ylabel("share of choices")
    axes[0][-1].legend(fontsize=8)
    fig.suptitle(title)
    fig.tight_layout()
    return fig


def plot_dropped_fraction(table, title: str = "Choices dropped at each capacity factor"):
    """Dropped fraction against the capacity factor, one line per column of ``table`` (a DataFrame indexed by
    the capacity factor)."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(5, 3.2))
    for column in table.columns:
        ax.plot(table.index, table[column], marker="o", label=str(column))
    ax.axvline(1.0, color="grey", ls="--", lw=0.8)
    ax.set(xlabel="capacity factor", ylabel="fraction of choices dropped", title=title)
    ax.legend()
    fig.tight_layout()
    return fig


def plot_balance_over_training(balance: dict, title: str = "Load balance and loss: aux loss, bias, neither"):
    """Two panels over the steps, one line per run: the load imbalance MaxVio (``max load / mean load - 1``,
    the worst MoE layer; 0 is perfectly balanced) and the next-token training loss.

    ``balance`` maps a label to ``{"max_violation": [per step], "loss": [per step]}``
    (:func:`moe.labs.experiments.balance_over_training`).
    """
    plt = _plt()
    fig, (left, right) = plt.subplots(1, 2, figsize=(9, 3.2))
    for label, run in balance.items():
        steps = range(1, len(run["loss"]) + 1)
        left.plot(steps, run["max_violation"], label=label)
        right.plot(steps, run["loss"], label=label)
    left.axhline(0.0, color="grey", ls="--", lw=0.8)
    left.set(xlabel="step", ylabel="MaxVio (max/mean load - 1)", title="load imbalance")
    right.set(xlabel="step", ylabel="loss (nats/token)", title="training loss (rank 0's shard)")
    left.legend()
    fig.suptitle(title)
    fig.tight_layout()
    return fig
