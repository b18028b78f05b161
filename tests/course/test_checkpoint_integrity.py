"""Checkpoints that prove they are intact (course/checkpoint_manifest.py), tried on real runs' checkpoints.

Three small runs — data parallel (dp 2), a 1F1B pipeline (pp 2) and 3D (pp 2 x dp 1 x tp 1) — each write a
checkpoint after every one of 3 steps (``--keep_checkpoints 3``: all three kept). Then each kind of damage a disk,
a copy or a hand does is planted in the newest step of a copy of each run's checkpoints:

* 64 KiB of a DCP shard zeroed (its size unchanged: only the contents say it is damaged),
* a shard truncated, DCP's ``.metadata`` truncated, a shard deleted,
* the manifest changed to disagree with intact files.

Every one is named before any process starts — the file, the step, and the newest intact step to resume from —
and that suggestion is itself accepted; ``--resume latest`` (and a restart) skip the damaged step and say so.
From the command line, a resume that skips a damaged step at another ``--dp`` moves the old run's results aside,
and the command leaves no process behind (its fork server included), checked within 1 s of its exit with the
cores kept busy.
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

import project.train
from course.checkpoint import choose_checkpoint, prune
from course.checkpoint_manifest import MANIFEST, CheckpointDamaged, verify_checkpoint
from course.tokenizer import tokenizer_path
from tests.support.suggestions import suggested_fixes, with_option

REPO = Path(__file__).resolve().parents[2]
STEPS = 3
SMALL = ["--preset", "tiny", "--batch_size", "8", "--model_max_length", "32", "--vocab_size", "1000",
         "--max_train_examples", "2000", "--n_bleu", "0", "--max_val_batches", "1", "--device", "cpu", "--quiet",
         "--max_batches", str(STEPS), "--timeout", "120"]
RUNS = {  # name: (train.py options, results prefix)
    "dp": (["--mode", "dp", "--dp", "2"], ""),
    "pipeline": (["--mode", "pipeline", "--schedule", "1f1b", "--pp", "2", "--micro_batches", "2"],
                 "pipeline_1f1b_"),
    "3d": (["--mode", "3d", "--dp", "1", "--pp", "2", "--tp", "1", "--micro_batches", "2"], "three_d_"),
}


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory) -> dict[str, Path]:
    """Each run's work directory, once: 3 steps, a checkpoint after each, results published."""
    found, tokenizer = {}, None
    for name, (options, prefix) in RUNS.items():
        workdir = tmp_path_factory.mktemp(f"run_{name}") / "work"
        if tokenizer is not None:
            workdir.mkdir()
            shutil.copy(tokenizer, workdir / tokenizer.name)
        argv = [*options, *SMALL, "--checkpoint_every", "1", "--keep_checkpoints", str(STEPS), "--workdir",
                str(workdir)]
        assert project.train.main(argv) == 0, name
        tokenizer = tokenizer_path(workdir, "multi30k", 1000, "de", "en", 2000)
        root = workdir / f"{prefix}checkpoints"
        assert sorted(p.name for p in root.iterdir()) == ["latest", *[f"step{s:08d}" for s in range(1, STEPS + 1)]]
        found[name] = workdir
    return found


def _copy(checkpoints, name: str, tmp_path: Path) -> tuple[Path, Path]:
    """A copy of run ``name``'s work directory: (workdir, its checkpoints folder)."""
    workdir = tmp_path / "work"
    shutil.copytree(checkpoints[name], workdir)
    return workdir, workdir / f"{RUNS[name][1]}checkpoints"


def _shard(folder: Path) -> Path:
    """The largest DCP shard of a checkpoint folder."""
    return max(folder.glob("*.distcp"), key=lambda p: p.stat().st_size)


def _zero_block(folder: Path) -> str:
    path = _shard(folder)
    data = bytearray(path.read_bytes())
    start = len(data) // 2
    assert any(data[start:start + 65536]), "the block to zero holds zeros already: the damage would not show"
    data[start:start + 65536] = bytes(65536)
    size = path.stat().st_size
    path.write_bytes(bytes(data))
    assert path.stat().st_size == size
    return path.name


