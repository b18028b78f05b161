"""The loss-parity report of ``project/tools/parity.py`` as curves: every configuration against its one-process run."""
from __future__ import annotations


def plot_parity(report: dict, title: str = "Every configuration against one process, step by step"):
    """Three panels over the steps of ``report`` (:func:`project.tools.parity.run_parity`): the training loss of
    the one-process references (thick) and of every configuration; ``|loss - reference loss|`` (nats/token,
    log scale; exact zeros drawn at 1e-9); and the relative difference of the applied gradient's norm.
    Configurations with the same differences draw on top of each other; the legend names every line.
    """
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2), layout="constrained")
    steps = range(1, report["steps"] + 1)
    for key, ref in report["references"].items():
        axes[0].plot(steps, ref["losses"], lw=3, alpha=0.5, label=ref["name"])
    cmap = plt.get_cmap("tab20")
    floor = 1e-9
    for i, row in enumerate(report["cases"]):
        ref = report["references"][row["reference"]]
        color, style = cmap(i % 20), ("--" if row["loss_tol"] > 1e-3 else "-")
        axes[0].plot(steps, row["losses"], lw=1, color=color, ls=style)
        axes[1].plot(steps, [max(abs(a - b), floor) for a, b in zip(row["losses"], ref["losses"])], color=color,
                     ls=style, label=f"{row['name']} (vs {ref['name']})")
        axes[2].plot(steps, [max(abs(a - b) / b, floor) for a, b in zip(row["grad_norms"], ref["grad_norms"])],
                     color=color, ls=style)
    axes[0].set(xlabel="step", ylabel="loss (nats/token)", title="training loss")
    axes[0].legend(fontsize=7)
    axes[1].set(xlabel="step", ylabel="|Δ loss| (nats/token)", yscale="log", title="loss difference")
    axes[2].set(xlabel="step", ylabel="|Δ‖g‖| / ‖g‖", yscale="log", title="gradient-norm difference (relative)")
    fig.legend(*axes[1].get_legend_handles_labels(), fontsize=6, loc="outside right upper")
    fig.suptitle(f"{title} ({report['steps']} steps; dashed: lossy configurations)")
    return fig
