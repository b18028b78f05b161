"""The course's GPU report: what one GPU measures, in one command, written to ``results/gpu/``.

    python project/tools/gpu_report.py                    # on a CUDA GPU; the tier is cut off after --tests_timeout
    python project/tools/gpu_report.py --device cpu --out /tmp/r   # a dry run with tiny sizes (seconds; CI runs it)

On one GPU (``cuda:0`` of this process; ``CUDA_VISIBLE_DEVICES`` picks which) it records:

1. **the GPU tier on one GPU** — ``pytest -m gpu tests/gpu`` in a subprocess that sees that GPU only
   (``CUDA_VISIBLE_DEVICES``), bounded by ``--tests_timeout`` (the whole process group is killed past
   it): every test's outcome, and the reason of each skip (the tests that need 2, 4 or 8 GPUs skip);
2. **the measured matrix-product peak** — bf16 products of square ``n x n`` matrices for each of
   ``--matmul_sizes`` (``2 n^3`` FLOPs each), beside the datasheet's dense bf16 peak of the detected GPU
   (:func:`course.hardware.datasheet_bf16_peak`; sparse figures are not peaks a dense product can reach;
   :func:`project.tools.gpu_report_kernels.matmul_peak`);
3. **tokens/s and MFU** — training steps of the ``--preset`` GPT-2 (``gpt2``, 124M, by default) in bf16
   (:class:`memory.training.ShardedStep`: autocast, fp32 master weights and AdamW, one rank) on synthetic
   tokens (:func:`memory.labs.experiments.random_batch`: throughput does not depend on what the tokens say),
   plain and with activation checkpointing, interleaved; MFU (:func:`three_d.choosing.mfu`, model FLOPs of
   :func:`course.model.model_flops_per_token`, recomputation not counted) against the datasheet's peak and
   against the measured matrix-product peak; the verdict of checkpointing against plain
   (:func:`course.benchmarking.compare`);
4. **peak memory against the planner** — ``torch.cuda.max_memory_allocated`` of a training step
   (:class:`course.measure.MemoryMeter`, each variant alone on the GPU) beside the planner's prediction for
   the same configuration (:func:`project.planner.memory.stage_memory`: parameters, gradients, AdamW state,
   activations of the course's GPT-2 blocks, and with checkpointing the recomputed block);
5. **activation checkpointing's recomputation** on the GPU, under bf16 autocast with dropout on: each
   block's recomputed output equal to the forward pass's, bit for bit (:func:`memory.labs.experiments.recomputation_check`);
6. **the planner's kernel figures** (:func:`project.tools.gpu_report_kernels.kernel_figures`): the bf16 matrix
   products of the shapes the planner prices (:data:`project.tools.gpu_report_kernels.PLANNER_SHAPES`: Llama 3
   8B's and GPT-2's layers at the token counts of a micro-batch) beside the planner's efficiency for each
   (:func:`project.planner.pricing.gemm_efficiency`), the bandwidth memory-bound kernels reach (a copy, an add, a
   GeLU, a LayerNorm) over the datasheet's, and SDPA's causal attention forward and backward at head dimension 128
   beside FlashAttention-2's published figure;
7. **the planner's step beside the measured one** (:func:`planner_step`): the planner's prediction of the one-GPU
   training step measured in 3 (``--preset``, bf16, the course's eager GPT-2 blocks) and its error.

Every timing goes through the course's one harness (:mod:`course.benchmarking`: warm-up, interleaved
repeats, median and min-max, the machine and its conditions). The report is written atomically to
``--out``/``<device>-<YYYY-MM-DD>.json`` (never over an earlier report: a second one the same day gets
``-2``, ``-3``, ...) and summarised on the screen; notebooks 05 and 06 show it
(:mod:`course.gpu_figures`). Without a GPU, ``--device auto`` (the default) says so and exits 0;
``--device cpu`` runs every step with tiny sizes (a dry run of this code, written to
``workdir/gpu_report/`` unless ``--out`` says otherwise, and never shown by the notebooks).
"""
from __future__ import annotations

import datetime
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

