"""The logic behind ``modal_run.py``: check a request, build the command, run it, summarise it.

``modal_run.py`` only declares the Modal app; everything that can be tested without Modal
credentials, network or GPUs lives here:

* :func:`make_request` checks the options on the laptop, before anything is sent: Modal's own (unknown
  mode, more GPUs than Modal attaches to one container, a mesh of another size than ``--world-size``)
  and, for a run mode, everything else with the rules of the script's own configuration
  (``project/options``, :mod:`course.config`: the same options, choices and messages as the script's
  command line), and raises ``ValueError`` with what to change;
* :func:`build_command` turns a request into the command line of a run script or a benchmark
  (spawn mode, or ``torchrun --standalone --nproc_per_node``), of the course grader
  ``instructor/grade.py`` for ``--grade``, or of the GPU test tier (``pytest -m gpu``) for ``--gpu-tests``;
* :func:`remote_run` is the body of the remote function: data, command, log, results;
* :func:`summarize`, :func:`summarize_gpu_tier` and :func:`print_grade` print what came back
  (:func:`gpu_tier_cases`: the GPU tier's tests from its JUnit XML, also for ``project/tools/gpu_report.py``).

This module imports nothing heavy (no torch): it runs inside ``modal run`` on the laptop.
"""
from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from course.config import MESH
from project.modes import MODES as TRAINING_MODES

REPO_ROOT = Path(__file__).resolve().parents[2]
# The run modes: the registry's (project/modes.py), by its names (dp, pipeline, tp, 3d, cp, moe: the mesh's), with
# its documented command and its configuration (project/options/<script>.py, a course.config.RunConfig): its
# options, choices and rules are the configuration's. A mode registered there runs here.
RUNS = {mode.name: mode.script for mode in TRAINING_MODES.values()}
SCRIPTS = {mode.name: mode.script_path for mode in TRAINING_MODES.values()}
# The benchmarks: how each is started (a file, or ``-m module``), the options that set its number of
# GPUs, and the option and file name of the JSON it writes (course.benchmarking: --out, --device,
# --timeout, the run scripts' mesh names).
BENCHMARKS = {"benchmark": ("project/tools/benchmark.py", ("--world_sizes", "--dp"), ("--out", "benchmark_communication.json")),
              "schedule_benchmark": ("-m pipeline.labs.schedule_benchmark", ("--pp",), ("--out", "schedule_benchmark.json")),
              "factorisation_benchmark": ("-m three_d.labs.factorisation_benchmark", ("--world_size",),
                                          ("--out", "factorisation_benchmark.json"))}
MODES = (*SCRIPTS, *BENCHMARKS)
# The configuration options ``modal run`` takes by name (``--micro-batches`` for ``micro_batches``); any other
# option of a script goes in ``--extra``. Each is passed to the script when given, and only to a mode whose
# configuration has it.
OPTIONS = ("n_epochs", "batch_size", "preset", "max_batches", "dataset", "dp", "pp", "tp", "cp", "ep",
           "micro_batches", "virtual_stages", "schedule", "single_process", "attention", "zero", "precision",
           "activation_checkpointing", "bucket_mb", "overlap", "compression")
# --gpu-tests: the GPU tier (tests/gpu, NCCL against gloo) and its JUnit report.
GPU_TIER_XML = "gpu_tier.xml"
LAUNCHERS = ("spawn", "torchrun")
# GPUs Modal attaches to one container, per type (modal.com/docs/guide/gpu, "Specifying GPU
# count"): A10 (alias A10G) up to 4, the others up to 8. Add a type here with its limit.
MAX_GPUS_PER_CONTAINER = {"T4": 8, "L4": 8, "A10": 4, "A10G": 4, "L40S": 8, "A100": 8, "A100-40GB": 8,
                          "A100-80GB": 8, "H100": 8, "H100!": 8, "H200": 8, "B200": 8, "B200+": 8}
DEFAULT_GPU = "L4"
# What --grade runs on the GPUs (from the repository root): the course grader, which also
# writes the Gradescope results.json into the run's folder as GRADE_JSON.
GRADE_SCRIPT = "instructor/grade.py"
GRADE_JSON = "grade_results.json"
LOG_FILE = "log.txt"


