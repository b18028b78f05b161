"""Plots of context parallelism (notebook 07), drawn from what :mod:`context_parallel.labs.experiments` measured:
attention memory against sequence length, the ring's schedule, work per rank, communication per layer,
memory per rank against sequence length and cp."""
from __future__ import annotations


def _plt():
    import matplotlib.pyplot as plt

    return plt


def plot_attention_memory(rows: list[dict], title: str = "One attention layer, forward + backward"):
    """Peak MB against sequence length per method (log-log), with one (seq x seq) score matrix for scale."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(6, 3.6))
    methods = sorted({r["method"] for r in rows})
    for method in methods:
        mine = sorted((r["seq"], r["peak MB"]) for r in rows if r["method"] == method)
        ax.plot(*zip(*mine), marker="o", label=method)
    matrix = sorted({(r["seq"], r["one score matrix MB"]) for r in rows})
    ax.plot(*zip(*matrix), linestyle=":", color="0.4", label="one score matrix")
    ax.set(xscale="log", yscale="log", xlabel="sequence length (tokens)", ylabel="peak MB (MemTracker)", title=title)
    seqs = sorted({r["seq"] for r in rows})
    ax.set_xticks(seqs, [str(s) for s in seqs])
    ax.legend()
    fig.tight_layout()
    return fig


def plot_ring_schedule(schedule: list[dict], pass_: str = "forward", title: str = ""):
    """The ring's steps on each rank as measured: a bar per step (coloured by the rank the K/V block
    started on, labelled ``KV<src>`` and its tiles), grey where the rank waited for the next block.

    ``schedule``: one dict per rank with ``rank`` and ``pass_`` -> steps (``src``, ``tiles``, ``compute`` and
    ``wait`` spans in seconds), as :func:`context_parallel.labs.experiments.ring_report_worker` returns.
    """
    plt = _plt()
    ranks = sorted(schedule, key=lambda e: e["rank"])
    p = len(ranks)
    colours = plt.get_cmap("tab10")
    fig, ax = plt.subplots(figsize=(9, 0.6 + 0.55 * p))
    for row, entry in enumerate(ranks):
        for step in entry[pass_]:
            (c0, c1), (w0, w1) = step["compute"], step["wait"]
            ax.barh(row, c1 - c0, left=c0, color=colours(step["src"]), edgecolor="black", height=0.6)
            ax.text((c0 + c1) / 2, row, f"KV{step['src']}\n{step['tiles']}", ha="center", va="center", fontsize=7)
            if w1 > w0:
                ax.barh(row, w1 - w0, left=w0, color="0.85", height=0.6)
    ax.set_yticks(range(p), [f"rank {e['rank']}" for e in ranks])
    ax.invert_yaxis()
    ax.set(xlabel="seconds since the pass began", title=title or f"Ring attention, {pass_} pass: KV<home rank>, tiles")
    fig.tight_layout()
    return fig


def plot_work_per_rank(work: dict, title: str = "Causal ring attention: work per rank"):
    """Tiles computed (forward + backward) and CPU seconds of computation per rank, one bar group per layout.

    ``work``: ``{layout: {rank: {"forward_tiles", "backward_tiles", "compute_s", "compute_range_s"}}}``.
    """
    import numpy as np

    plt = _plt()
    layouts = list(work)
    ranks = sorted(next(iter(work.values())))
    width = 0.8 / len(layouts)
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 3.4))
    for i, layout in enumerate(layouts):
        x = np.arange(len(ranks)) + i * width
        tiles = [work[layout][r]["forward_tiles"] + work[layout][r]["backward_tiles"] for r in ranks]
        med = np.array([work[layout][r]["compute_s"] for r in ranks])
        low = med - np.array([work[layout][r]["compute_range_s"][0] for r in ranks])
        high = np.array([work[layout][r]["compute_range_s"][1] for r in ranks]) - med
        ax1.bar(x, tiles, width, label=layout)
        ax2.bar(x, med, width, yerr=[low, high], capsize=4, label=layout)
    for ax in (ax1, ax2):
        ax.set_xticks(np.arange(len(ranks)) + width * (len(layouts) - 1) / 2, [f"rank {r}" for r in ranks])
        ax.legend()
    ax1.set(ylabel="tiles computed (forward + backward)", title="work counted")
    ax2.set(ylabel="CPU seconds computing (median, min-max)", title="work timed")
    fig.suptitle(title)
    fig.tight_layout()
    return fig


def plot_comm_volume(rows: list[dict], title: str = "Bytes one rank sends per attention layer"):
    """Bars of counted MB (forward + backward) per method and cp, with the formula as a black tick."""
    plt = _plt()
    keys = sorted({(r["method"], r["cp"]) for r in rows}, key=lambda k: (k[1], k[0]))
    counted = [sum(r["counted MB"] for r in rows if (r["method"], r["cp"]) == k) for k in keys]
    formula = [sum(r["formula MB"] for r in rows if (r["method"], r["cp"]) == k) for k in keys]
    fig, ax = plt.subplots(figsize=(6, 3.4))
    labels = [f"{m}\ncp={c}" for m, c in keys]
    ax.bar(labels, counted, color=["tab:blue" if m == "ring" else "tab:orange" for m, _ in keys], label="counted")
    ax.scatter(labels, formula, marker="_", s=600, color="black", label="formula", zorder=3)
    ax.set(ylabel="MB sent per rank (forward + backward)", title=title)
    ax.legend()
    fig.tight_layout()
    return fig


def plot_memory_per_rank(rows: list[dict], title: str = "GPT-2 training step: peak memory per rank"):
    """Peak MB per rank against sequence length, one line per cp, a panel per method; dashed: cp = 1 / cp."""
    plt = _plt()
    methods = sorted({r["method"] for r in rows})
    fig, axes = plt.subplots(1, len(methods), figsize=(5 * len(methods), 3.6), sharey=True, squeeze=False)
    for ax, method in zip(axes[0], methods):
        mine = [r for r in rows if r["method"] == method]
        base = {r["seq"]: r["peak MB"] for r in mine if r["cp"] == 1}
        for i, cp in enumerate(sorted({r["cp"] for r in mine})):
            points = sorted((r["seq"], r["peak MB"]) for r in mine if r["cp"] == cp)
            line, = ax.plot(*zip(*points), marker="o", label=f"cp={cp}")
            if cp > 1 and base:
                ideal = sorted((s, m / cp) for s, m in base.items())
                ax.plot(*zip(*ideal), linestyle="--", color=line.get_color(), alpha=0.6)
        ax.set(xlabel="sequence length (tokens)", ylabel="peak MB per rank", title=f"{method} (dashed: cp=1 / cp)")
        ax.legend()
    fig.suptitle(title)
    fig.tight_layout()
    return fig