if __name__ == "__main__":  # run as a file: import the packages of the tree this script sits in
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from course.gpu_figures import KIND, RESULTS as GPU_OUT  # noqa: E402 (the reports the notebooks show)
from project.tools.gpu_report_kernels import kernel_figures, matmul_peak, release  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
DRY_RUN_OUT = "workdir/gpu_report"  # dry runs (--device cpu): out of the repository's tracked files
# Sizes per device: a GPU measures the course's gpt2 run shape (RunConfig's defaults: batch 64 of 128 tokens,
# a 5000-token BPE); the CPU dry run only proves the code runs.
SIZES = {"cuda": dict(preset="gpt2", batch_size=64, model_max_length=128, vocab_size=5000,
                      matmul_sizes=[4096, 8192, 16384], steps=5, check_batch_size=4),
         "cpu": dict(preset="tiny", batch_size=2, model_max_length=16, vocab_size=300, matmul_sizes=[64, 128],
                     steps=1, check_batch_size=2)}
DROPOUT = 0.1
VARIANTS = {"plain": False, "checkpointing": True}  # name -> activation checkpointing
NEEDS = ("a5_5_4",)  # the assignments whose code the report runs (memory.checkpointing)


def make_parser():
    """The command line: :func:`course.benchmarking.parser`'s shared options and the report's own."""
    from course import benchmarking

    parser = benchmarking.parser(__doc__.split("\n\n")[0], out=GPU_OUT, repeats=7, warmup=2)  # 7: a verdict
    parser.set_defaults(out=None)
    for action in parser._actions:
        if action.dest == "out":
            action.help = (f"folder of the report, written as <device>-<date>.json (default: {GPU_OUT}; "
                           f"{DRY_RUN_OUT} for --device cpu)")
    g = parser.add_argument_group("what is measured (defaults: the course's gpt2 run on a GPU, tiny sizes on the CPU)")
    for name in ("preset", "batch_size", "model_max_length", "vocab_size"):
        benchmarking.option(g, name, default=None, note="synthetic tokens, every sequence this long" if
                            name == "model_max_length" else None)
    g.add_argument("--matmul_sizes", type=int, nargs="+", default=None, help="n of the n x n bf16 products")
    benchmarking.steps_option(g, None)
    g.add_argument("--tests_timeout", type=float, default=300.0, help="seconds the GPU tier may take (then killed)")
    g.add_argument("--no_tests", action="store_true", help="leave out the GPU tier (measurements only)")
    return parser