@dataclass
class RunRequest:
    """A checked request: what to run on how many GPUs of which type."""

    mode: str
    world_size: int
    gpu: str
    launcher: str = "spawn"
    options: dict = field(default_factory=dict)  # script option name (snake_case) -> value (True: a flag)
    extra: list = field(default_factory=list)  # further script arguments, appended last
    grade: bool = False
    gpu_tests: bool = False

    @property
    def gpu_spec(self) -> str:
        """Modal's ``gpu=`` string, e.g. ``"L4:2"``."""
        return f"{self.gpu}:{self.world_size}"


def config_class(mode: str):
    """The configuration class (a :class:`course.config.RunConfig`, torch-free) of run mode ``mode`` (a key of
    :data:`RUNS`): the registry's (:data:`project.modes.MODES`)."""
    return TRAINING_MODES[mode].config


def script_options(mode: str) -> set[str]:
    """The options (field names) of mode ``mode``'s command line (:meth:`course.config.RunConfig.options`)."""
    return set(config_class(mode).options())


def _dashed(name: str) -> str:
    return "--" + name.replace("_", "-")


def _positive(name: str, value) -> None:
    if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
        raise ValueError(f"{_dashed(name)} must be a whole number >= 1, not {value!r}")


def make_request(mode: str = "dp", world_size: int = 2, gpu: str = DEFAULT_GPU, launcher: str = "spawn",
                 extra: str = "", grade: bool = False, gpu_tests: bool = False, **options) -> RunRequest:
    """Check the options of ``modal run modal_run.py`` on the laptop, before anything is sent, and return the
    :class:`RunRequest`.

    ``options`` are configuration options of :data:`OPTIONS` (None or False: not given).
    A run mode's request is checked by its own configuration (:func:`config_class`): the command line the
    script will get (these options, ``--device cuda`` and ``extra``) is parsed by the script's parser and
    the configuration built from it is resolved for ``world_size`` GPUs and checked
    (:meth:`course.config.RunConfig.for_machine`), without torch; its mesh must have ``world_size`` ranks.

    Raises:
        ValueError: with what to change — unknown mode, GPU type or launcher; ``world_size`` above the
            per-container limit of the GPU type; an option of another mode; ``--grade`` with ``--gpu-tests``;
            ``--launcher torchrun`` for a run that is not one process per GPU; a mesh of another size than
            ``world_size``; and everything the configuration refuses
            (:class:`course.config.ConfigError`, its message).
    """
    from course.model import PRESETS  # light: no torch

    if mode not in MODES:
        raise ValueError(f"unknown --mode {mode!r}: choose one of {', '.join(MODES)}")
    if grade and gpu_tests:
        raise ValueError("--grade runs the graded tests, --gpu-tests the GPU tier: choose one")
    gpu_type = str(gpu).upper()
    if gpu_type not in MAX_GPUS_PER_CONTAINER:
        raise ValueError(f"unknown --gpu {gpu!r}: choose one of {', '.join(MAX_GPUS_PER_CONTAINER)}")
    if launcher not in LAUNCHERS:
        raise ValueError(f"unknown --launcher {launcher!r}: choose spawn or torchrun")
    _positive("world_size", world_size)
    limit = MAX_GPUS_PER_CONTAINER[gpu_type]
    if world_size > limit:
        raise ValueError(f"--world-size {world_size} needs {world_size} GPUs in one container, but Modal attaches "
                         f"at most {limit} {gpu_type} to a container; use --world-size <= {limit}, or a GPU type "
                         "that allows 8 (e.g. --gpu L4, --gpu H100); beyond 8, use torchrun across nodes (README)")
    unknown = set(options) - set(OPTIONS)
    if unknown:
        raise ValueError(f"unknown option(s) {', '.join(_dashed(n) for n in sorted(unknown))}")
    options = {k: v for k, v in options.items() if v is not None and v is not False}
    extra_args = shlex.split(extra or "")
    if grade or gpu_tests:
        return RunRequest(mode, world_size, gpu_type, launcher, options, extra_args, bool(grade), bool(gpu_tests))
    if mode in BENCHMARKS:
        unsupported = sorted(set(options) - {"preset"})
        if unsupported:
            raise ValueError(f"--mode {mode} takes no {', '.join(_dashed(n) for n in unsupported)} "
                             f"(pass the benchmark's own options with --extra)")
        if options.get("preset", "auto") not in ("auto", *PRESETS):
            raise ValueError(f"unknown --preset {options['preset']!r}: choose one of {', '.join(PRESETS)}")
        return RunRequest(mode, world_size, gpu_type, launcher, options, extra_args)
    return _checked_run(mode, world_size, gpu_type, launcher, options, extra_args)


