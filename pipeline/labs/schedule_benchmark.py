"""Benchmark (not a test): bubble fraction and tokens/s of GPipe, 1F1B, interleaved 1F1B and ZB-H1
on real GPT-2 stages, count-balanced and measured-balanced, next to the theory.

    python -m pipeline.labs.schedule_benchmark --pp 2 4 --micro_batches 4 8 16 --out results/schedule_benchmark.json
    torchrun --standalone --nproc_per_node=4 -m pipeline.labs.schedule_benchmark --device cuda   # p = 4 GPUs

Times are read with :func:`course.measure.now` (on a GPU after the device's queued work has run;
``timer`` in the JSON), the events are the stage runner's spans (:mod:`course.trace`), the CPU seconds
:func:`course.measure.cpu_seconds`, the statistics and the machine description the benchmark harness's
(:mod:`course.benchmarking`). Under torchrun ``--pp`` is torchrun's world size and rank 0 writes the JSON.
The options are the run configuration's (``--pp``, ``--micro_batches``, ``--virtual_stages``, ``--schedule``,
``--balance``, ``--n_layer``: :class:`course.config.RunConfig`), each taking a list of values to sweep where it
says so.

For every ``p`` (``--pp``) and balance (``count``: blocks spread evenly, embeddings on the first and
the head on the last stage; ``auto``: :func:`pipeline.gpt2.gpt2_measured_balance` of the layers on the
run's device, :func:`layer_balances`) one
launch of ``p`` processes runs every schedule and every ``m`` (``--micro_batches``): ``--warmup`` untimed steps,
then ``--repeats`` timed steps. A step's bubble fraction is
:func:`pipeline.metrics.measured_bubble_fraction` of its timeline (idle share of
``p x`` step time); its tokens/s is the batch's tokens over the step's wall time (the
slowest rank); ``cores_busy`` is the CPU seconds of all ranks over the step's wall time
(how many cores the pipeline kept busy: with more processes than free cores the stages
wait for a core, not only for each other, and the wall-clock bubble cannot reach the theory).
So every step is also replayed (:func:`pipeline.metrics.replay`): each action's CPU seconds
run through the schedule's dependencies as if every rank had a core of its own — the
schedule's own bubble with the stages' real, unequal costs. On a GPU the host's CPU seconds say
nothing of the kernels' time, so there the replay runs each action's measured span (wall seconds read
after the device's work has run) as if every rank had a device of its own and hand-overs were free;
each row's ``replayed_from`` says which (:func:`replay_source`). The JSON holds, per
configuration, the median and min-max over the repeats and the theoretical bubble:

* GPipe, 1F1B: ``(p - 1) / (m + p - 1)``; interleaved with ``v`` chunks:
  ``(p - 1) / (v m + p - 1)`` (Narayanan et al. 2021, Sec. 2.2);
* ZB-H1 with equal F, B, W times: ``(p - 1) / (3 m + p - 1)``, a third of 1F1B's bubble
  time (Qi et al. 2024, Sec. 2.1). Here W re-traverses the stage's graph
  (:mod:`pipeline.stage_runner`), so W is not the equal third the formula assumes.

The model: the tiny GPT-2 preset with ``--n_layer`` blocks (12 by default), random tokens, micro-batches of ``--micro_batch_size``
sequences of ``--seq`` tokens. On a CPU machine, each process gets ``cores // p`` threads
(:mod:`course.launch`); with more processes than cores they share cores.

Why 12 blocks: with a vocabulary of 8192, the final norm + LM head + loss cost about four
blocks (measured by :func:`pipeline.gpt2.gpt2_measured_balance`). With 8 blocks that is
more than a quarter of the model, so no split into 4 contiguous stages is balanced: the
head's stage alone is the slowest, and the bubble stays above the theory whatever the
schedule. With 12 blocks a quarter of the model is larger than the head, and
``--balance auto`` can even the stages out. (GPT-2 small has the same problem at p = 4:
its head, 2·h·V flops per token, is about 5 of its 12 blocks' 24·h² each.)
"""
from __future__ import annotations

