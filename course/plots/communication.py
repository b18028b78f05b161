"""Plots of communication: collectives per layer and the traffic they cause (from :class:`course.collectives.CommCounter` records)."""
from __future__ import annotations


def plot_comm_per_layer(report: dict, title: str = "Collectives per transformer layer (forward + backward)"):
    """Bars: number of collectives and ring traffic (MB sent per rank) per layer, by run and kind."""
    import matplotlib.pyplot as plt

    kinds = ["all_reduce", "all_gather", "reduce_scatter"]
    labels = list(report["runs"])
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 3.4))
    bottom_c, bottom_t = [0.0] * len(labels), [0.0] * len(labels)
    for kind in kinds:
        counts, traffic = [], []
        for label in labels:
            per = report["runs"][label]["per_layer"]
            counts.append(sum(per[ph].get(kind, {}).get("count", 0) for ph in ("forward", "backward")))
            traffic.append(sum(per[ph].get(kind, {}).get("traffic_bytes", 0) for ph in ("forward", "backward")) / 1e6)
        ax1.bar(labels, counts, bottom=bottom_c, label=kind)
        ax2.bar(labels, traffic, bottom=bottom_t, label=kind)
        bottom_c = [a + b for a, b in zip(bottom_c, counts)]
        bottom_t = [a + b for a, b in zip(bottom_t, traffic)]
    ax1.set(ylabel="collectives per layer", title="count")
    ax2.set(ylabel="MB sent per rank per layer (ring)", title="traffic")
    for ax in (ax1, ax2):
        ax.tick_params(axis="x", rotation=30)
    ax1.legend()
    fig.suptitle(title)
    fig.tight_layout()
    return fig