def _checked_run(mode: str, world_size: int, gpu_type: str, launcher: str, options: dict,
                 extra: list[str]) -> RunRequest:
    """:func:`make_request` for a run mode: its configuration checks it (see there)."""
    from course.config import ConfigError

    cls = config_class(mode)
    mine = script_options(mode)
    for name in options:
        if name not in mine:
            owners = [m for m in RUNS if name in script_options(m)]
            raise ValueError(f"{_dashed(name)} is an option of --mode {' and '.join(owners)}, not of --mode {mode}")
    given = [name for name in OPTIONS if name in options]
    args = [a for name in given for a in
            ([f"--{name}"] if options[name] is True else [f"--{name}", str(options[name])])]
    parser = cls.parser()

    def refuse(message: str):
        raise ConfigError(f"{SCRIPTS[mode]}: {message}")

    parser.error = refuse  # the script's parser, raising instead of exiting: unknown options, choices, types
    values = vars(parser.parse_args([*args, "--device", "cuda", *extra]))
    config = cls.for_machine(world_size, **values)  # also: one rank of the mesh per GPU
    if launcher == "torchrun" and config.world_size != world_size:
        raise ValueError(f"--launcher torchrun starts one process per GPU ({world_size}), but this run is "
                         f"{config.world_size} process(es) on {world_size} GPUs; use --launcher spawn"
                         + (" or a multi-process --model-parallel-mode (a schedule)" if mode == "pipeline" else ""))
    sizes = {name: getattr(config, name) for name in MESH if name in cls.takes}
    return RunRequest(mode, world_size, gpu_type, launcher, {**sizes, **{n: options[n] for n in given}}, extra)


def build_command(request: RunRequest, workdir: str, *, python: str = sys.executable,
                  repo_root: Path = REPO_ROOT, timeout: float | None = None) -> list[str]:
    """The command line that runs ``request``'s script or benchmark on its GPUs (``--device cuda``).

    ``request.extra`` comes last, so it can override anything (e.g. ``--device cpu``). For
    ``--grade``: ``python instructor/grade.py --json <workdir>/grade_results.json`` (run it
    from the repository root; the graded tests run on the CPU, as the test suite pins them).
    For ``--gpu-tests``: ``python -m pytest -m gpu -rs tests/gpu --junitxml <workdir>/gpu_tier.xml``
    (NCCL on the container's GPUs against gloo; run from the repository root).
    """
    if request.grade:
        return [python, GRADE_SCRIPT, "--json", str(Path(workdir) / GRADE_JSON)]
    if request.gpu_tests:
        return [python, "-m", "pytest", "-m", "gpu", "-rs", "-q", "tests/gpu", "--junitxml",
                str(Path(workdir) / GPU_TIER_XML), *request.extra]
    if request.mode in BENCHMARKS:
        where, size_options, (out_option, out_name) = BENCHMARKS[request.mode]
        start = where.split() if where.startswith("-m ") else [str(Path(repo_root) / where)]
        args = [a for option in size_options for a in (option, str(request.world_size))]
        if "preset" in request.options:
            args += ["--preset", str(request.options["preset"])]
        args += ["--device", "cuda", out_option, str(Path(workdir) / out_name)]
        if timeout is not None:
            args += ["--timeout", str(int(timeout))]
    else:
        start = [str(Path(repo_root) / SCRIPTS[request.mode])]
        args = [a for name, value in request.options.items()
                for a in ([f"--{name}"] if value is True else [f"--{name}", str(value)])]
        args += ["--device", "cuda", "--workdir", str(workdir)]
        if timeout is not None:
            args += ["--timeout", str(int(timeout))]
    args += list(request.extra)
    if request.launcher == "torchrun":
        return [python, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={request.world_size}",
                *start, *args]
    return [python, *start, *args]


def run_name(request: RunRequest) -> str:
    """A name for the run's folder, e.g. ``data-2xL4-20250101-120000``."""
    gpu = re.sub(r"[^A-Za-z0-9-]", "", request.gpu)
    what = "grade" if request.grade else "gpu-tests" if request.gpu_tests else request.mode
    return f"{what}-{request.world_size}x{gpu}-{time.strftime('%Y%m%d-%H%M%S')}"


def ensure_multi30k(target: Path) -> Path:
    """A folder with the Multi30k files: a local copy if one is found, else downloaded into ``target``."""
    from course.data import DataNotFoundError, download_multi30k, resolve_data_dir

    for where in (dict(data_dir=target), dict(download=False)):
        try:
            return resolve_data_dir(**where)
        except DataNotFoundError:
            pass
    return download_multi30k(target)


