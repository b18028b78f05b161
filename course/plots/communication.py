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


def plot_ring_steps(traces: dict, world_size: int, chunk_sizes: list[int] | None = None,
                    title: str = "Ring all-reduce, step by step (recorded run)"):
    """One panel per step: which chunk each rank sends to its right neighbour.

    ``traces``: ``{rank: [message dicts of communication.ring_all_reduce(trace=...)]}``.
    Reduce-scatter steps in blue (the receiver adds the chunk), all-gather steps in green (the
    receiver overwrites it).
    """
    import math

    import matplotlib.pyplot as plt

    steps = len(traces[0])
    fig, axes = plt.subplots(1, steps, figsize=(2.6 * steps, 2.8), squeeze=False)
    angle = [math.pi / 2 - 2 * math.pi * r / world_size for r in range(world_size)]
    pos = [(math.cos(a), math.sin(a)) for a in angle]
    for s, ax in enumerate(axes[0]):
        for r in range(world_size):
            ax.add_patch(plt.Circle(pos[r], 0.22, color="0.85"))
            ax.text(*pos[r], f"rank {r}", ha="center", va="center", fontsize=8)
        for r in range(world_size):
            m = traces[r][s]
            (x0, y0), (x1, y1) = pos[r], pos[m["dst"]]
            color = "tab:blue" if m["phase"] == "reduce_scatter" else "tab:green"
            ax.annotate("", xy=(x0 + 0.7 * (x1 - x0), y0 + 0.7 * (y1 - y0)),
                        xytext=(x0 + 0.3 * (x1 - x0), y0 + 0.3 * (y1 - y0)),
                        arrowprops=dict(arrowstyle="->", color=color, lw=1.5))
            size = f" ({chunk_sizes[m['send_chunk']]})" if chunk_sizes else ""
            ax.text((x0 + x1) / 2 * 1.25, (y0 + y1) / 2 * 1.25, f"c{m['send_chunk']}{size}", color=color,
                    ha="center", va="center", fontsize=8)
        m = traces[0][s]
        ax.set_title(f"{'reduce-scatter' if m['phase'] == 'reduce_scatter' else 'all-gather'} {m['step'] + 1}",
                     fontsize=9)
        ax.set(xlim=(-1.6, 1.6), ylim=(-1.6, 1.6), aspect="equal")
        ax.axis("off")
    fig.suptitle(title)
    fig.tight_layout()
    return fig


def plot_allreduce_bandwidth(report: dict, world_size: int, title: str | None = None):
    """Left: time per all-reduce vs size (median, min-max bars) with each algorithm's fitted line, labelled
    with alpha per step, 1/beta and the fit's quality (``dist.all_reduce``: a whole call's intercept); right:
    bus bandwidth vs size. ``report``: one world size of ``project/tools/benchmark.py``'s JSON
    (``["allreduce"][str(p)]``, each algorithm's ``"fit"``)."""
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 3.8))
    for name, per in report["algorithms"].items():
        sizes = sorted(int(s) for s in per["points"])
        pts = [per["points"][str(s)] for s in sizes]
        med = [p["median"] * 1e6 for p in pts]
        err = [[m - p["min"] * 1e6 for m, p in zip(med, pts)], [p["max"] * 1e6 - m for m, p in zip(med, pts)]]
        line = ax1.errorbar(sizes, med, yerr=err, fmt="o", ms=4, capsize=2, label=name)
        fit = per["fit"]
        if "alpha" in fit:  # communication.cost_model.fit_allreduce_model: alpha per step
            bw = f"{fit['bandwidth'] / 1e9:.2f} GB/s" if fit["bandwidth"] else "none"
            label = f"α={fit['alpha'] * 1e6:.0f} µs per step, 1/β={bw}: {fit['quality']['quality']} fit"
        else:  # communication.alpha_beta.fit_line: a whole call's line
            label = f"intercept {fit['intercept'] * 1e6:.0f} µs per call: {fit['quality']['quality']} fit"
        ax1.plot(sizes, [t * 1e6 for t in fit["predicted"]], "--", color=line[0].get_color(), lw=1, label=label)
        ax2.plot(sizes, [p["busbw"] / 1e9 for p in pts], "o-", ms=4, label=name)
    timer = f", {report['timer']}" if report.get("timer") else ""  # which clock (course.measure)
    ax1.set(xscale="log", yscale="log", xlabel="message size (bytes)", ylabel=f"time per all-reduce (µs{timer})",
            title="latency")
    ax2.set(xscale="log", xlabel="message size (bytes)", ylabel="bus bandwidth (GB/s)",
            title="bus bandwidth = 2(p-1)/p · N / t")
    ax1.legend(fontsize=7)
    ax2.legend(fontsize=8)
    fig.suptitle(title or f"All-reduce on {world_size} ranks")
    fig.tight_layout()
    return fig


