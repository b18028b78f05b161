"""Choosing ``(dp, pp, tp)``: rank the factorisations by prediction and by measurement, and MFU.

Notebook 06 predicts each factorisation's step time and memory per rank with the planner
(``python -m project.planner``), measures them (:mod:`three_d.labs.factorisation_benchmark`) and compares the two
orders with :func:`compare_rankings`; :func:`leader_verdicts` says whether the factorisation with the best
median is measurably faster than every other (:func:`course.benchmarking.compare`), the only way the notebook
names a fastest one. :func:`mfu` is the field's model FLOPs utilisation, :func:`matmul_rate` the peak it divides
by, measured under the run's own concurrency, and :data:`PUBLISHED` the figures papers report for large GPU runs.
:func:`replayed_steps` gives the step time of a factorisation on a machine with a core per rank from the costs its
ranks measured (when the run had more ranks than cores, its wall clock is no measure of the factorisation).
"""
from __future__ import annotations

import statistics


def ranks(values: dict, *, largest_first: bool = False) -> dict:
    """``{key: place}`` with place 1 for the smallest value (the largest with ``largest_first``); ties share the
    better place."""
    order = sorted(values.values(), reverse=largest_first)
    return {k: order.index(v) + 1 for k, v in values.items()}


def spearman(a: dict, b: dict) -> float:
    """Spearman's rank correlation of two ``{key: place}`` over their common keys (1: the same order, -1: the
    reverse; ``nan`` with fewer than two keys or a constant ranking)."""
    keys = [k for k in a if k in b]
    if len(keys) < 2:
        return float("nan")
    xs, ys = [a[k] for k in keys], [b[k] for k in keys]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    sxy = sum((x - mx) * (y - my) for x, y in zip(xs, ys))
    sxx, syy = sum((x - mx) ** 2 for x in xs), sum((y - my) ** 2 for y in ys)
    return sxy / (sxx * syy) ** 0.5 if sxx and syy else float("nan")


def compare_rankings(predicted: dict, measured: dict, quantity: str) -> list[dict]:
    """One row per key of ``predicted`` and ``measured`` (``{(dp, pp, tp): value}``, smaller is better: seconds
    or bytes): both values, their ratio ``predicted / measured`` and both places. Sorted by measured place.

    Raises:
        ValueError: the two do not hold the same factorisations.
    """
    if set(predicted) != set(measured):
        raise ValueError(f"predicted and measured {quantity} cover different factorisations: "
                         f"{sorted(set(predicted) ^ set(measured))}")
    p_rank, m_rank = ranks(predicted), ranks(measured)
    rows = [{"dp·pp·tp": "·".join(map(str, key)), f"predicted {quantity}": predicted[key],
             f"measured {quantity}": measured[key], "predicted / measured": predicted[key] / measured[key],
             "predicted place": p_rank[key], "measured place": m_rank[key]} for key in predicted]
    return sorted(rows, key=lambda r: (r["measured place"], r["predicted place"]))


def mfu(model_flops_per_step: float, step_s: float, n_devices: int, peak_flops: float) -> float:
    """Model FLOPs utilisation: the model's FLOPs of one step (forward and backward, ``6 N`` per token plus
    attention, recomputation not counted) over what ``n_devices`` devices at ``peak_flops`` FLOP/s each could
    do in ``step_s`` seconds (Chowdhery et al. 2022, PaLM, App. B).

    Raises:
        ValueError: a non-positive time, device count or peak.
    """
    if step_s <= 0 or n_devices < 1 or peak_flops <= 0:
        raise ValueError(f"mfu needs step_s > 0, n_devices >= 1 and peak_flops > 0 (got {step_s}, {n_devices}, "
                         f"{peak_flops})")
    return model_flops_per_step / (step_s * n_devices * peak_flops)