import sys

import torch

from pipeline.schedules import SCHEDULES  # noqa: E402

# the schedules it measures: those on the loop placement (the V-shaped ZB-V and DualPipeV keep the loss on rank 0
# and need V chunks; their bubble is replayed in tests/pipeline/test_dualpipe.py and notebook 02)
BENCHMARKED = tuple(name for name, s in SCHEDULES.items() if s.placement == "loop")


def _chunks(schedule: str, v: int) -> int:
    return v if SCHEDULES[schedule].interleaved else 1


def _model(cfg):
    from course.model import build_gpt2

    return build_gpt2("tiny", cfg["vocab"], n_positions=cfg["seq"], dropout=0.0, seed=0, n_layer=cfg["n_layer"])


def layer_balances(cfg: dict, n_ranks: int, device, group=None) -> dict[int, list[int] | None]:
    """``{v: layers per virtual stage}`` for 1 and ``cfg["v"]`` chunks per rank: None with ``cfg["balance"] ==
    "count"``; with ``"auto"``, :func:`pipeline.gpt2.gpt2_measured_balance` of the benchmark's model **on
    ``device``** (the run's device: a GPU's layer costs, not a CPU copy's; timed with :func:`course.measure.now`,
    which waits for the device's queued work) on a micro-batch of random tokens. Collective over ``group``
    with ``"auto"`` (every rank measures at once; all get the partition of the per-layer medians)."""
    from pipeline.gpt2 import gpt2_measured_balance

    balances: dict[int, list[int] | None] = {}
    for v in sorted({1, cfg["v"]}):
        balances[v] = None
        if cfg["balance"] == "auto":
            sample = torch.randint(0, cfg["vocab"], (cfg["micro_batch_size"], cfg["seq"]),
                                   generator=torch.Generator().manual_seed(2), device="cpu")
            balances[v], _ = gpt2_measured_balance(_model(cfg).to(device), n_ranks * v, sample, repeats=5, group=group)
    return balances


REPLAY_SOURCES = {"cpu": "CPU seconds per action (course.measure.cpu_seconds): one core per rank",
                  "device": "device-synchronised wall seconds per action (course.measure.now): one device per rank"}


def replay_source(device) -> str:
    """What the replay runs through the schedule on ``device`` (a key of :data:`REPLAY_SOURCES`): on the CPU each
    action's CPU seconds (the time a rank waited for a core left out); on a GPU, where the host's CPU seconds
    say nothing of the kernels' time, each action's wall time read after the device's work has run."""
    return "cpu" if torch.device(device).type == "cpu" else "device"


def replay_durations(step: dict, source: str) -> list[float]:
    """Seconds of each action of one rank's step (``step["events"]``, ``step["event_cpu_s"]``) for the replay:
    its CPU seconds (``source == "cpu"``) or its measured span, ``end - start`` (``"device"``)."""
    if source == "cpu":
        return list(step["event_cpu_s"])
    return [end - start for _, _, start, end in step["events"]]