def plot_alpha_beta_fit(fits: dict, title: str = "All-reduce: measured medians and the alpha-beta model"):
    """Left: time per all-reduce against message size (log-log), the measured medians with min-max bars and
    the model's lines, one colour per world size, one marker per algorithm; right: the residuals as
    measured / model (log scale; 1 = the model is exact).

    ``fits``: ``{p: {"sizes": [bytes], "algorithms": {name: {"median", "min", "max", "model", "ratio"}},
    "fitted": name of the algorithm the model was fitted to}}`` (seconds), as
    ``communication.cost_model.fit_benchmark`` returns (its ``"fitted"`` defaults to ``"ring"``)."""
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 3.9))
    colours = plt.get_cmap("tab10")
    markers = ["o", "s", "^", "D"]
    for i, (p, fit) in enumerate(sorted(fits.items())):
        sizes = fit["sizes"]
        fitted = fit.get("fitted", "ring")
        for j, (name, per) in enumerate(fit["algorithms"].items()):
            med = [t * 1e6 for t in per["median"]]
            err = [[m - lo * 1e6 for m, lo in zip(med, per["min"])], [hi * 1e6 - m for m, hi in zip(med, per["max"])]]
            ax1.errorbar(sizes, med, yerr=err, fmt=markers[j % 4], ms=4, capsize=2, color=colours(i),
                         label=f"p={p} {name} (measured)")
            how = "fit" if name == fitted else "predicted"
            ax1.plot(sizes, [t * 1e6 for t in per["model"]], "-" if name == fitted else "--", color=colours(i), lw=1,
                     label=f"p={p} {name} (model, {how})")
            ax2.plot(sizes, per["ratio"], markers[j % 4] + ("-" if name == fitted else "--"), ms=4, color=colours(i),
                     label=f"p={p} {name}")
    ax1.set(xscale="log", yscale="log", xlabel="message size (bytes)", ylabel="time per all-reduce (µs)",
            title="medians (min-max bars) and model")
    ax2.axhline(1.0, color="0.5", lw=1)
    ax2.set(xscale="log", yscale="log", xlabel="message size (bytes)", ylabel="measured / model",
            title="residuals (1 = exact)")
    ax1.legend(fontsize=6, ncol=2)
    ax2.legend(fontsize=7)
    fig.suptitle(title)
    fig.tight_layout()
    return fig


def plot_overlap_timeline(timelines: dict, title: str = "Bucket all-reduces and the backward pass"):
    """One row per (run, rank): the backward pass as a grey bar, each bucket's all-reduce as a bar
    from its launch to the end of its wait, and the end of ``finish()``.

    ``timelines``: ``{label: {rank: communication.labs.experiments.overlap_timeline_worker output}}``.
    """
    import matplotlib.pyplot as plt

    rows = [(label, rank, t) for label, per in timelines.items() for rank, t in sorted(per.items())]
    fig, ax = plt.subplots(figsize=(10, 0.7 * len(rows) + 1.2))
    cmap = plt.get_cmap("tab10")
    for y, (label, rank, t) in enumerate(rows):
        b0, b1 = t["backward"]
        ax.barh(y, b1 - b0, left=b0, height=0.8, color="0.8", label="backward" if y == 0 else None)
        for b, start in t["launches"].items():
            end = t["waits"].get(b, start)
            ax.barh(y, max(end - start, 0.05), left=start, height=0.35, color=cmap(int(b) % 10))
        ax.plot([t["finish_end"]], [y], "k|", ms=14, label="finish() returns" if y == 0 else None)
    ax.set_yticks(range(len(rows)), [f"{label}, rank {rank}" for label, rank, _ in rows])
    ax.set(xlabel="ms from the start of the backward pass", title=title)
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    return fig