def leader_verdicts(seconds: dict, conditions=None) -> dict:
    """Is the factorisation with the smallest median step measurably the fastest?

    ``seconds`` is ``{(dp, pp, tp): [seconds per step, one per repeat]}``, measured side by side (repeat k of
    every factorisation in the same round, :func:`course.benchmarking.interleaved`). The *leader* is the key
    with the smallest median; it is compared with every other by :func:`course.benchmarking.compare` (its paired
    sign test), each verdict printed with ``conditions`` (a machine record, or ``"replayed ..."``).

    Returns:
        ``{"leader", "verdicts" ({other key: compare's dict of leader against it}), "fastest" (the leader when
        it is faster than every other, else None), "tied" (keys it is indistinguishable from), "sentence"}``.

    Raises:
        ValueError: fewer than two factorisations, or their repeats are not side by side (see ``compare``).
    """
    from course.benchmarking import compare

    if len(seconds) < 2:
        raise ValueError(f"a fastest factorisation needs at least two to compare, not {len(seconds)}")
    name = lambda k: "·".join(map(str, k))
    leader = min(seconds, key=lambda k: statistics.median(seconds[k]))
    verdicts = {k: compare(seconds[leader], v, (name(leader), name(k)), conditions=conditions)
                for k, v in seconds.items() if k != leader}
    tied = [k for k, v in verdicts.items() if v["verdict"] != "faster"]
    if not tied:
        closest = max(verdicts, key=lambda k: verdicts[k]["ratio"]["median"])  # leader / other nearest 1
        sentence = (f"{name(leader)} (dp·pp·tp) is the fastest, faster than each of the other "
                    f"{len(verdicts)}; the closest: {verdicts[closest]['sentence']}")
        fastest = leader
    else:
        sentence = (f"no factorisation is measurably the fastest: {name(leader)} has the best median "
                    f"but is indistinguishable from {', '.join(name(k) for k in tied)} "
                    f"({verdicts[tied[0]]['sentence']})")
        fastest = None
    return {"leader": leader, "verdicts": verdicts, "fastest": fastest, "tied": tied, "sentence": sentence}