def _tee(command: list[str], cwd, env, log_path: Path) -> int:
    """Run ``command``, streaming its output to stdout and to ``log_path``; return its exit code."""
    with open(log_path, "w") as log, subprocess.Popen(command, cwd=cwd, env=env, stdout=subprocess.PIPE,
                                                      stderr=subprocess.STDOUT, text=True, bufsize=1) as proc:
        for line in proc.stdout:
            sys.stdout.write(line)
            log.write(line)
        return proc.wait()


def remote_run(request: dict, name: str, *, volume_root, repo_root: Path = REPO_ROOT, python: str = sys.executable,
               timeout: float | None = None, after_run=None) -> dict:
    """The body of the remote function: run ``request`` and collect its results from the volume.

    Results go to ``<volume_root>/runs/<name>/``; Multi30k to ``<volume_root>/data/multi30k``
    (downloaded from its raw URLs once, unless a local copy exists), for the run scripts and the GPU tier.
    ``after_run()`` (e.g. ``volume.commit``) is called once the files are written.

    Returns:
        dict with ``command``, ``returncode``, ``seconds``, ``workdir``, ``log_tail`` and
        ``files`` ({file name: text} of the results, translations, grade results and the log).
    """
    req = RunRequest(**request)
    workdir = Path(volume_root) / "runs" / name
    workdir.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, PYTHONUNBUFFERED="1", TQDM_MININTERVAL=os.environ.get("TQDM_MININTERVAL", "30"))
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(repo_root), env.get("PYTHONPATH")]))
    # the GPU tier's run-script tests read Multi30k too (tests/gpu/support.py, multi30k_dir): staged the same way
    if req.gpu_tests or (req.options.get("dataset", "multi30k") == "multi30k" and req.mode in SCRIPTS):
        env["LLMSYS_DATA_DIR"] = str(ensure_multi30k(Path(volume_root) / "data" / "multi30k"))
    command = build_command(req, str(workdir), python=python, repo_root=repo_root, timeout=timeout)
    print(f"$ {shlex.join(command)}", flush=True)
    start = time.monotonic()
    code = _tee(command, repo_root, env, workdir / LOG_FILE)
    seconds = time.monotonic() - start
    files = {p.name: p.read_text() for p in sorted(workdir.glob("*.json*"))
             if "results" in p.name or "translations" in p.name or "benchmark" in p.name}
    if (workdir / GPU_TIER_XML).is_file():
        files[GPU_TIER_XML] = (workdir / GPU_TIER_XML).read_text()
    files[LOG_FILE] = (workdir / LOG_FILE).read_text()
    if after_run is not None:
        after_run()
    tail = files[LOG_FILE].splitlines()[-40:]
    return dict(command=command, returncode=code, seconds=seconds, workdir=str(workdir), log_tail=tail, files=files)