def benchmark_worker(rank: int, world_size: int, cfg: dict) -> dict:
    """A worker for :func:`course.launch.launch`: ``{schedule: {m: [per step: events, wall_s, peaks]}}``."""
    import torch.distributed as dist

    from course.launch import context
    from course.measure import cpu_seconds, now
    from course.mesh import Mesh
    from pipeline.gpt2_stages import TiedGradients, gpt2_chunks
    from pipeline.metrics import measured_bubble_fraction  # noqa: F401 (documented use by the caller)
    from pipeline.schedules import schedule_actions
    from pipeline.stage_runner import StageRunner

    device = context().device
    mesh = Mesh.build(pp=world_size)
    group = mesh.pp_group
    v_max = cfg["v"]
    g = torch.Generator().manual_seed(1)
    mb, seq, vocab = cfg["micro_batch_size"], cfg["seq"], cfg["vocab"]
    balances = layer_balances(cfg, world_size, device, group)
    out = {"balance": {str(v): b for v, b in balances.items()}, "replay": replay_source(device)}

    def loss_fn(logits, target):
        return torch.nn.functional.cross_entropy(logits.flatten(0, 1), target.flatten())

    for schedule in cfg["schedules"]:
        v = _chunks(schedule, v_max)
        model = _model(cfg)
        chunks, tied = gpt2_chunks(model, mesh.stage, world_size, v, balances[v])
        sync_tied = TiedGradients(mesh.embedding_group)
        runner = StageRunner([c.to(device) for c in chunks], device, loss_fn=loss_fn, group=group)
        out[schedule] = {}
        for m in cfg["m"]:
            inputs = [torch.randint(0, vocab, (mb, seq), generator=g, device="cpu") for _ in range(m)]  # runner moves them
            targets = [torch.randint(0, vocab, (mb, seq), generator=g).to(device) for _ in range(m)]
            actions = schedule_actions(schedule, mesh.stage, world_size, m, v)
            steps = []
            for step in range(cfg["warmup"] + cfg["repeats"]):
                for c in chunks:
                    c.zero_grad(set_to_none=True)
                dist.barrier(group=group)
                start, cpu_start = now(device), cpu_seconds()
                result = runner.run(actions, inputs if mesh.is_first_stage else None,
                                    targets if mesh.is_last_stage else None)
                tied_start = now(device) - runner.origin
                sync_tied(tied)  # the tied embedding / LM head gradient summed between the end stages
                tied_event = [("AR", 0, tied_start, now(device) - runner.origin)] if tied is not None else []
                cpu = cpu_seconds() - cpu_start  # this process's CPU seconds (all its threads)
                dist.barrier(group=group)
                wall = now(device) - start
                if step >= cfg["warmup"]:
                    steps.append(dict(events=result.events, event_cpu_s=result.event_cpu_s,
                                      tied_events=tied_event, wall_s=wall, cpu_s=cpu,
                                      peak_in_flight=result.peak_in_flight,
                                      peak_activation_bytes=result.peak_activation_bytes))
            out[schedule][m] = steps
    return out


