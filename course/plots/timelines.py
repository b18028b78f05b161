"""Timelines of pipeline schedules (Gantt charts), the bubble fraction, and activation memory per stage.

Timelines are ``events[stage] = [(kind, micro-batch, start, end), ...]`` (kind ``"F"``,
``"B"``, ``"W"`` — ZB-H1's weight gradient — or ``"AR"``, the tied-embedding all-reduce), as returned by :func:`pipeline.metrics.simulate` (unit time slots) or measured by
:class:`pipeline.stage_runner.StageRunner` / ``Pipe.timeline`` (seconds).
"""
from __future__ import annotations

COLORS = {"F": "tab:blue", "B": "tab:green", "W": "tab:olive", "AR": "tab:red"}
NAMES = {"F": "forward", "B": "backward (ZB-H1: input gradient)", "W": "weight gradient (ZB-H1)",
         "AR": "tied-embedding all-reduce"}


def _plt():
    import matplotlib.pyplot as plt

    return plt


def events_from_records(records: list, n_stages: int) -> list[list[tuple]]:
    """Timeline rows -> ``events[stage]``.

    A row is a results-file dict ``{stage, kind, micro_batch, start, end}`` or a
    ``Pipe.timeline`` tuple ``(stage, kind, micro_batch, start, end)``.
    """
    events: list[list[tuple]] = [[] for _ in range(n_stages)]
    for r in records:
        if isinstance(r, dict):
            r = (r["stage"], r["kind"], r["micro_batch"], r["start"], r["end"])
        events[r[0]].append(tuple(r[1:]))
    return events


def plot_gantt(events: list[list[tuple]], title: str = "", unit: str = "time slot", ax=None, label_every: int = 1):
    """One row per stage (stage 0 on top), one box per forward (blue) / backward (green), labelled by micro-batch."""
    plt = _plt()
    if ax is None:
        _, ax = plt.subplots(figsize=(9, 0.5 + 0.45 * len(events)))
    origin = min(e[2] for stage in events for e in stage)
    for s, stage_events in enumerate(events):
        for n, (kind, i, start, end) in enumerate(stage_events):
            ax.barh(s, end - start, left=start - origin, color=COLORS.get(kind, "gray"), edgecolor="white", height=0.8)
            if n % label_every == 0:
                ax.text((start + end) / 2 - origin, s, str(i), ha="center", va="center", color="white", fontsize=8)
    ax.set_yticks(range(len(events)), [f"stage {s}" for s in range(len(events))])
    ax.invert_yaxis()
    ax.set_xlabel(unit)
    ax.set_title(title)
    kinds = [k for k in COLORS if any(e[0] == k for stage in events for e in stage)]
    handles = [plt.Rectangle((0, 0), 1, 1, color=COLORS[k]) for k in kinds]
    ax.legend(handles, [NAMES[k] if "W" in kinds else NAMES[k].split(" (")[0] for k in kinds], loc="upper left",
              bbox_to_anchor=(1.005, 1.0), fontsize=8)
    return ax


def plot_gantts(panels: list[tuple[list[list[tuple]], str]], unit: str = "time slot", sharex: bool = True):
    """Several Gantt charts stacked (e.g. GPipe above 1F1B), sharing the x axis if ``sharex``."""
    plt = _plt()
    n_rows = sum(len(events) for events, _ in panels)
    fig, axes = plt.subplots(len(panels), 1, figsize=(10, 1.0 + 0.42 * n_rows + 0.55 * len(panels)), sharex=sharex)
    axes = [axes] if len(panels) == 1 else list(axes)
    for ax, (events, title) in zip(axes, panels):
        plot_gantt(events, title, unit, ax=ax)
    fig.tight_layout()
    return fig


def plot_bubble(micro_batches: list[int], formula: list[float], measured: list[float], n_stages: int):
    """Bubble fraction against the number of micro-batches: the formula as a line, measurements as dots."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(6, 3.4))
    ax.plot(micro_batches, formula, "-", color="black", label=f"(p - 1) / (m + p - 1), p = {n_stages}")
    ax.plot(micro_batches, measured, "o", color="tab:red", label="measured (real 1F1B run)")
    ax.set(xlabel="micro-batches per batch m", ylabel="bubble fraction", xscale="log", ylim=(0, 1),
           title="Pipeline bubble")
    ax.set_xticks(micro_batches, [str(m) for m in micro_batches])
    ax.legend()
    fig.tight_layout()
    return fig


def plot_activation_memory(rows: list[dict]):
    """Grouped bars: peak activation memory (MiB) per stage for each schedule.

    ``rows``: ``{"schedule", "stage", "peak_activation_bytes", "peak_in_flight"}``.
    """
    plt = _plt()
    schedules = sorted({r["schedule"] for r in rows})
    stages = sorted({r["stage"] for r in rows})
    fig, ax = plt.subplots(figsize=(6, 3.4))
    width = 0.8 / len(schedules)
    for k, schedule in enumerate(schedules):
        mine = {r["stage"]: r for r in rows if r["schedule"] == schedule}
        xs = [s + (k - (len(schedules) - 1) / 2) * width for s in stages]
        mib = [mine[s]["peak_activation_bytes"] / 2**20 for s in stages]
        bars = ax.bar(xs, mib, width, label=schedule)
        for bar, s in zip(bars, stages):
            ax.text(bar.get_x() + bar.get_width() / 2, bar.get_height(), f"{mine[s]['peak_in_flight']} mb",
                    ha="center", va="bottom", fontsize=8)
    ax.set_xticks(stages, [f"stage {s}" for s in stages])
    ax.set(ylabel="peak activations (MiB)", title="Activation memory (labels: micro-batches in flight)")
    ax.legend()
    fig.tight_layout()
    return fig