def _truncate(path: Path) -> str:
    with open(path, "r+b") as f:
        f.truncate(path.stat().st_size // 2)
    return path.name


def _delete(path: Path) -> str:
    path.unlink()
    return path.name


def _disagree(folder: Path) -> str:
    manifest = json.loads((folder / MANIFEST).read_text())
    name = sorted(manifest["files"])[0]
    manifest["files"][name]["sha256"] = "0" * 64
    (folder / MANIFEST).write_text(json.dumps(manifest))
    return name


DAMAGE = {
    "zeroed-block": _zero_block,
    "truncated-shard": lambda folder: _truncate(_shard(folder)),
    "truncated-metadata": lambda folder: _truncate(folder / ".metadata"),
    "missing-shard": lambda folder: _delete(sorted(folder.glob("*.distcp"))[-1]),
    "disagreeing-manifest": _disagree,
}


def _refused(argv, capsys) -> str:
    with pytest.raises(SystemExit) as info:
        project.train.parse_args(argv)
    assert info.value.code == 2
    return capsys.readouterr().err


@pytest.fixture
def no_launch(monkeypatch):
    def fail(*args, **kwargs):
        raise AssertionError("a process was started")
    monkeypatch.setattr(project.train, "launch", fail)


@pytest.mark.needs_solution
@pytest.mark.timeout(300)
@pytest.mark.parametrize("damage", sorted(DAMAGE))
@pytest.mark.parametrize("run", sorted(RUNS))
def test_a_damaged_checkpoint_is_named_before_any_process_starts_and_latest_skips_it(
        run, damage, checkpoints, tmp_path, capsys, no_launch, monkeypatch):
    workdir, root = _copy(checkpoints, run, tmp_path)
    newest, intact = root / f"step{STEPS:08d}", root / f"step{STEPS - 1:08d}"
    file = DAMAGE[damage](newest)
    with pytest.raises(CheckpointDamaged) as info:
        verify_checkpoint(newest)
    assert info.value.file == file and info.value.step == STEPS, str(info.value)

    options = [*RUNS[run][0], *SMALL, "--workdir", str(workdir)]
    err = _refused([*options, "--resume", str(newest)], capsys)
    assert f"checkpoint {newest} (step {STEPS}) is damaged: {file}" in err, err
    assert f"The newest intact checkpoint is {intact} (step {STEPS - 1}): resume from it with --resume {intact}" \
        in err, err
    project.train.parse_args([*options, "--resume", str(intact)])  # the suggested fix passes every check

    project.train.parse_args([*options, "--resume", "latest"])  # skips the damaged step
    point = choose_checkpoint("latest", root)
    assert point.path == intact and [d.file for d in point.skipped] == [file], point
    monkeypatch.setenv("LLMSYS_RESTART_COUNT", "1")  # a restart after a failure takes the same one
    assert choose_checkpoint(None, root).path == intact


@pytest.mark.needs_solution
@pytest.mark.timeout(300)
def test_when_every_checkpoint_is_damaged_latest_says_so_and_what_to_do(checkpoints, tmp_path, capsys, no_launch):
    workdir, root = _copy(checkpoints, "dp", tmp_path)
    for folder in root.glob("step*"):
        _truncate(_shard(folder))
    err = _refused([*RUNS["dp"][0], *SMALL, "--workdir", str(workdir), "--resume", "latest"], capsys)
    assert f"is damaged" in err and f"No intact checkpoint is left in {root}: start afresh" in err, err


@pytest.mark.needs_solution
@pytest.mark.timeout(300)
def test_every_committed_checkpoint_carries_a_manifest_of_its_files(checkpoints):
    for name, workdir in checkpoints.items():
        for folder in (workdir / f"{RUNS[name][1]}checkpoints").glob("step*"):
            manifest = json.loads((folder / MANIFEST).read_text())
            files = sorted(p.name for p in folder.iterdir() if p.name != MANIFEST)
            assert sorted(manifest["files"]) == files and ".metadata" in files, (folder, manifest)
            assert manifest["step"] == int(folder.name[4:]) and verify_checkpoint(folder) == manifest["step"]


def test_retention_keeps_the_newest_k_up_to_the_committed_step(tmp_path):
    for step in (1, 2, 3, 4, 9):  # step 9: an earlier run's, left in the folder
        (tmp_path / f"step{step:08d}").mkdir()
    (tmp_path / "step00000005.tmp").mkdir()  # a save in flight is not a committed checkpoint
    removed = prune(tmp_path, tmp_path / "step00000004", keep=2)
    assert sorted(p.name for p in removed) == ["step00000001", "step00000002"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step00000003", "step00000004", "step00000005.tmp",
                                                          "step00000009"]


# ---- from the command line ----------------------------------------------------------------------------------

def _session_processes(sid: int) -> list[str]:
    """The processes of session ``sid`` that still run (zombies have ended): ``pid state command``."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            if int(fields[3]) == sid and fields[0] != "Z":
                found.append(f"{entry.name} {fields[0]} "
                             + (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()[:160])
        except (OSError, ValueError, IndexError):
            continue
    return found


@pytest.fixture(scope="module")
def command_line_resume(checkpoints, tmp_path_factory) -> dict:
    """``python project/train.py --mode dp --dp 1 --resume latest`` in a copy of the dp run (dp 2) whose newest
    checkpoint has a truncated shard; two busy processes keep the cores loaded while the command ends. Returns its
    exit code, output, work directory, the damaged file, and the processes of its session still running 1 s
    after it exited."""
    workdir = tmp_path_factory.mktemp("command_line") / "work"
    shutil.copytree(checkpoints["dp"], workdir)
    damaged = _truncate(_shard(workdir / "checkpoints" / f"step{STEPS:08d}"))
    command = [sys.executable, str(REPO / "project" / "train.py"), "--mode", "dp", "--dp", "1", *SMALL,
               "--max_batches", str(STEPS + 1), "--workdir", str(workdir), "--resume", "latest"]
    log_path = workdir.parent / "run.log"
    with open(log_path, "w") as log:
        proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                                env=dict(os.environ, OMP_NUM_THREADS="1"))
    busy = []
    try:
        deadline = time.monotonic() + 240
        while proc.poll() is None and time.monotonic() < deadline:
            if not busy and "results:" in log_path.read_text():  # the table printed: the command is ending
                busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2)]
            time.sleep(0.02)
        proc.wait(timeout=max(1.0, deadline - time.monotonic()))
        time.sleep(1.0)
        left = _session_processes(proc.pid)
    finally:
        for p in busy:
            p.kill()
            p.wait()
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    for line in left:  # report them, then leave none to the next test
        os.kill(int(line.split()[0]), signal.SIGKILL)
    return {"code": proc.returncode, "log": log_path.read_text(), "workdir": workdir, "damaged": damaged,
            "left": left, "loaded": len(busy) == 2}


@pytest.mark.needs_solution
@pytest.mark.timeout(300)
def test_resume_latest_from_the_command_line_skips_the_damaged_step_and_says_so(command_line_resume):
    log, root = command_line_resume["log"], command_line_resume["workdir"] / "checkpoints"
    assert command_line_resume["code"] == 0, log[-3000:]
    newest = root / f"step{STEPS:08d}"
    assert f"{newest} (step {STEPS}) is damaged: {command_line_resume['damaged']} has" in log, log[-3000:]
    assert f"resuming from {root / f'step{STEPS - 1:08d}'}" in log, log[-3000:]


@pytest.mark.needs_solution
@pytest.mark.timeout(300)
def test_results_of_a_run_at_another_world_size_are_moved_aside_not_mixed(command_line_resume):
    workdir = command_line_resume["workdir"]
    assert command_line_resume["code"] == 0, command_line_resume["log"][-3000:]
    assert sorted(p.name for p in workdir.glob("rank*_results_epoch*.json")) == ["rank0_results_epoch0.json"]
    assert json.loads((workdir / "rank0_results_epoch0.json").read_text())["resumed_from_world_size"] == 2
    aside = list(workdir.glob("results_of_2_ranks_*"))
    assert len(aside) == 1 and sorted(p.name for p in aside[0].iterdir()) == [
        "rank0_results_epoch0.json", "rank1_results_epoch0.json"], aside
    assert "moved the results of an earlier 2-rank run aside to" in command_line_resume["log"]


@pytest.mark.needs_solution
@pytest.mark.timeout(300)
def test_no_process_of_the_command_outlives_it_by_a_second_under_load(command_line_resume):
    assert command_line_resume["code"] == 0 and command_line_resume["loaded"], command_line_resume["log"][-3000:]
    assert not command_line_resume["left"], ("still running 1 s after the command exited (the launcher's fork "
                                             f"server?): {command_line_resume['left']}")


@pytest.mark.needs_solution
@pytest.mark.timeout(300)
def test_the_3d_resume_layout_error_suggests_a_tp_that_passes_the_checks(checkpoints, tmp_path, capsys, no_launch):
    workdir, root = _copy(checkpoints, "3d", tmp_path)
    options = ["--mode", "3d", "--dp", "1", "--pp", "2", "--tp", "2", "--micro_batches", "2", *SMALL, "--workdir",
               str(workdir), "--resume", "latest"]
    err = _refused(options, capsys)
    assert suggested_fixes(err) == [("--tp", "1")], err  # written at tp 1: "resume with --tp 1"
    project.train.parse_args(with_option(options, "--tp", "1"))
