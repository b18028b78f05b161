"""run_data_parallel.py refuses bad input with a clear message before any process starts."""
import subprocess
import sys
from pathlib import Path

import pytest

import project.run_data_parallel as script
from course.data import multi30k_files

SCRIPT = Path(script.__file__)


@pytest.fixture
def no_launch(monkeypatch):
    def fail(*args, **kwargs):
        raise AssertionError("a process was started despite bad input")
    monkeypatch.setattr(script, "launch", fail)


@pytest.mark.parametrize("argv,message", [
    (["--world_size", "0"], "--world_size must be >= 1"),
    (["--world_size", "2", "--batch_size", "63"], "not divisible by --world_size 2"),
    (["--data_dir", "/nonexistent/multi30k"], "does not hold the Multi30k files"),
    (["--batch_size", "0"], "--batch_size must be positive"),
    (["--max_batches", "0"], "--max_batches must be >= 1"),
    (["--device", "cpu", "--backend", "nccl"], "nccl backend needs --device cuda"),
    (["--dropout", "1.5"], "--dropout must be in [0, 1)"),
    (["--learning_rate", "nan"], "--learning_rate must be positive"),
])
def test_bad_input_is_refused_before_spawning(argv, message, capsys, no_launch):
    with pytest.raises(SystemExit) as info:
        script.main(argv)
    assert info.value.code == 2
    assert message in capsys.readouterr().err


def test_a_failing_rank_ends_the_run_with_its_traceback(tmp_path):
    """From the command line, with corrupt data files: the ranks fail reading them, the run exits 1."""
    corrupt = tmp_path / "multi30k"
    corrupt.mkdir()
    for name in multi30k_files():
        (corrupt / name).write_bytes(b"not gzip")
    result = subprocess.run([sys.executable, str(SCRIPT), "--world_size", "2", "--data_dir", str(corrupt),
                             "--workdir", str(tmp_path / "work"), "--quiet", "--timeout", "120"],
                            capture_output=True, text=True, timeout=180)
    assert result.returncode == 1, result.stderr[-2000:]
    assert "rank 0 raised" in result.stderr or "rank 1 raised" in result.stderr
    assert "Traceback" in result.stderr and "gzip" in result.stderr
