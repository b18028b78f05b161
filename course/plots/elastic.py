"""The figure of an elastic run, from its results file (the ``elastic`` entry, :mod:`course.elastic`).

    python -m course.plots.elastic workdir/rank0_results_epoch0.json --out elastic_run.png
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path


def plot_elastic_run(results, path=None):
    """Loss over the steps (each step's last execution; the executions a restart threw away as crosses) and the
    world size over wall-clock time (the time the run was down shaded), every restart marked with what it cost.

    Args:
        results: a results file's path, or its loaded dict (with an ``elastic`` entry; with a ``machine`` entry,
            as ``project/elastic_demo.py`` writes it, the machine and its load are named too).
        path: write the figure there (PNG) and return the path; None: return the figure.

    Raises:
        ValueError: the results hold no elastic run.
    """
    import matplotlib

    if path is not None:
        matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    data = json.loads(Path(results).read_text()) if not isinstance(results, dict) else results
    run = data.get("elastic")
    if not run:
        raise ValueError("these results hold no elastic run (no 'elastic' entry): give the results file of a run "
                         "started with project/elastic.py")
    final = {(s, a) for s, a in zip(run["steps"], run["step_attempts"])}
    thrown = [e for e in run["executions"] if (e["step"], e["attempt"]) not in final]
    start = min(a["time"] for a in run["attempts"])
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(8, 5.8))
    top.plot(run["steps"], run["losses"], color="tab:blue", lw=1.5, label="loss (each step's last execution)")
    for world, marker in ((1, "x"), (2, "+")):
        mine = [e for e in thrown if e["world_size"] == world]
        if mine:
            top.plot([e["step"] for e in mine], [e["loss"] for e in mine], marker, color="tab:red", ms=8,
                     label=f"executions a restart threw away (world {world})")
    others = [e for e in thrown if e["world_size"] not in (1, 2)]
    if others:
        top.plot([e["step"] for e in others], [e["loss"] for e in others], "o", mfc="none", color="tab:red",
                 label="executions a restart threw away")
    largest = max(run["world_sizes"])
    smaller = [s for s, w in zip(run["steps"], run["world_sizes"]) if w < largest]
    for i, s in enumerate(smaller):  # the steps whose last execution ran on fewer ranks
        top.axvspan(s - 0.5, s + 0.5, color="tab:green", alpha=0.12, lw=0,
                    label=f"steps trained on fewer than {largest} ranks" if i == 0 else None)
    high = max(run["losses"])
    for i, r in enumerate(run["restarts"]):
        top.axvline(r["resumed_step"] + 0.5, color="tab:gray", ls=":", lw=1)
        top.annotate(f"attempt {r['attempt']} resumes", (r["resumed_step"] + 0.5, high), fontsize=7, va="top",
                     xytext=(3, -11 * i), textcoords="offset points")
    top.set(xlabel="optimizer step", ylabel="training loss (nats/token)",
            title="loss over the steps (the global batch's mean over its micro-batches)")
    top.legend(fontsize=7, loc="lower left")
    # world size over time: each attempt from its start to its last step, 0 while the run is down
    times, worlds = [], []
    for a in run["attempts"]:
        mine = [e["time"] for e in run["executions"] if e["attempt"] == a["attempt"]]
        end = max(mine, default=a["time"])
        times += [a["time"] - start, end - start, end - start]
        worlds += [a["world_size"], a["world_size"], 0]
    bottom.plot(times, worlds, color="tab:green", drawstyle="steps-post")
    bottom.plot([e["time"] - start for e in run["executions"]], [e["world_size"] for e in run["executions"]], ".",
                color="tab:green", ms=3, label="a step done")
    attempts = {a["attempt"]: a for a in run["attempts"]}
    top_world = max(a["world_size"] for a in run["attempts"])
    for i, r in enumerate(run["restarts"]):
        down_end = attempts[r["attempt"]]["time"] - start
        down_start = down_end - r["downtime_seconds"]
        bottom.axvspan(down_start, down_end, color="tab:red", alpha=0.15)
        cost = (f"; lost {r['steps_redone']} step(s), {r['seconds_lost']:.1f} s" if r["seconds_lost"] is not None
                else f"; lost {r['steps_redone']} step(s)")
        bottom.annotate(f"attempt {r['attempt']}: {r['cause']}, world {r['from_world']}→{r['to_world']}{cost}",
                        (down_start, top_world + 0.45 - 0.3 * i), fontsize=7, ha="left", va="top")
    bottom.set(xlabel="seconds since the first attempt started training", ylabel="ranks training",
               ylim=(0, top_world + 0.5),
               title="world size over time (shaded: down — failure noticed, rendezvous, restart, checkpoint load)")
    bottom.set_yticks(range(top_world + 1))
    bottom.legend(fontsize=7, loc="lower right")
    title = (f"elastic run, --nnodes {run['nnodes']}, --max_restarts {run['max_restarts']}: "
             f"{len(run['restarts'])} restart(s), {run['steps_redone']} step(s) redone, "
             f"{run['seconds_lost']:.1f} s lost")
    if data.get("machine"):  # project/elastic_demo.py's record: where it ran, and how loaded
        from course.benchmarking import conditions

        m = data["machine"]
        title += (f"\n{m['cores']} cores ({m['cpu_model']}), load average {m['load_average'][0]:.1f} before, "
                  f"{m['load_average_after'][0]:.1f} after: {conditions(m)}")
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    if path is None:
        return fig
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return Path(path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="The figure of an elastic run from its results file.")
    parser.add_argument("results", help="a results file of the run (e.g. workdir/rank0_results_epoch0.json)")
    parser.add_argument("--out", required=True, help="the PNG to write")
    options = parser.parse_args(argv)
    print(plot_elastic_run(options.results, options.out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