def matmul_rate(rank: int, world_size: int, rows: int, inner: int, cols: int, repeats: int = 5,
                flop_per_repeat: float = 2e9, threads: int | None = None) -> dict:
    """Worker: the FLOP/s of an fp32 matrix product ``(rows, inner) x (inner, cols)`` per rank **while every rank
    of the launch runs it at once** — the peak an MFU of a run with as many ranks on the same machine divides
    by (on a CPU the ranks share the cores; a peak measured by one rank alone would overstate what each of
    them can reach by about ranks per core).

    Each repeat: every rank computes ``flop_per_repeat`` FLOPs of products (a loop far longer than the
    scheduler's time slice, so the ranks do run together), timed from a barrier to the end of the slowest
    rank (:func:`course.benchmarking.timed`); one untimed repeat first. Rate per rank = FLOPs per rank /
    that wall time. ``threads``: torch's intra-op threads per rank (None: the launcher's, cores // ranks on a
    CPU); the run's ranks each have one when there are at least as many ranks as cores.

    Returns:
        ``{"world_size", "threads", "flops_per_rank" (:func:`course.benchmarking.summarise` of FLOP/s, one per repeat),
        "shape"}`` — the same on every rank.

    Raises:
        ValueError: a non-positive size, fewer than :data:`course.benchmarking.MIN_REPEATS` repeats, or threads < 1.
    """
    import torch
    import torch.distributed as dist

    from course.benchmarking import MIN_REPEATS, summarise, timed
    from course.launch import context

    if min(rows, inner, cols) < 1 or flop_per_repeat <= 0:
        raise ValueError(f"matmul_rate needs positive sizes, not ({rows}, {inner}) x ({inner}, {cols})")
    if repeats < MIN_REPEATS:
        raise ValueError(f"repeats must be >= {MIN_REPEATS}, not {repeats}")
    if threads is not None and threads < 1:
        raise ValueError(f"threads must be >= 1, not {threads}")
    device = context().device
    if threads is not None:
        torch.set_num_threads(threads)
    x, w = torch.randn(rows, inner, device=device), torch.randn(inner, cols, device=device)
    per_call = 2.0 * rows * inner * cols
    calls = max(1, int(flop_per_repeat // per_call))

    def work():
        for _ in range(calls):
            x @ w

    work()  # warm-up
    world = dist.group.WORLD
    rates = [calls * per_call / timed(work, device, group=world) for _ in range(repeats)]
    return {"world_size": world_size, "threads": torch.get_num_threads(), "flops_per_rank": summarise(rates),
            "shape": [rows, inner, cols]}


def megatron_flops_per_step(batch: int, seq: int, layers: int, hidden: int, vocab: int, *,
                            recomputation: bool = True) -> float:
    """FLOPs of one training step of a GPT as Narayanan et al. 2021 count them (Sec. 5.1):
    ``96 B s l h^2 (1 + s / 6h + V / 16 l h)`` with full activation recomputation (the forward pass runs twice:
    hardware FLOPs); without it (``recomputation=False``) the blocks' forward runs once:
    ``72 B s l h^2 (1 + s / 6h) + 6 B s h V`` — the model FLOPs MFU counts."""
    blocks = 72.0 * batch * seq * layers * hidden ** 2 * (1 + seq / (6 * hidden))
    if recomputation:
        blocks *= 96.0 / 72.0
    return blocks + 6.0 * batch * seq * hidden * vocab


# Published utilisation of large runs; "counted" says which FLOPs the numerator holds.
PUBLISHED = [
    {"run": "Megatron-LM, 1T-parameter GPT, 3072 A100 (dp 6 x pp 64 x tp 8)", "utilisation": 0.52,
     "counted": "hardware FLOPs: 96 B s l h^2 (...) counts the recomputed forward pass",
     "source": "Narayanan et al. 2021, Table 1 and Sec. 5.1 (163 TFLOP/s per GPU of 312)"},
    {"run": "PaLM 540B, 6144 TPU v4", "utilisation": 0.462, "counted": "model FLOPs (MFU)",
     "source": "Chowdhery et al. 2022, Table 3 and App. B (57.8% counting rematerialisation: HFU)"},
    {"run": "GPT-3 175B, V100 (as PaLM estimates it)", "utilisation": 0.213, "counted": "model FLOPs (MFU)",
     "source": "Chowdhery et al. 2022, Table 3"},
]


REPLAYED = "replayed (each rank's CPU seconds per action on a core of its own; messages at their CPU cost)"


def replayed_steps(report: list[dict], key: tuple[int, int, int]) -> list[float]:
    """Seconds per step of the factorisation ``key`` = ``(dp, pp, tp)``, one per repeat, *replayed* from its ranks'
    costs (:func:`three_d.factorisation_benchmark.benchmark_worker`'s ``costs``: per rank, the CPU seconds of each
    action of its 1F1B list and of the rest of the step): the schedule laid out on a device per rank
    (:func:`pipeline.metrics.replay`), each stage's action taking the longest of its ranks' costs (the tp ranks of a
    stage wait for each other in every all-reduce, the dp ranks run the same work), then the rest of the step on the
    slowest rank. A process's CPU seconds leave out its waits for a core and for its peers, so this is the step on a
    machine with a core per rank where a message costs its CPU work (copies, system calls) and no wire time.

    Raises:
        KeyError: no row of ``key`` in ``report``.
    """
    from pipeline import one_f_one_b_actions, replay
    from three_d.mesh_arithmetic import coordinates

    dp, pp, tp = key
    rows = sorted((r for r in report if (r["dp"], r["pp"], r["tp"]) == key), key=lambda r: r["repeat"])
    if not rows:
        raise KeyError(f"no measurement of {key} in the report")
    actions = [one_f_one_b_actions(s, pp, rows[0]["micro_batches"]) for s in range(pp)]
    stage_of = [coordinates(r, dp, pp, tp)[0] for r in range(dp * pp * tp)]
    out = []
    for row in rows:
        costs = row["costs"]
        per_stage = [[max(costs[r]["events"][j] for r in range(len(costs)) if stage_of[r] == s)
                      for j in range(len(actions[s]))] for s in range(pp)]
        events = replay(actions, per_stage)
        span = max(e[3] for ev in events for e in ev) - min(e[2] for ev in events for e in ev)
        out.append(span + max(c["tail"] for c in costs))
    return out