def save_files(files: dict, folder) -> Path:
    """Write the files a remote run returned into ``folder`` (created)."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (folder / Path(name).name).write_text(text)
    return folder


def summarize(files: dict) -> str:
    """One line per run kind and epoch (lowest rank): validation loss, BLEU, seconds, tokens/s."""
    rows = {}
    for name, text in files.items():
        m = re.fullmatch(r"(.*)rank(\d+)_results_epoch(\d+)\.json", name)
        if m:
            key, rank = (m.group(1).rstrip("_") or "data_parallel", int(m.group(3))), int(m.group(2))
            if key not in rows or rank < rows[key][0]:
                rows[key] = (rank, json.loads(text))
    if not rows:
        return "no results files came back"
    lines = [f"{'run':<28} {'epoch':>5} {'val loss':>9} {'BLEU':>6} {'s/epoch':>8} {'tokens/s':>10}"]
    for (kind, epoch), (_, r) in sorted(rows.items()):
        tokens = r.get("global_tokens_per_sec", r["tokens_per_sec"])
        lines.append(f"{kind:<28} {epoch:>5} {r['validation_loss']:>9.3f} {r['bleu']:>6.2f} "
                     f"{r['training_time']:>8.1f} {tokens:>10.0f}")
    return "\n".join(lines)


def gpu_tier_cases(junit_xml: str) -> list[dict]:
    """Every test of a GPU-tier run from pytest's JUnit XML: ``{"test" ("<file>::<name>"), "outcome" ("passed",
    "failed" — a failure or an error — or "skipped"), "seconds", "message" (the failure's first line or the skip
    reason, at most 200 characters; "" when passed)}``, in the order pytest ran them."""
    import xml.etree.ElementTree as ET

    cases = []
    for case in ET.fromstring(junit_xml).iter("testcase"):
        name = f"{case.get('classname', '').rsplit('.', 1)[-1]}::{case.get('name')}"
        problem = case.find("failure") if case.find("failure") is not None else case.find("error")
        if problem is not None:
            outcome, message = "failed", ((problem.get("message") or "").splitlines() or [""])[0]
        elif case.find("skipped") is not None:
            outcome, message = "skipped", case.find("skipped").get("message", "")
        else:
            outcome, message = "passed", ""
        cases.append({"test": name, "outcome": outcome, "seconds": float(case.get("time") or 0.0),
                      "message": message[:200]})
    return cases


def summarize_gpu_tier(junit_xml: str) -> str:
    """The GPU tier's summary from pytest's JUnit XML (:func:`gpu_tier_cases`): passed / failed / skipped
    counts, then every failed test with the first line of its failure and every skipped test with its reason."""
    cases = gpu_tier_cases(junit_xml)
    count = {k: sum(c["outcome"] == k for c in cases) for k in ("passed", "failed", "skipped")}
    failed = [f"  FAILED  {c['test']}: {c['message']}" for c in cases if c["outcome"] == "failed"]
    skipped = [f"  skipped {c['test']}: {c['message']}" for c in cases if c["outcome"] == "skipped"]
    head = f"GPU tier (pytest -m gpu): {count['passed']} passed, {count['failed']} failed, {count['skipped']} skipped"
    return "\n".join([head, *failed, *skipped])


def print_grade(payload: str) -> None:
    """Print ``instructor/grade.py``'s table (its ``print_table``) from the Gradescope JSON it wrote.

    The rows are rebuilt as ``instructor.grade.KeyResult`` from each test's name (``key: topic``),
    scores and output (``passed/total tests passed in S s`` then the details).
    """
    from instructor.grade import KeyResult, print_table

    rows = []
    for test in json.loads(payload)["tests"]:
        key, _, topic = test["name"].partition(": ")
        m = re.match(r"(\d+)/(\d+) tests passed in (\d+) s\n?", test["output"])
        rows.append(KeyResult(key, topic, int(m[1]), int(m[2]), test["score"], test["max_score"], float(m[3]),
                              test["output"][m.end():]))
    print_table(rows)


def options_from_argv(argv: list[str], entrypoint, this_file) -> dict | None:
    """The entrypoint options in ``argv`` when it is ``modal run <this_file> ...``, else None.

    ``modal run`` creates the app (and builds its image) before the entrypoint's body runs,
    so ``modal_run.py`` calls this when it is imported, to check the options first. Options
    are read like Modal's CLI does (``world_size`` -> ``--world-size``, ``--grade/--no-grade``);
    anything this cannot read (``--help``, a malformed value) is left to Modal's CLI.
    """
    import argparse
    import inspect

    if "run" not in argv:
        return None
    this = Path(this_file).resolve()
    start = None
    for i, arg in enumerate(argv):
        ref = arg.split("::")[0]
        if (ref.endswith(".py") and Path(ref).resolve() == this) or (argv[i - 1:i] == ["-m"] and ref == this.stem):
            start = i + 1
            break
    if start is None or any(a in ("--help", "-h") for a in argv[start:]):
        return None
    parser = argparse.ArgumentParser(add_help=False, allow_abbrev=False, exit_on_error=False)
    takes_value = set()
    for name, param in inspect.signature(entrypoint).parameters.items():
        flag = "--" + name.replace("_", "-")
        if isinstance(param.default, bool):
            parser.add_argument(flag, dest=name, action="store_true", default=param.default)
            parser.add_argument("--no-" + name.replace("_", "-"), dest=name, action="store_false")
        else:
            kind = int if "int" in str(param.annotation) else float if "float" in str(param.annotation) else str
            parser.add_argument(flag, dest=name, type=kind, default=param.default)
            takes_value.add(flag)
    rest, joined = argv[start:], []
    while rest:  # like click, `--extra --sequence_parallel` gives --extra the value "--sequence_parallel"
        token = rest.pop(0)
        joined.append(f"{token}={rest.pop(0)}" if token in takes_value and rest else token)
    try:
        known, _ = parser.parse_known_args(joined)
    except (argparse.ArgumentError, SystemExit):
        return None
    return vars(known)