def run(p_values, m_values, schedules=BENCHMARKED, balances=("count", "auto"), v: int = 2, repeats: int = 3,
        warmup: int = 1, n_layer: int = 12, micro_batch_size: int = 4, seq: int = 32, vocab: int = 8192,
        timeout: float = 1800, keep_events: bool = False, device: str = "cpu", progress: bool = True) -> dict:
    """Run the benchmark; returns ``{"config", "rows": [one dict per (p, balance, schedule, m)]}``.

    ``keep_events``: each row also holds ``events[r]`` of its median-bubble step, with the
    tied-embedding all-reduce as an ``"AR"`` event on the first and last rank (it is not
    counted in the bubble: the schedules are compared on their own work), and that step's
    ``event_cpu_s[r]`` (CPU seconds per action, in the order of the schedule's actions: what a
    replay takes). ``device``: ``"cpu"``,
    ``"cuda"`` or ``"auto"`` (:func:`course.launch.resolve_device_backend`). ``progress``: print each launch's
    seconds on stderr (the command line does; a notebook, whose outputs are committed, does not)."""
    from course.benchmarking import machine, summarise
    from course.launch import launch_all
    from course.measure import now, timer_name
    from pipeline.metrics import measured_bubble_fraction, replay
    from pipeline.schedules import schedule_actions

    info = machine(device if device != "auto" else None)  # the load average before the ranks start

    rows = []
    for p in p_values:
        for balance in balances:
            cfg = dict(balance=balance, v=v, m=list(m_values), schedules=list(schedules), repeats=repeats,
                       warmup=warmup, n_layer=n_layer, micro_batch_size=micro_batch_size, seq=seq, vocab=vocab)
            t0 = now()
            per_rank = launch_all(benchmark_worker, p, cfg, device=device, timeout=timeout, collective_timeout=600)
            if progress:
                print(f"p={p} balance={balance}: {now() - t0:.0f} s", file=sys.stderr, flush=True)
            source = per_rank[0]["replay"]
            for schedule in schedules:
                for m in m_values:
                    bubbles, dedicated, walls, cores_used = [], [], [], []
                    actions = [schedule_actions(schedule, r, p, m, _chunks(schedule, v))
                               for r in range(p)]
                    for step in range(repeats):
                        events = [per_rank[r][schedule][m][step]["events"] for r in range(p)]
                        bubbles.append(measured_bubble_fraction(events))
                        durations = [replay_durations(per_rank[r][schedule][m][step], source) for r in range(p)]
                        dedicated.append(measured_bubble_fraction(replay(actions, durations)))
                        walls.append(max(per_rank[r][schedule][m][step]["wall_s"] for r in range(p)))
                        cores_used.append(sum(per_rank[r][schedule][m][step].get("cpu_s", float("nan"))
                                              for r in range(p)) / walls[-1])
                    tokens = m * micro_batch_size * seq
                    tps = summarise([tokens / w for w in walls])
                    bub, ded = summarise(bubbles), summarise(dedicated)
                    th = SCHEDULES[schedule].bubble(p, m, _chunks(schedule, v))
                    rows.append(dict(
                        p=p, balance=balance, schedule=schedule, m=m, v=_chunks(schedule, v),
                        layers_per_stage=per_rank[0]["balance"][str(_chunks(schedule, v))],
                        bubble_median=bub["median"], bubble_min=bub["min"], bubble_max=bub["max"],
                        theory=th, ratio_to_theory=bub["median"] / th if th else None,
                        dedicated_bubble_median=ded["median"], dedicated_bubble_min=ded["min"],
                        dedicated_bubble_max=ded["max"],
                        dedicated_ratio_to_theory=ded["median"] / th if th else None, replayed_from=source,
                        stage_cpu_s=[sum(per_rank[r][schedule][m][-1]["event_cpu_s"]) for r in range(p)],
                        tokens_per_s_median=tps["median"], tokens_per_s_min=tps["min"],
                        tokens_per_s_max=tps["max"], cores_busy_median=summarise(cores_used)["median"],
                        peak_in_flight=[per_rank[r][schedule][m][-1]["peak_in_flight"] for r in range(p)],
                        peak_activation_bytes=[per_rank[r][schedule][m][-1]["peak_activation_bytes"]
                                               for r in range(p)]))
                    if keep_events:
                        k = sorted(range(repeats), key=lambda s: bubbles[s])[repeats // 2]
                        rows[-1]["events"] = [per_rank[r][schedule][m][k]["events"]
                                              + per_rank[r][schedule][m][k]["tied_events"] for r in range(p)]
                        rows[-1]["event_cpu_s"] = [per_rank[r][schedule][m][k]["event_cpu_s"] for r in range(p)]
    config = dict(p=list(p_values), m=list(m_values), schedules=list(schedules), balances=list(balances), v=v,
                  repeats=repeats, warmup=warmup, n_layer=n_layer, micro_batch_size=micro_batch_size, seq=seq,
                  vocab=vocab, cpu_count=info["cores"], torch=torch.__version__, device=device,
                  timer=timer_name(device), replayed_from=sorted({r["replayed_from"] for r in rows}))
    return {"machine": info, "config": config, "rows": rows}


def format_table(report: dict) -> str:
    """A plain-text table of the rows."""
    sources = {r.get("replayed_from", "cpu") for r in report["rows"]}
    replayed = "one core per rank (replayed)" if sources == {"cpu"} else "one device per rank (replayed)"
    lines = [f"{'':27}{'wall clock, this machine':^30}{replayed:^30}",
             f"{'p':>2} {'bal':>5} {'schedule':>11} {'m':>3} {'theory':>6} "
             f"{'bubble':>7} {'(min-max)':>13} {'ratio':>6} {'bubble':>7} {'(min-max)':>13} {'ratio':>6} "
             f"{'cores':>5} {'tok/s':>7} {'(min-max)':>13}"]
    for r in report["rows"]:
        lines.append(f"{r['p']:>2} {r['balance']:>5} {r['schedule']:>11} {r['m']:>3} {r['theory']:6.3f} "
                     f"{r['bubble_median']:7.3f} ({r['bubble_min']:.3f}-{r['bubble_max']:.3f}) "
                     f"{r['ratio_to_theory']:6.2f} {r['dedicated_bubble_median']:7.3f} "
                     f"({r['dedicated_bubble_min']:.3f}-{r['dedicated_bubble_max']:.3f}) "
                     f"{r['dedicated_ratio_to_theory']:6.2f} {r['cores_busy_median']:5.2f} "
                     f"{r['tokens_per_s_median']:7.0f} ({r['tokens_per_s_min']:5.0f}-{r['tokens_per_s_max']:5.0f})")
    cores = report["config"].get("cpu_count")
    lines.append(f"cores: CPU seconds of all ranks per wall second of the step ({cores} cores here). With more ranks "
                 f"than cores, a rank also waits for a core, inside its actions as well as between them, so the "
                 f"wall-clock timeline holds the machine's waiting next to the schedule's bubble. The replay runs "
                 f"each action's {' and '.join(REPLAY_SOURCES[s] for s in sorted(sources))} through the schedule "
                 f"(pipeline.metrics.replay): the schedule's bubble with the stages' real costs.")
    return "\n".join(lines)


def make_parser():
    """The command line (:func:`course.benchmarking.parser` and this benchmark's own options)."""
    from course import benchmarking

    parser = benchmarking.parser(__doc__.split("\n\n")[0], out="results/schedule_benchmark.json", device="cpu",
                                 timeout=1800.0)
    sweep = "a list: each is measured"
    benchmarking.option(parser, "pp", nargs="+", default=[2, 4], note=sweep)
    benchmarking.option(parser, "micro_batches", nargs="+", default=[4, 8, 16], note=sweep)
    benchmarking.option(parser, "virtual_stages", default=2, note="the interleaved schedule's")
    benchmarking.option(parser, "schedule", nargs="+", default=list(BENCHMARKED), choices=list(BENCHMARKED), note=sweep)
    benchmarking.option(parser, "balance", nargs="+", default=["count", "auto"], note=sweep)
    benchmarking.option(parser, "n_layer", default=12)
    return parser


def parse_args(argv=None):
    from course import benchmarking
    from pipeline.schedules import micro_batches_per_round

    parser = make_parser()
    args = parser.parse_args(argv)
    size = benchmarking.torchrun_size(parser, args.pp, "--pp", argv)
    args.pp = [size] if size else args.pp
    if min(args.pp) < 1 or min(args.micro_batches) < 1 or args.virtual_stages < 1:
        parser.error("--pp, --micro_batches and --virtual_stages must be >= 1")
    benchmarking.check(parser, args, max(args.pp))
    if max(args.pp) * args.virtual_stages > args.n_layer:
        parser.error(f"--pp {max(args.pp)} x --virtual_stages {args.virtual_stages} virtual stages need that many "
                     "blocks; raise --n_layer")
    for p in args.pp:
        for m in args.micro_batches:
            try:
                micro_batches_per_round(p, m)
            except ValueError as exc:
                parser.error(f"--micro_batches {m} with --pp {p}: {exc}")
    return args


def main(argv=None) -> int:
    from course.benchmarking import describe, write_report
    from course.launch import reports_results

    args = parse_args(argv)
    report = run(args.pp, args.micro_batches, args.schedule, args.balance, args.virtual_stages, args.repeats,
                 args.warmup, args.n_layer, device=args.device, timeout=args.timeout)
    if not reports_results():
        return 0
    write_report(args.out, report)
    print(describe(report["machine"]))
    print(format_table(report))
    print(f"written: {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
