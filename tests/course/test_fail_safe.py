"""Runs that fail safe, tried from the command line as a user would.

* Killing the parent (SIGINT as Ctrl-C in a notebook, SIGTERM, SIGKILL) leaves no rank running
  10 s later, and no results file is written after the kill.
* A run killed after a checkpoint and resumed with ``--resume latest`` repeats the uninterrupted
  run's per-step training losses exactly (data parallel, pipeline 1F1B, tensor parallel; GPipe
  checkpoints through the same pipeline training mode as 1F1B).
* A rank killed mid-epoch under ``--max_restarts`` (the launcher) or ``torchrun --max_restarts``
  restarts the group from the latest checkpoint and ends with the uninterrupted run's losses.
* A run killed while an asynchronous save (``--async_checkpoint``) is being written — held in flight by a
  slow writer, ``$LLMSYS_CHECKPOINT_WRITE_DELAY`` — resumes from the last complete checkpoint, which
  ``latest`` still names, and repeats the uninterrupted run's losses.

The runs are small (tiny GPT-2, short sequences, a few steps) and share one trained tokenizer.
Dropout stays on (the default), so equal losses also show that every rank's random generators
were restored.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
needs_proc = pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads the process tree from /proc")

SMALL = ["--preset", "tiny", "--batch_size", "16", "--model_max_length", "32", "--vocab_size", "1000",
         "--n_bleu", "0", "--max_val_batches", "1", "--device", "cpu", "--quiet"]
MODES = {  # name: (script, its options, results prefix, world size)
    "dp": ("run_data_parallel.py", ["--dp", "2"], "", 2),
    "1f1b": ("run_pipeline.py", ["--schedule", "1f1b", "--pp", "2", "--micro_batches", "2"],
             "pipeline_1f1b_", 2),
    "tp": ("run_tensor_parallel.py", ["--tp", "2"], "tensor_parallel_", 2),
}
STEPS, EVERY = 8, 3  # optimizer steps per run; a checkpoint every EVERY steps


def _children() -> dict[int, list[int]]:
    table: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            table.setdefault(ppid, []).append(int(entry.name))
    return table


def descendants(pid: int) -> set[int]:
    table, found, front = _children(), set(), [pid]
    while front:
        for child in table.get(front.pop(), []):
            if child not in found:
                found.add(child)
                front.append(child)
    return found


def is_rank(pid: int) -> bool:
    """A rank of the launcher: it names itself ``rank<r>`` (course.rank_watch.name_process)."""
    try:
        return (Path("/proc") / str(pid) / "comm").read_text().strip().startswith("rank")
    except OSError:
        return False


def running(pid: int) -> bool:
    """Alive and not a zombie (a zombie has ended; only its exit status waits to be read)."""
    try:
        return (Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


@pytest.fixture(scope="module")
def tokenizer_file(tmp_path_factory):
    """One trained tokenizer, copied into every run's work directory (training it is not under test)."""
    from course.data import load_translation_dataset
    from course.tokenizer import get_tokenizer, tokenizer_path

    folder = tmp_path_factory.mktemp("tokenizer")
    get_tokenizer(load_translation_dataset("multi30k"), folder, vocab_size=1000)
    path = tokenizer_path(folder, "multi30k", 1000, "de", "en")
    assert path.is_file()
    return path


def start(mode: str, workdir: Path, tokenizer: Path, *extra: str, max_batches: int = STEPS,
          env: dict | None = None) -> subprocess.Popen:
    script, options, _, _ = MODES[mode]
    workdir.mkdir(parents=True, exist_ok=True)
    if not (workdir / tokenizer.name).exists():
        shutil.copy(tokenizer, workdir / tokenizer.name)
    command = [sys.executable, str(REPO / "project" / script), *options, *SMALL, "--max_batches", str(max_batches),
               "--workdir", str(workdir), *extra]
    log = open(workdir.parent / f"{workdir.name}.log", "w")
    # SIGINT back to its default in the run, as in a terminal or a notebook: when pytest itself runs in the
    # background (``pytest &``, a CI runner), the shell has it ignored, the run would inherit that, and
    # Python installs no KeyboardInterrupt handler for an ignored SIGINT.
    return subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                            env=dict(os.environ, OMP_NUM_THREADS="1", **(env or {})),
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))


def finish(proc: subprocess.Popen, workdir: Path, timeout: float = 240) -> str:
    try:
        proc.wait(timeout=timeout)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    return (workdir.parent / f"{workdir.name}.log").read_text()


def results(workdir: Path, mode: str) -> list[Path]:
    return sorted(workdir.glob(f"{MODES[mode][2]}rank*_results_epoch*.json"))


