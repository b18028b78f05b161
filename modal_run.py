"""Run the course scripts on cloud GPUs with Modal (modal.com).

    modal run modal_run.py --world-size 2 --n-epochs 5                 # data parallel on 2 GPUs
    modal run modal_run.py --world-size 4 --zero 3 --precision bf16 --activation-checkpointing
    modal run modal_run.py --world-size 4 --bucket-mb 25 --overlap     # or --compression topk|powersgd
    modal run modal_run.py --mode pipeline --world-size 4 --schedule 1f1b --micro-batches 8
    modal run modal_run.py --mode tp --world-size 4 --extra "--sequence_parallel"
    modal run modal_run.py --mode 3d --world-size 8 --dp 2 --pp 2 --tp 2 --schedule zb-h1
    modal run modal_run.py --mode cp --world-size 4 --dp 2 --attention ulysses   # context parallel, cp = 4 / dp
    modal run modal_run.py --mode moe --world-size 4 --ep 2                       # MoE, dp = 4, experts over ep
    modal run modal_run.py --mode benchmark --world-size 8             # also schedule_benchmark, factorisation_benchmark
    modal run modal_run.py --gpu-tests --world-size 8                  # the GPU test tier (NCCL vs gloo), its summary
    modal run modal_run.py --grade                                     # the graded tests (pinned to the CPU)

One container gets ``--world-size`` GPUs of type ``--gpu`` (default L4); the script or benchmark runs
there with NCCL, one process per GPU (``--launcher spawn``, the script's own launcher, or
``--launcher torchrun``, ``torchrun --standalone``). Results land on the Modal volume
``llmsys-parallel-course`` under ``runs/<run name>/``, come back to
``workdir/modal/<run name>/`` and are summarised here. Multi30k is downloaded once from
its raw URLs onto the volume; ``--dataset <hub name>`` takes a Hugging Face dataset.
``--extra "..."`` passes further options to the script (e.g. ``--learning_rate 3e-4``).

The run modes are the registry's (``project/modes.py``: ``dp``, ``pipeline``, ``tp``, ``3d``, ``cp``, ``moe``, the
mesh's names): a mode registered there runs here. The options are the script's configuration's
(``project/options``), with dashes: ``--micro-batches``,
``--virtual-stages``, ``--dp --pp --tp --cp --ep``. They are checked here before anything is sent, by that configuration's own
rules, without torch (see ``project/tools/modal_support.py``).
The image: ``requirements.txt`` without its ``-e .`` line, plus the course packages as
local Python sources (among them ``instructor/grade.py`` and ``instructor/keys.py``, which
``--grade`` runs), and ``tests/``, ``pyproject.toml`` and ``conftest.py`` (the graded tests,
their configuration, and the markers registered from the table of keys).
"""
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Optional

import modal

REPO = Path(__file__).resolve().parent
sys.path.insert(0, str(REPO))  # the course packages, also without `pip install -e .`

from project.tools.modal_support import (BENCHMARKS, DEFAULT_GPU, GPU_TIER_XML, GRADE_JSON, OPTIONS,  # noqa: E402
                                   make_request, options_from_argv, print_grade, remote_run, run_name,
                                   save_files, summarize, summarize_gpu_tier)

APP_NAME = "llmsys-parallel-course"
VOLUME_NAME = "llmsys-parallel-course"
VOLUME_PATH = "/vol"
TIMEOUT = 4 * 60 * 60  # seconds one remote run may take
PACKAGES = ("course", "data_parallel", "pipeline", "tensor_parallel", "communication", "memory", "three_d", "context_parallel", "moe", "project",
            "instructor")


def image_requirements(path: Path = REPO / "requirements.txt") -> list[str]:
    """The pinned requirements, without comments and the editable install of the course (``-e .``)."""
    lines = (line.split("#", 1)[0].strip() for line in path.read_text().splitlines())
    return [line for line in lines if line and not line.startswith(("-e", "--editable", "."))]


