"""The device mesh drawn: which global rank sits where, and what it holds; where each rank's step time goes.

Plots only: the callers (notebook 06) compute the cells from the mesh arithmetic
(``three_d.coordinates``, ``three_d.stage.stage_blocks``) and the breakdown from a measured
timeline (``three_d.trace.time_breakdown``).
"""
from __future__ import annotations

CATEGORY_COLORS = {"forward": "tab:blue", "backward": "tab:green", "tp collectives": "tab:orange",
                   "pp send/recv": "tab:purple", "dp all-reduce": "tab:red", "tied all-reduce": "tab:pink",
                   "other communication": "tab:brown", "idle": "lightgrey"}


def _plt():
    import matplotlib.pyplot as plt

    return plt


def plot_rank_grid(cells: list[dict], title: str = "", ax=None):
    """One box per rank: stages left to right (pp), dp replicas top to bottom, tp ranks within a replica.

    Args:
        cells: one dict per rank: ``{"rank", "pp", "dp", "tp", "blocks"}`` (its coordinates; ``blocks``: the
            global indices of the stage's transformer blocks), plus optional ``"extra"`` text
            (e.g. "embedding", "LM head").
    """
    plt = _plt()
    pp = 1 + max(c["pp"] for c in cells)
    dp = 1 + max(c["dp"] for c in cells)
    tp = 1 + max(c["tp"] for c in cells)
    if ax is None:
        _, ax = plt.subplots(figsize=(2.3 * pp + 0.8, 0.75 * dp * tp + 0.9))
    colors = plt.get_cmap("tab10")
    for c in cells:
        row = c["dp"] * tp + c["tp"]
        y = dp * tp - 1 - row + 0.15 * (dp - 1 - c["dp"])  # dp replicas drawn as separate bands
        ax.add_patch(plt.Rectangle((c["pp"] + 0.04, y + 0.06), 0.92, 0.88, color=colors(c["pp"] % 10),
                                   alpha=0.25 + 0.35 * (c["tp"] % 2)))
        blocks = c["blocks"]
        held = f"blocks {blocks[0]}-{blocks[-1]}" if len(blocks) > 1 else f"block {blocks[0]}" if blocks else "no blocks"
        text = f"rank {c['rank']}\n{held}, tp shard {c['tp'] + 1}/{tp}" + (f"\n{c['extra']}" if c.get("extra") else "")
        ax.text(c["pp"] + 0.5, y + 0.5, text, ha="center", va="center", fontsize=8)
    ax.set_xlim(0, pp)
    ax.set_ylim(-0.05, dp * tp + 0.15 * (dp - 1) + 0.05)
    ax.set_xticks([s + 0.5 for s in range(pp)], [f"stage {s} (pp rank)" for s in range(pp)])
    ax.set_yticks([dp * tp - 1 - (d * tp + t) + 0.15 * (dp - 1 - d) + 0.5 for d in range(dp) for t in range(tp)],
                  [f"dp {d}, tp {t}" for d in range(dp) for t in range(tp)])
    ax.tick_params(length=0)
    for side in ("top", "right", "left", "bottom"):
        ax.spines[side].set_visible(False)
    if title:
        ax.set_title(title)
    return ax.figure


def plot_time_breakdown(breakdown: dict[str, dict[str, float]], title: str = "", unit: str = "ms", ax=None):
    """A stacked bar per rank: seconds of each category (``{rank label: {category: seconds}}``), in ``unit``."""
    plt = _plt()
    scale = {"s": 1.0, "ms": 1e3}[unit]
    labels = list(breakdown)
    categories = [c for c in CATEGORY_COLORS if any(b.get(c, 0) > 0 for b in breakdown.values())]
    categories += sorted({c for b in breakdown.values() for c in b} - set(CATEGORY_COLORS))
    if ax is None:
        _, ax = plt.subplots(figsize=(max(6, 0.8 * len(labels) + 3), 3.6))
    bottom = [0.0] * len(labels)
    for c in categories:
        values = [breakdown[lab].get(c, 0.0) * scale for lab in labels]
        ax.bar(range(len(labels)), values, bottom=bottom, label=c, color=CATEGORY_COLORS.get(c))
        bottom = [b + v for b, v in zip(bottom, values)]
    ax.set_xticks(range(len(labels)), labels, fontsize=8)
    ax.set_ylabel(f"time in the step ({unit})")
    ax.legend(fontsize=8, bbox_to_anchor=(1.01, 1), loc="upper left")
    if title:
        ax.set_title(title)
    ax.figure.tight_layout()
    return ax.figure
