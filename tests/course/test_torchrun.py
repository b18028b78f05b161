"""The scripts under torchrun and Slurm: they join the group torchrun made instead of spawning their own.

The signal is the process tree, read from /proc while the run is going: torchrun's agent starts
one process per rank (``RANK`` in its environment); in torchrun mode ``course.launch`` runs the
worker in that process, so the rank processes have no children. In spawn mode each would start
``world_size`` ``multiprocessing`` children of its own (the control test shows the poller sees
such children). The Slurm script is checked with stand-ins for ``srun`` and ``scontrol``.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
needs_proc = pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads the process tree from /proc (Linux)")


def _snapshot() -> dict[int, tuple[int, str, str | None]]:
    """{pid: (parent pid, command line, RANK from its environment)} of every process we can read."""
    table = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            cmdline = " ".join(p.decode() for p in (entry / "cmdline").read_bytes().split(b"\0") if p)
            env = dict(kv.split(b"=", 1) for kv in (entry / "environ").read_bytes().split(b"\0") if b"=" in kv)
        except (OSError, ValueError, IndexError):
            continue
        rank = env.get(b"RANK")
        table[int(entry.name)] = (ppid, cmdline, rank.decode() if rank is not None else None)
    return table


def run_and_watch(command: list[str], timeout: float, **popen) -> tuple[subprocess.CompletedProcess, dict]:
    """Run ``command``, polling its process tree; return the result and every descendant seen."""
    seen: dict[int, tuple[int, str, str | None]] = {}
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True, **popen)
    deadline = time.monotonic() + timeout
    out: list[str] = []
    reader = threading.Thread(target=lambda: out.extend(proc.stdout), daemon=True)
    reader.start()
    try:
        while proc.poll() is None:
            if time.monotonic() > deadline:
                raise AssertionError(f"{command} did not finish within {timeout} s:\n{''.join(out)[-3000:]}")
            table, front = _snapshot(), [proc.pid]
            while front:
                parent = front.pop()
                for pid, (ppid, cmdline, rank) in table.items():
                    if ppid == parent:
                        front.append(pid)
                        if cmdline and pid not in seen:  # first sighting with its command line
                            seen[pid] = (ppid, cmdline, rank)
            time.sleep(0.1)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        reader.join(timeout=10)
    return subprocess.CompletedProcess(command, proc.returncode, "".join(out)), seen


def torchrun_command() -> list[str]:
    exe = shutil.which("torchrun")
    return [exe] if exe else [sys.executable, "-m", "torch.distributed.run"]


@needs_proc
def test_poller_sees_spawned_children():
    """Control: a process that spawns a multiprocessing child (as the launcher's spawn mode does) is seen."""
    code = ("import multiprocessing as mp, time\n"
            "if __name__ == '__main__':\n"
            "    p = mp.get_context('spawn').Process(target=time.sleep, args=(1.5,)); p.start(); p.join()\n")
    result, seen = run_and_watch([sys.executable, "-c", code], timeout=60)
    assert result.returncode == 0, result.stdout
    assert any("spawn_main" in cmdline for _, cmdline, _ in seen.values()), seen


@needs_proc
@pytest.mark.needs_solution
def test_run_data_parallel_under_torchrun_joins_the_group(tmp_path):
    workdir = tmp_path / "work"
    command = [*torchrun_command(), "--standalone", "--nproc_per_node=2", "project/run_data_parallel.py",
               "--max_batches", "2", "--n_bleu", "2", "--batch_size", "8", "--device", "cpu", "--quiet",
               "--vocab_size", "1000", "--max_train_examples", "2000", "--max_val_batches", "1",  # a quick run
               "--workdir", str(workdir)]
    result, seen = run_and_watch(command, timeout=240, cwd=REPO)
    assert result.returncode == 0, result.stdout[-3000:]

    # torchrun's agent started exactly two rank processes running the script, RANK 0 and 1 ...
    ranks = {pid: rank for pid, (_, cmdline, rank) in seen.items()
             if rank is not None and "run_data_parallel.py" in cmdline and "torch.distributed.run" not in cmdline}
    assert sorted(ranks.values()) == ["0", "1"], seen
    # ... which started no processes of their own (spawn mode would start world_size children each).
    children = {pid: cmdline for pid, (ppid, cmdline, _) in seen.items() if ppid in ranks}
    assert children == {}, f"the rank processes spawned children: {children}"
    # Both ranks ran the script's main (one header line each) in one group of world size 2.
    assert result.stdout.count("data parallel: dp=2") == 2, result.stdout[-3000:]
    for rank in (0, 1):
        results = json.loads((workdir / f"rank{rank}_results_epoch0.json").read_text())
        assert results["rank"] == rank
        assert results["config"]["world_size"] == 2
        assert results["config"]["backend"] == "gloo"
    fingerprints = {json.loads((workdir / f"rank{r}_results_epoch0.json").read_text())["param_sha256"] for r in (0, 1)}
    assert len(fingerprints) == 1, "the two ranks ended with different weights: they did not average gradients"


def test_slurm_script_runs_one_torchrun_per_node_with_a_c10d_rendezvous(tmp_path):
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "srun").write_text('#!/bin/sh\necho "srun $*"\n')
    (fake / "scontrol").write_text('#!/bin/sh\n[ "$1 $2" = "show hostnames" ] && printf "gpu017\\ngpu018\\n"\n')
    for tool in fake.iterdir():
        tool.chmod(0o755)
    env = dict(os.environ, PATH=f"{fake}{os.pathsep}{os.environ['PATH']}", SLURM_JOB_NODELIST="gpu[017-018]",
               SLURM_NNODES="2", SLURM_JOB_ID="4242", SLURM_GPUS_ON_NODE="4", SLURM_SUBMIT_DIR=str(REPO))
    result = subprocess.run(["bash", "project/slurm/torchrun.sbatch", "project/run_tensor_parallel.py", "--tp",
                             "8", "--workdir", "/shared/tp"], cwd=REPO, env=env, capture_output=True, text=True,
                            timeout=30)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[-1] == (
        "srun --kill-on-bad-exit=1 torchrun --nnodes=2 --nproc_per_node=4 --rdzv_id=4242 --rdzv_backend=c10d "
        "--rdzv_endpoint=gpu017:29500 project/run_tensor_parallel.py --tp 8 --workdir /shared/tp")

    default = subprocess.run(["bash", "project/slurm/torchrun.sbatch"], cwd=REPO, capture_output=True, text=True,
                             env=dict(env, NPROC_PER_NODE="8", TORCHRUN="python -m torch.distributed.run"), timeout=30)
    assert default.returncode == 0, default.stderr
    assert default.stdout.splitlines()[-1].endswith(
        "python -m torch.distributed.run --nnodes=2 --nproc_per_node=8 --rdzv_id=4242 --rdzv_backend=c10d "
        "--rdzv_endpoint=gpu017:29500 project/run_data_parallel.py")

    no_gpus = subprocess.run(["bash", "project/slurm/torchrun.sbatch"], cwd=REPO, capture_output=True, text=True,
                             env={k: v for k, v in env.items() if k != "SLURM_GPUS_ON_NODE"}, timeout=30)
    assert no_gpus.returncode == 2 and "no GPUs found" in no_gpus.stderr


FAILING_SCRIPT = '''
import sys
sys.path.insert(0, {repo!r})
from course.launch import launch


def worker(rank, world_size):
    if rank == 1:
        values = {{"learning_rate": 1e-3}}
        return values["learning_rat"]  # the user's bug
    return rank


if __name__ == "__main__":
    launch(worker, 2, timeout=120, collective_timeout=30)
'''


@needs_proc
def test_under_torchrun_the_first_lines_name_the_failing_rank_its_exception_and_line(tmp_path):
    script = tmp_path / "buggy_training.py"
    script.write_text(FAILING_SCRIPT.format(repo=str(REPO)))
    command = [*torchrun_command(), "--standalone", "--nproc_per_node=2", str(script)]
    result, _ = run_and_watch(command, timeout=120, env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert result.returncode != 0
    lines = [line for line in result.stdout.splitlines() if line.strip()]
    assert lines[0] == "rank 1 failed: KeyError: 'learning_rat'", result.stdout[:3000]
    assert lines[1].strip() == f'at {script}:10: return values["learning_rat"]  # the user\'s bug', result.stdout[:3000]