# requirements.txt exists on the laptop only; in the container the image is already built.
image = (
    modal.Image.debian_slim(python_version="3.11")
    .pip_install(*(image_requirements() if modal.is_local() else []))
    .env({"HF_HOME": f"{VOLUME_PATH}/hf", "TQDM_MININTERVAL": "30", "PYTHONUNBUFFERED": "1"})
    .add_local_python_source(*PACKAGES)
    .add_local_dir(REPO / "tests", "/root/tests", ignore=["**/__pycache__/**"])
    .add_local_file(REPO / "pyproject.toml", "/root/pyproject.toml")
    .add_local_file(REPO / "conftest.py", "/root/conftest.py")
)
app = modal.App(APP_NAME, image=image)
volume = modal.Volume.from_name(VOLUME_NAME, create_if_missing=True)


@app.function(gpu=f"{DEFAULT_GPU}:2", timeout=TIMEOUT, volumes={VOLUME_PATH: volume}, cpu=4.0, memory=16384)
def train(request: dict, name: str) -> dict:
    """Run one checked request (see ``make_request``) on this container's GPUs; return its files."""
    return remote_run(request, name, volume_root=VOLUME_PATH, timeout=TIMEOUT - 600, after_run=volume.commit)


@app.local_entrypoint()
def main(mode: str = "dp", world_size: int = 2, gpu: str = DEFAULT_GPU, n_epochs: Optional[int] = None,
         batch_size: Optional[int] = None, preset: Optional[str] = None, max_batches: Optional[int] = None,
         dataset: Optional[str] = None, dp: Optional[int] = None, pp: Optional[int] = None, tp: Optional[int] = None,
         cp: Optional[int] = None, ep: Optional[int] = None, micro_batches: Optional[int] = None,
         virtual_stages: Optional[int] = None, schedule: Optional[str] = None, single_process: Optional[str] = None, attention: Optional[str] = None, zero: Optional[int] = None,
         precision: Optional[str] = None, activation_checkpointing: bool = False, bucket_mb: Optional[float] = None,
         overlap: bool = False, compression: Optional[str] = None, launcher: str = "spawn", extra: str = "", grade: bool = False,
         gpu_tests: bool = False, results_dir: str = "workdir/modal"):
    """Run --mode dp|pipeline|tp|3d|cp|moe|benchmark|schedule_benchmark|factorisation_benchmark on
    --world-size GPUs of type --gpu (or --grade, or --gpu-tests). The other options are the script's
    configuration's (project/options)."""
    options = {name: value for name, value in locals().items() if name in OPTIONS}
    try:
        request = make_request(mode=mode, world_size=world_size, gpu=gpu, launcher=launcher, extra=extra,
                               grade=grade, gpu_tests=gpu_tests, **options)
    except ValueError as exc:
        raise SystemExit(f"modal_run.py: {exc}")
    name = run_name(request)
    what = "graded tests" if grade else "GPU test tier" if gpu_tests else mode
    print(f"{name}: {what} on {request.gpu_spec} (launcher {request.launcher})")
    remote = train.with_options(gpu=request.gpu_spec, cpu=float(max(4, 2 * request.world_size)),
                                memory=max(16384, 6144 * request.world_size))
    result = remote.remote(asdict(request), name)
    folder = save_files(result["files"], Path(results_dir) / name)
    print(f"\n$ {' '.join(result['command'])}\nexit code {result['returncode']} after {result['seconds']:.0f} s; "
          f"files on the volume {VOLUME_NAME}: {result['workdir']} (modal volume get {VOLUME_NAME} "
          f"runs/{name}), copied to {folder}")
    if grade and GRADE_JSON in result["files"]:
        print_grade(result["files"][GRADE_JSON])
    elif gpu_tests and GPU_TIER_XML in result["files"]:
        print(summarize_gpu_tier(result["files"][GPU_TIER_XML]))
    elif grade or gpu_tests or request.mode in BENCHMARKS:
        print("\n".join(result["log_tail"]))
    else:
        print(summarize(result["files"]))
    if result["returncode"] != 0:
        raise SystemExit("the remote run failed; its last lines:\n" + "\n".join(result["log_tail"]))


if modal.is_local():  # under `modal run modal_run.py ...`: check the options before the app is created
    _cli = options_from_argv(sys.argv, main.info.raw_f, __file__)
    if _cli is not None:
        _cli.pop("results_dir", None)
        try:
            make_request(**_cli)
        except ValueError as _exc:
            print(f"modal_run.py: {_exc}", file=sys.stderr)
            raise SystemExit(2)