def parse(argv=None):
    """Parse and check ``argv`` before anything runs (exits through ``parser.error`` with what to change).
    Returns ``(args, plans)`` — ``plans``: the planner's configuration per variant — or ``(args, None)``
    when ``--device auto`` finds no GPU."""
    from course import benchmarking
    from course.assignments import AssignmentNotDone, require
    from course.model import PRESETS

    parser = make_parser()
    args = parser.parse_args(argv)
    asked = args.device
    args = benchmarking.check(parser, args, 1, out_folder=True)
    if asked == "auto" and args.device != "cuda":
        return args, None
    for name, value in SIZES[args.device].items():
        if getattr(args, name, None) is None:
            setattr(args, name, value)
    if args.out is None:  # the repository's folders, wherever the command is started from
        args.out = REPO / (GPU_OUT if args.device == "cuda" else DRY_RUN_OUT)
    if args.preset not in PRESETS:
        parser.error(f"--preset must be one of {sorted(PRESETS)}, not {args.preset!r}")
    for name in ("batch_size", "steps"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be >= 1, not {getattr(args, name)}")
    if any(n < 1 for n in args.matmul_sizes):
        parser.error(f"--matmul_sizes must be positive matrix sizes, not {args.matmul_sizes}")
    if args.tests_timeout <= 0:
        parser.error(f"--tests_timeout must be positive (seconds), not {args.tests_timeout}")
    if args.out.suffix == ".json":
        parser.error(f"--out is the folder of the report (its name is <device>-<date>.json), not a file: "
                     f"try --out {args.out.parent}")
    args.gpu_name = None
    if args.device == "cuda":
        import torch

        args.gpu_name = torch.cuda.get_device_name(0)
    try:
        plans = {name: plan_config(args, ckpt) for name, ckpt in VARIANTS.items()}
    except ValueError as exc:
        parser.error(f"the planner cannot take this configuration: {exc}")
    try:  # the training steps with checkpointing and the recomputation check run the code of assignment 5.5.4
        require(*NEEDS)
    except AssignmentNotDone as exc:
        parser.error(f"the GPU report measures activation checkpointing: {exc}")
    return args, plans


# ---- the device ---------------------------------------------------------------------------------------

def slug(text: str) -> str:
    """``"NVIDIA H100 80GB HBM3"`` -> ``"nvidia-h100-80gb-hbm3"`` (a file name's part)."""
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-") or "device"


def planner_hardware(gpu_name: str | None) -> str:
    """The planner's ``--hardware`` for the GPU CUDA calls ``gpu_name`` (None: the CPU, ``cpu``): its figures of
    that kind when it has them (``h100``, ``h200``, ``a100``), else ``h100`` — a memory prediction uses only what
    every GPU shares (1-byte dropout masks) and the device's memory (whether it fits)."""
    if gpu_name is None:
        return "cpu"
    for key in ("h200", "a100", "h100"):
        if key in gpu_name.lower() and "gh200" not in gpu_name.lower():
            return key
    return "h100"


def describe_device(device) -> dict:
    """``{"type", "name", "slug", "total_memory_bytes", "capability", "visible"}`` of ``device``."""
    import torch

    if device.type != "cuda":
        return {"type": "cpu", "name": "CPU (dry run)", "slug": "cpu-dry-run", "total_memory_bytes": None,
                "capability": None, "visible": 0}
    props = torch.cuda.get_device_properties(device)
    return {"type": "cuda", "name": props.name, "slug": slug(props.name), "total_memory_bytes": props.total_memory,
            "capability": f"{props.major}.{props.minor}", "visible": torch.cuda.device_count()}


def versions() -> dict:
    import platform

    import torch
    import transformers

    cudnn = torch.backends.cudnn.version() if torch.cuda.is_available() else None
    return {"torch": torch.__version__, "cuda": torch.version.cuda, "cudnn": cudnn,
            "transformers": transformers.__version__, "python": platform.python_version()}


# ---- 1. the GPU tier on one GPU -----------------------------------------------------------------------

def one_gpu() -> str:
    """The ``CUDA_VISIBLE_DEVICES`` that shows the tests this process's ``cuda:0`` only."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    return visible.split(",")[0].strip() if visible else "0"


def run_gpu_tier(device_type: str, timeout: float) -> dict:
    """``pytest -m gpu tests/gpu`` on one GPU (on the CPU dry run: on none, so every test skips with its
    reason), in a process group of its own, killed after ``timeout`` seconds. Returns ``{"command", "env",
    "timeout_s", "seconds", "returncode", "timed_out", "counts", "cases"
    (:func:`project.tools.modal_support.gpu_tier_cases`), "output_tail"}``."""
    from project.tools.modal_support import gpu_tier_cases

    visible = one_gpu() if device_type == "cuda" else ""
    with tempfile.TemporaryDirectory(prefix="gpu_tier_") as tmp:
        xml = Path(tmp) / "gpu_tier.xml"
        command = [sys.executable, "-m", "pytest", "-m", "gpu", "-rs", "-q", "-p", "no:randomly", "tests/gpu",
                   "--junitxml", str(xml)]
        env = dict(os.environ, CUDA_VISIBLE_DEVICES=visible,
                   PYTHONPATH=os.pathsep.join([str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])]))
        start = time.monotonic()
        proc = subprocess.Popen(command, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True, start_new_session=True)
        timed_out = False
        try:
            output, _ = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            timed_out = True
            for sig in (signal.SIGTERM, signal.SIGKILL):  # the tests' ranks and servers too: the whole group
                try:
                    os.killpg(proc.pid, sig)
                except ProcessLookupError:
                    break
                try:
                    output, _ = proc.communicate(timeout=10)
                    break
                except subprocess.TimeoutExpired:
                    continue
            else:
                output = ""
        finally:  # nothing of the tier outlives it (a rank or server left behind would hold the GPU)
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        seconds = time.monotonic() - start
        cases = gpu_tier_cases(xml.read_text()) if xml.exists() else []
    counts = {k: sum(c["outcome"] == k for c in cases) for k in ("passed", "failed", "skipped")}
    ok = not timed_out and proc.returncode in (0, 5) and not counts["failed"]  # 5: no test collected
    return {"command": " ".join(["python", *command[1:-1], "<tmp>/gpu_tier.xml"]),
            "env": {"CUDA_VISIBLE_DEVICES": visible}, "timeout_s": timeout, "seconds": seconds,
            "returncode": proc.returncode, "timed_out": timed_out, "counts": counts, "cases": cases,
            "output_tail": "" if ok else (output or "")[-3000:]}


# ---- 3 and 4. training: tokens/s, MFU, peak memory against the planner --------------------------------

def plan_config(args, checkpointing: bool):
    """The planner's configuration (:class:`project.planner.cli.PlanConfig`) of the measured run: one rank, ZeRO-0,
    bf16, dropout on, the course's GPT-2 blocks (``activation_model="course"``).

    Raises:
        ValueError (:class:`course.config.ConfigError`): sizes the planner refuses.
    """
    from project.planner.config import PlanConfig

    hardware = planner_hardware(args.gpu_name if args.device == "cuda" else None)
    return PlanConfig.for_test(preset=args.preset, hardware=hardware, vocab_size=args.vocab_size,
                               model_max_length=args.model_max_length, batch_size=args.batch_size, dp=1, pp=1, tp=1,
                               precision="bf16", dropout=DROPOUT, activation_checkpointing=checkpointing,
                               activation_model="course", device="cpu")


def predicted_memory(config) -> dict:
    """The planner's bytes for the one rank of ``config`` (:func:`project.planner.memory.stage_memory`) and their
    total."""
    from project.planner.memory import stage_memory

    memory = stage_memory(config, 0)
    return {"bytes": memory.total, "parts": memory.categories()}


def training_step(args, device, checkpointing: bool):
    """A fresh GPT-2 of ``args.preset`` on ``device`` and a function doing one bf16 training step on a synthetic
    batch (``args.batch_size`` x ``args.model_max_length`` tokens): ``(model, step)``."""
    import torch

    from course.model import build_gpt2
    from memory.labs.experiments import random_batch
    from memory.training import ShardedStep

    model = build_gpt2(args.preset, args.vocab_size, n_positions=args.model_max_length, dropout=DROPOUT, seed=0)
    model.config.use_cache = False
    model = model.to(device).train()
    sharded = ShardedStep(model, 0, None, torch.optim.AdamW, activation_checkpointing=checkpointing,
                          precision="bf16", lr=1e-4)
    batch = random_batch(0, args.batch_size, args.model_max_length, args.vocab_size, device=device)
    return model, (lambda: sharded.train_step(batch, device))


def peak_memory(args, device, plans: dict) -> dict:
    """Per variant, alone on the device: the peak memory of ``args.repeats`` training steps after
    ``args.warmup`` (at least one: AdamW's state exists) beside the planner's prediction."""
    from course.benchmarking import summarise
    from course.measure import MemoryMeter, memory_name

    out = {}
    for name, checkpointing in VARIANTS.items():
        model, step = training_step(args, device, checkpointing)
        for _ in range(max(1, args.warmup)):
            step()
        peaks, held = [], []
        for _ in range(args.repeats):
            with MemoryMeter(device) as meter:
                step()
            peaks.append(meter.peak_bytes)
            held.append(meter.start_bytes)  # before the step: weights, AdamW state (gradients are set to None)
        del model, step
        release(device)
        predicted = predicted_memory(plans[name])
        found = summarise(peaks)
        out[name] = {"activation_checkpointing": checkpointing, "peak_bytes": found, "start_bytes": summarise(held),
                     "predicted_bytes": predicted["bytes"], "predicted": predicted["parts"],
                     "measured_over_predicted": found["median"] / predicted["bytes"]}
    planner = plans["plain"]
    return {"measure": memory_name(device), "variants": out,
            "planner": f"project.planner.memory.stage_memory (--hardware {planner.hardware}, --activation_model course, "
                       f"--precision bf16, --zero 0, --dropout {DROPOUT})"}


def throughput(args, device, peaks: dict) -> dict:
    """Tokens/s and MFU of the training step, plain and with checkpointing, interleaved; ``peaks``: ``{name:
    FLOP/s}`` the MFU is taken against (the datasheet's, the measured product peak)."""
    from course.benchmarking import compare, interleaved, summarise
    from course.model import count_parameters, model_flops_per_token
    from three_d.choosing import mfu

    models, steps = {}, {}
    for name, checkpointing in VARIANTS.items():
        models[name], steps[name] = training_step(args, device, checkpointing)
    n_params = count_parameters(models["plain"])
    k = args.steps
    seconds = interleaved({name: step for name, step in steps.items()}, args.repeats, args.warmup, device, inner=k)
    tokens = args.batch_size * args.model_max_length
    flops = model_flops_per_token(args.preset, args.vocab_size, args.model_max_length) * tokens
    variants = {}
    for name, checkpointing in VARIANTS.items():
        times = seconds[name]
        variants[name] = {"activation_checkpointing": checkpointing, "step_s": summarise(times),
                          "tokens_per_s": summarise([tokens / t for t in times]),
                          **{f"mfu_{peak}": (summarise([mfu(flops, t, 1, flop_s) for t in times]) if flop_s else None)
                             for peak, flop_s in peaks.items()}}
    verdict = compare(seconds["checkpointing"], seconds["plain"], ("checkpointing", "plain"), unit="s",
                      conditions="one GPU, measured")
    del models, steps
    release(device)
    return {"preset": args.preset, "n_params": n_params, "precision": "bf16", "dropout": DROPOUT,
            "batch_size": args.batch_size, "seq_len": args.model_max_length, "vocab_size": args.vocab_size,
            "tokens": "synthetic (memory.labs.experiments.random_batch)", "tokens_per_step": tokens,
            "model_flops_per_step": flops, "steps_per_repeat": k, "variants": variants,
            "checkpointing_vs_plain": verdict}


# ---- 7. the planner's step beside the measured one (2 and 6: project/tools/gpu_report_kernels.py) -----

def planner_step(config, training: dict) -> dict:
    """The planner's prediction (:func:`project.planner.step.predict` on ``config``'s hardware profile) of the
    one-GPU training step measured in :func:`throughput` (the plain variant), beside the measured median, with
    the error and where the planner says the step goes. On the CPU dry run the profile is the H100's and the
    comparison is not meaningful (``"comparable": False``)."""
    from course.hardware import HARDWARE
    from project.planner.step import predict

    comparable = config.hardware != "cpu"
    kind = config.hardware if comparable else "h100"
    prediction = predict(config, HARDWARE[kind])
    measured = training["variants"]["plain"]["step_s"]["median"]
    return {"hardware": kind, "comparable": comparable, "predicted_s": prediction.step_s, "measured_s": measured,
            "error": prediction.step_s / measured - 1, "shares": prediction.shares(),
            "mfu_predicted": prediction.mfu}


# ---- the report ---------------------------------------------------------------------------------------

def free_path(folder: Path, stem: str) -> Path:
    """``folder/stem.json``, or ``stem-2.json``, ``stem-3.json``, ... : the first name no report has yet."""
    path, k = folder / f"{stem}.json", 2
    while path.exists():
        path, k = folder / f"{stem}-{k}.json", k + 1
    return path


def measure(args, plans: dict, log=print) -> dict:
    """Run the tier and every measurement; the report (module docstring)."""
    import torch

    from course import benchmarking
    from course.hardware import datasheet_bf16_peak
    from memory.labs.experiments import recomputation_check

    start = time.monotonic()
    device = torch.device("cuda", 0) if args.device == "cuda" else torch.device("cpu")
    if device.type == "cpu":  # the dry run proves the code runs; one thread keeps it quick on a busy machine
        torch.set_num_threads(1)
    created = datetime.datetime.now(datetime.timezone.utc)
    info = benchmarking.machine(device, busy_ranks=1)
    dev = describe_device(device)
    log(f"GPU report on {dev['name']} ({benchmarking.describe(info)})")
    report = {"kind": KIND, "version": 1, "created": created.isoformat(timespec="seconds"),
              "date": created.date().isoformat(), "dry_run": device.type != "cuda", "device": dev,
              "versions": versions(), "machine": info,
              "config": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}
              | {"torch_threads": torch.get_num_threads()}}
    if args.no_tests:
        report["tests"] = None
    else:
        log(f"[{time.monotonic() - start:5.0f} s] the GPU tier on one GPU (pytest -m gpu tests/gpu, at most "
            f"{args.tests_timeout:.0f} s) ...")
        report["tests"] = run_gpu_tier(device.type, args.tests_timeout)
        log(f"[{time.monotonic() - start:5.0f} s]   {tests_line(report['tests'])}")
    datasheet = datasheet_bf16_peak(dev["name"]) if device.type == "cuda" else None
    log(f"[{time.monotonic() - start:5.0f} s] bf16 matrix products {args.matmul_sizes} ...")
    report["matmul"] = matmul_peak(device, args.matmul_sizes, args.repeats, args.warmup, datasheet)
    release(device)
    log(f"[{time.monotonic() - start:5.0f} s] peak memory of a training step, each variant alone ...")
    report["memory"] = peak_memory(args, device, plans)
    log(f"[{time.monotonic() - start:5.0f} s] tokens/s, plain and with checkpointing, interleaved ...")
    peaks = {"datasheet": datasheet["flops"] if datasheet else None,
             "measured_peak": report["matmul"]["measured_peak"]["flop_per_s"]["median"]}
    report["training"] = throughput(args, device, peaks)
    log(f"[{time.monotonic() - start:5.0f} s] activation checkpointing's recomputation ...")
    report["checkpointing"] = recomputation_check(device, args.preset, args.vocab_size, args.model_max_length,
                                                  args.check_batch_size, dropout=DROPOUT)
    log(f"[{time.monotonic() - start:5.0f} s] the planner's kernel figures: products, memory-bound kernels, SDPA ...")
    report["kernels"] = kernel_figures(device, args, datasheet, plans["plain"].hardware)
    release(device)
    report["planner_step"] = planner_step(plans["plain"], report["training"])
    report["machine"] = benchmarking.finish(info)
    report["seconds"] = time.monotonic() - start
    return report


def write(report: dict, folder: Path) -> Path:
    """Write ``report`` atomically as ``folder/<device>-<date>.json``, never over an earlier report."""
    from course import benchmarking

    path = free_path(Path(folder), f"{report['device']['slug']}-{report['date']}")
    return benchmarking.write_report(path, report)


# ---- what is printed ----------------------------------------------------------------------------------

def tests_line(tests: dict | None) -> str:
    if tests is None:
        return "GPU tier: not run (--no_tests)"
    c = tests["counts"]
    late = f"; TIMED OUT after {tests['timeout_s']:.0f} s" if tests["timed_out"] else ""
    return (f"GPU tier (CUDA_VISIBLE_DEVICES={tests['env']['CUDA_VISIBLE_DEVICES']!r}): {c['passed']} passed, "
            f"{c['failed']} failed, {c['skipped']} skipped in {tests['seconds']:.0f} s{late}")


def _range(s: dict, scale: float = 1.0, fmt: str = ".3g") -> str:
    return (f"{s['median'] * scale:{fmt}} (min-max {s['min'] * scale:{fmt}}-{s['max'] * scale:{fmt}}, "
            f"n={s['n']})")


def summary(report: dict, path: Path | None = None) -> str:
    """The report as text: device and date, the tier, the product peak, tokens/s and MFU, memory, the check."""
    d, v = report["device"], report["versions"]
    lines = [f"GPU report: {d['name']}, {report['date']} (torch {v['torch']}, CUDA {v['cuda']}, "
             f"transformers {v['transformers']}){' -- DRY RUN on the CPU' if report['dry_run'] else ''}",
             f"  {tests_line(report['tests'])}"]
    for case in (report["tests"] or {}).get("cases", []):
        if case["outcome"] == "failed":
            lines.append(f"    FAILED {case['test']}: {case['message']}")
    m = report["matmul"]
    sheet = m["datasheet"]
    lines.append(f"  bf16 matrix products: measured peak {_range(m['measured_peak']['flop_per_s'], 1e-12)} TFLOP/s "
                 f"at n={m['measured_peak']['n']}" + (f"; datasheet {sheet['flops'] / 1e12:.0f} TFLOP/s dense "
                                                      f"({sheet['model']}): {m['measured_over_datasheet']:.0%} of it"
                                                      if sheet else "; no datasheet figure for this device"))
    t = report["training"]
    lines.append(f"  training {t['preset']} ({t['n_params'] / 1e6:.0f}M parameters), bf16, batch {t['batch_size']} x "
                 f"{t['seq_len']} tokens (synthetic), vocabulary {t['vocab_size']}:")
    for name, r in sorted(t["variants"].items(), key=lambda item: item[0] != "plain"):
        mfu = f"MFU {_range(r['mfu_datasheet'], 100, '.1f')} % of the datasheet, " if r["mfu_datasheet"] else ""
        lines.append(f"    {name:13} {_range(r['tokens_per_s'], 1, '.0f')} tokens/s; {mfu}"
                     f"{_range(r['mfu_measured_peak'], 100, '.1f')} % of the measured product peak")
    lines.append(f"    {t['checkpointing_vs_plain']['sentence']}")
    mem = report["memory"]
    lines.append(f"  peak memory of a step ({mem['measure']}) against the planner:")
    for name, r in sorted(mem["variants"].items(), key=lambda item: item[0] != "plain"):
        lines.append(f"    {name:13} measured {r['peak_bytes']['median'] / 1e9:.3f} GB, predicted "
                     f"{r['predicted_bytes'] / 1e9:.3f} GB: measured / predicted {r['measured_over_predicted']:.2f}")
    c = report["checkpointing"]
    lines.append(f"  checkpointing on {c['device']} (bf16 autocast, dropout {c['dropout']}): {c['equal_blocks']} of "
                 f"{c['blocks']} blocks recomputed equal to the forward pass ({c['forward_dtype']} / "
                 f"{c['recomputed_dtype']}), losses {'equal' if c['loss_equal'] else 'DIFFERENT'}, largest "
                 f"gradient difference {c['max_gradient_difference']:.2g} of the largest gradient")
    k = report.get("kernels")
    if k:
        lines.append("  the planner's kernel figures (measured / the planner's):")
        for row in k["gemm"]:
            if row["efficiency"] is not None and row["planner"] is not None:
                lines.append(f"    {row['name']:24} ({row['m']} x {row['n']} x {row['k']}): {row['efficiency']:.1%} "
                             f"of the peak measured, {row['planner']:.1%} planned")
        for name, r in k["memory"].items():
            if r["efficiency"] is not None:
                lines.append(f"    {name:24} {r['bytes_per_s']['median'] / 1e12:.2f} TB/s, {r['efficiency']:.0%} of "
                             f"the datasheet's HBM bandwidth (the planner: {k['planner_memory_efficiency']:.0%})")
        for a in k["attention"]:
            if a["planner_forward"]:
                lines.append(f"    SDPA causal s={a['seq']}: forward {a['forward_flop_per_s']['median'] / 1e12:.0f} "
                             f"TFLOP/s (planned {a['planner_forward'] / 1e12:.0f})")
    step = report.get("planner_step")
    if step:
        lines.append(f"  the planner's one-GPU step: {step['predicted_s'] * 1e3:.1f} ms predicted on "
                     f"{step['hardware']}, {step['measured_s'] * 1e3:.1f} ms measured ({step['error']:+.1%})"
                     + ("" if step["comparable"] else " -- dry run: not comparable"))
    lines.append(f"  machine: {report['machine'].get('conditions', '?')}; {report['seconds']:.0f} s in all")
    if path is not None:
        lines.append(f"written: {path}")
    return "\n".join(lines)


def main(argv=None) -> int:
    args, plans = parse(argv)
    if plans is None:
        pinned = os.environ.get("LLMSYS_DEVICE")
        why = f"$LLMSYS_DEVICE={pinned} pins runs to it" if pinned else "no CUDA GPU is visible"
        print(f"no GPU here ({why}): the GPU report needs one, so nothing was measured or written. "
              f"Run it on a machine with a GPU, or try the code with --device cpu (a dry run).")
        return 0
    report = measure(args, plans, log=lambda line: print(line, flush=True))
    path = write(report, args.out)
    print(summary(report, path))
    return 0


if __name__ == "__main__":
    sys.exit(main())