def plot_compression(results: dict, title: str = "Gradient compression: loss and bytes sent"):
    """Left: training loss per step per variant; right: bytes one rank sends per step (log scale).
    ``results``: ``{variant: {"losses": [...], "bytes_sent": float, "dense_bytes": float}}``."""
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 3.6))
    for name, r in results.items():
        ax1.plot(range(1, len(r["losses"]) + 1), r["losses"], label=name)
    ax1.set(xlabel="step", ylabel="training loss (mean over ranks)", title="loss")
    ax1.legend(fontsize=8)
    names = list(results)
    ax2.bar(names, [results[n]["bytes_sent"] / 1e6 for n in names])
    ax2.set(yscale="log", ylabel="MB sent per rank per step", title="traffic")
    ax2.tick_params(axis="x", rotation=20)
    fig.suptitle(title)
    fig.tight_layout()
    return fig


def plot_flight_records(records: dict, title: str = "Collectives posted, by group and sequence number"):
    """One panel per process group of a run's flight-recorder dumps (``course.flight_recorder.load_records``:
    ``{rank: [Record]}``): a row per member rank, a column per collective sequence number, a filled cell where the
    rank posted that collective; a column where some members posted and others did not is outlined in red (the
    first divergence of a hang). Sends and receives are left out (their numbers are per rank). Returns the figure."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import Rectangle

    groups: dict = {}
    for rank, recs in records.items():
        for r in recs:
            if not r.is_p2p:
                g = groups.setdefault((r.group, r.group_desc), {"members": set(r.group_ranks), "posted": {}})
                g["posted"].setdefault(r.seq, {})[rank] = r.op
    fig, axes = plt.subplots(1, max(1, len(groups)), figsize=(4.2 * max(1, len(groups)), 2.4), squeeze=False)
    for ax, ((gid, desc), g) in zip(axes[0], sorted(groups.items())):
        members = sorted(g["members"])
        seqs = sorted(g["posted"])
        for x, seq in enumerate(seqs):
            posted = g["posted"][seq]
            for y, rank in enumerate(members):
                if rank in posted:
                    ax.add_patch(Rectangle((x, y), 0.9, 0.8, color="tab:blue", alpha=0.7))
                    ax.text(x + 0.45, y + 0.4, posted[rank].replace("_", " "), ha="center", va="center", fontsize=7,
                            color="white")
            if set(posted) != set(members):
                ax.add_patch(Rectangle((x - 0.05, -0.1), 1.0, len(members) + 0.0, fill=False, color="tab:red", lw=2))
        ax.set_xlim(-0.2, max(1, len(seqs)) + 0.1)
        ax.set_ylim(-0.2, len(members))
        ax.set_xticks([x + 0.45 for x in range(len(seqs))], [f"#{s}" for s in seqs])
        ax.set_yticks([y + 0.4 for y in range(len(members))], [f"rank {r}" for r in members])
        ax.set_title(f"group {gid} ({desc})", fontsize=9)
        ax.invert_yaxis()
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return fig


def plot_straggler(steps: dict, title: str = "Compute and wait in the all-reduce, per rank and step"):
    """Stacked bars per rank and step (``{rank: [{"step", "compute_s", "wait_s"}]}``, e.g.
    ``communication.hang_workers.straggler_steps``): the time computing, then the time inside the all-reduce.
    Returns the axes."""
    import matplotlib.pyplot as plt

    _, ax = plt.subplots(figsize=(7, 3))
    labels, compute, wait = [], [], []
    for rank in sorted(steps):
        for s in steps[rank]:
            labels.append(f"r{rank}\ns{s['step']}")
            compute.append(1e3 * s["compute_s"])
            wait.append(1e3 * s["wait_s"])
    x = range(len(labels))
    ax.bar(x, compute, color="tab:blue", label="computing")
    ax.bar(x, wait, bottom=compute, color="tab:red", label="inside the all-reduce")
    ax.set_xticks(list(x), labels, fontsize=7)
    ax.set_ylabel("ms")
    ax.set_title(title)
    ax.legend(fontsize=8)
    return ax