def losses(workdir: Path, mode: str) -> dict[int, list[float]]:
    """Per rank, the per-step training losses of epoch 0."""
    found = {}
    for path in results(workdir, mode):
        data = json.loads(path.read_text())
        found[data["rank"]] = data["train_losses"]
    return found


def wait_for(condition, timeout: float, what: str, proc: subprocess.Popen, workdir: Path) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if proc.poll() is not None:
            raise AssertionError(f"the run ended before {what}:\n{finish(proc, workdir)[-3000:]}")
        if time.monotonic() > deadline:
            os.killpg(proc.pid, signal.SIGKILL)
            raise AssertionError(f"no {what} within {timeout} s:\n{finish(proc, workdir)[-3000:]}")
        time.sleep(0.05)


def checkpoint_written(workdir: Path, mode: str) -> bool:
    return (workdir / f"{MODES[mode][2]}checkpoints" / "latest").is_file()


def assert_all_gone(pids: set[int], within: float = 10.0) -> None:
    deadline = time.monotonic() + within
    while any(running(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    left = sorted(p for p in pids if running(p))
    what = {}
    for pid in left:  # say what they are, then do not leave them to the next test
        try:
            state = (Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[0]  # D: in I/O
            masks = [line for line in (Path("/proc") / str(pid) / "status").read_text().splitlines()
                     if line.startswith(("SigIgn", "SigCgt"))]  # signals ignored / caught (bit 1 = SIGINT)
            what[pid] = (f"state {state}, {' '.join(masks)}: "
                         + Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()[:200])
        except OSError:
            what[pid] = "?"
        os.kill(pid, signal.SIGKILL)
    assert not left, f"processes of the run still running {within} s after the kill: {what}"


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory, tokenizer_file):
    """Each mode's uninterrupted run, once: {mode: losses per rank}."""
    cache: dict[str, dict[int, list[float]]] = {}

    def get(mode: str) -> dict[int, list[float]]:
        if mode not in cache:
            workdir = tmp_path_factory.mktemp(f"uninterrupted_{mode}") / "work"
            log = finish(start(mode, workdir, tokenizer_file), workdir)
            cache[mode] = losses(workdir, mode)
            assert cache[mode] and all(len(v) == STEPS for v in cache[mode].values()), log[-3000:]
        return cache[mode]
    return get


@needs_proc
@pytest.mark.needs_solution
@pytest.mark.timeout(120)
@pytest.mark.parametrize("mode,sig", [("dp", signal.SIGINT), ("dp", signal.SIGTERM), ("dp", signal.SIGKILL),
                                      ("1f1b", signal.SIGKILL), ("tp", signal.SIGKILL)],
                         ids=["dp-SIGINT", "dp-SIGTERM", "dp-SIGKILL", "1f1b-SIGKILL", "tp-SIGKILL"])
def test_killing_the_parent_ends_every_rank(mode, sig, tmp_path, tokenizer_file):
    workdir = tmp_path / "work"
    proc = start(mode, workdir, tokenizer_file, max_batches=10_000)
    world_size = MODES[mode][3]
    # The ranks are running once the parent has world_size descendants named rank<r>.
    ranks = lambda: [p for p in descendants(proc.pid) if is_rank(p)] if running(proc.pid) else []  # noqa: E731
    wait_for(lambda: len(ranks()) >= world_size, 120, "rank processes", proc, workdir)
    time.sleep(2.0)  # into the run: data, model, first steps
    everyone = descendants(proc.pid)
    os.kill(proc.pid, sig)
    try:
        proc.wait(timeout=15)
    except subprocess.TimeoutExpired:
        pass
    assert_all_gone(everyone | {proc.pid})
    time.sleep(1.0)
    assert not results(workdir, mode), "a results file was written after the run was killed"
    finish(proc, workdir)


@needs_proc
@pytest.mark.needs_solution
@pytest.mark.timeout(240)
# gpipe is left out: it checkpoints through the same pipeline training mode and StageRunner as 1f1b
@pytest.mark.parametrize("mode", ["dp", "1f1b", "tp"])
def test_a_killed_run_resumed_repeats_the_uninterrupted_losses(mode, tmp_path, tokenizer_file, uninterrupted):
    workdir = tmp_path / "work"
    proc = start(mode, workdir, tokenizer_file, "--checkpoint_every", str(EVERY))
    wait_for(lambda: checkpoint_written(workdir, mode), 180, "checkpoint", proc, workdir)
    everyone = descendants(proc.pid)
    os.kill(proc.pid, signal.SIGKILL)
    assert_all_gone(everyone)
    finish(proc, workdir)
    assert not results(workdir, mode), "the run finished before it was killed: nothing to resume"
    pointer = (workdir / f"{MODES[mode][2]}checkpoints" / "latest").read_text()

    log = finish(start(mode, workdir, tokenizer_file, "--checkpoint_every", str(EVERY), "--resume", "latest"),
                 workdir)
    assert f"resuming from {workdir / (MODES[mode][2] + 'checkpoints') / pointer}" in log, log[-3000:]
    resumed = losses(workdir, mode)
    assert resumed == uninterrupted(mode), (f"resumed after {pointer}:\n{resumed}\nuninterrupted:\n"
                                            f"{uninterrupted(mode)}")


@needs_proc
@pytest.mark.needs_solution
@pytest.mark.timeout(240)
def test_a_run_killed_during_an_async_save_resumes_from_the_last_complete_checkpoint(tmp_path, tokenizer_file,
                                                                                      uninterrupted):
    from course.checkpoint import WRITE_DELAY

    workdir = tmp_path / "work"
    root = workdir / "checkpoints"
    first, second = f"step{EVERY:08d}", f"step{2 * EVERY:08d}"
    # Every write waits 4 s: the save of step 3 completes while steps 4-6 run (they take well under a second,
    # then step 6's save waits for it), the save of step 6 is in flight for 4 s, which the test sees (it looks
    # every 50 ms).
    proc = start("dp", workdir, tokenizer_file, "--checkpoint_every", str(EVERY), "--async_checkpoint",
                 env={WRITE_DELAY: "4"})
    in_flight = lambda: ((root / "latest").is_file() and (root / "latest").read_text() == first  # noqa: E731
                         and (root / f"{second}.tmp").is_dir())
    wait_for(in_flight, 180, f"the save of {second} in flight", proc, workdir)
    everyone = descendants(proc.pid)
    os.kill(proc.pid, signal.SIGKILL)
    assert_all_gone(everyone)
    finish(proc, workdir)
    assert (root / "latest").read_text() == first and not (root / second).exists(), (
        f"the checkpoint of step {2 * EVERY} was reported complete before its files were: {sorted(root.iterdir())}")
    assert not results(workdir, "dp"), "the run finished before it was killed"

    log = finish(start("dp", workdir, tokenizer_file, "--checkpoint_every", str(EVERY), "--async_checkpoint",
                       "--resume", "latest"), workdir)
    assert f"resuming from {root / first}" in log, log[-3000:]
    assert losses(workdir, "dp") == uninterrupted("dp")
    assert (root / "latest").read_text() == f"step{STEPS // EVERY * EVERY:08d}", "the last async save was not committed"


@needs_proc
@pytest.mark.needs_solution
@pytest.mark.timeout(240)
def test_a_rank_killed_under_the_launcher_restarts_from_the_checkpoint(tmp_path, tokenizer_file, uninterrupted):
    workdir = tmp_path / "work"
    proc = start("dp", workdir, tokenizer_file, "--checkpoint_every", str(EVERY), "--max_restarts", "1")
    wait_for(lambda: checkpoint_written(workdir, "dp"), 180, "checkpoint", proc, workdir)
    victim = max(p for p in descendants(proc.pid) if is_rank(p))
    os.kill(victim, signal.SIGKILL)
    log = finish(proc, workdir)
    assert proc.returncode == 0, log[-3000:]
    assert "restarting" in log and "resuming from" in log, log[-3000:]
    assert losses(workdir, "dp") == uninterrupted("dp")


@needs_proc
@pytest.mark.needs_solution
@pytest.mark.timeout(240)
def test_a_rank_killed_under_torchrun_restarts_from_the_checkpoint(tmp_path, tokenizer_file, uninterrupted):
    workdir = tmp_path / "work"
    workdir.mkdir()
    shutil.copy(tokenizer_file, workdir / tokenizer_file.name)
    torchrun = shutil.which("torchrun")
    command = [*([torchrun] if torchrun else [sys.executable, "-m", "torch.distributed.run"]), "--standalone",
               "--nproc_per_node=2", "--max_restarts=1", str(REPO / "project" / "run_data_parallel.py"),
               *SMALL, "--max_batches", str(STEPS), "--checkpoint_every", str(EVERY), "--workdir", str(workdir)]
    log_path = tmp_path / "torchrun.log"
    with open(log_path, "w") as log:
        proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                                env=dict(os.environ, OMP_NUM_THREADS="1"))
    wait_for(lambda: checkpoint_written(workdir, "dp"), 180, "checkpoint", proc, workdir)
    workers = [p for p in descendants(proc.pid) if b"\0RANK=1\0" in _environ(p)]
    assert workers, "no worker with RANK=1 found"
    os.kill(workers[0], signal.SIGKILL)
    try:
        proc.wait(timeout=200)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    text = log_path.read_text()
    assert proc.returncode == 0, text[-3000:]
    assert "resuming from" in text, text[-3000:]
    assert losses(workdir, "dp") == uninterrupted("dp")


def _environ(pid: int) -> bytes:
    try:
        return b"\0" + Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return b""
