"""run_data_parallel.py refuses bad input with a clear message before any process starts."""
import subprocess
import sys
from pathlib import Path

import pytest

import project.run_data_parallel as script
import project.train
from course.data import multi30k_files, resolve_data_dir

SCRIPT = Path(script.__file__)


@pytest.fixture
def no_launch(monkeypatch):
    def fail(*args, **kwargs):
        raise AssertionError("a process was started despite bad input")
    monkeypatch.setattr(project.train, "launch", fail)  # the one launcher of every run script


@pytest.mark.parametrize("argv,message", [
    (["--dp", "0"], "--dp must be a whole number >= 1"),
    (["--dp", "2", "--batch_size", "63"], "not divisible by --dp 2"),
    (["--data_dir", "/nonexistent/multi30k"], "does not hold the Multi30k files"),
    (["--batch_size", "0"], "--batch_size must be positive"),
    (["--max_batches", "0"], "--max_batches must be >= 1"),
    (["--device", "cpu", "--backend", "nccl"], "nccl backend needs --device cuda"),
    (["--dropout", "1.5"], "--dropout must be in [0, 1)"),
    (["--learning_rate", "nan"], "--learning_rate must be positive"),
])
def test_bad_input_is_refused_before_spawning(argv, message, capsys, no_launch, tmp_path):
    with pytest.raises(SystemExit) as info:
        script.main([*argv, "--workdir", str(tmp_path)])
    assert info.value.code == 2
    assert message in capsys.readouterr().err


def test_damaged_data_files_are_named_before_any_process_starts(tmp_path, capsys, no_launch):
    """A file that is not gzip, and a truncated .gz: the error names the file and what to do."""
    source = resolve_data_dir(download=False)
    for damage in ("not gzip", "truncated"):
        folder = tmp_path / damage / "multi30k"
        folder.mkdir(parents=True)
        for name in multi30k_files():
            data = (source / name).read_bytes()
            if damage == "not gzip":
                (folder / name).write_bytes(b"not gzip")
            else:
                (folder / name).write_bytes(data[: len(data) // 2])
        with pytest.raises(SystemExit) as info:
            script.main(["--data_dir", str(folder), "--workdir", str(tmp_path / damage / "work")])
        assert info.value.code == 2
        err = capsys.readouterr().err
        assert f"the data file {folder}" in err and "is damaged" in err and "delete it" in err, err


def test_results_are_not_overwritten_without_asking(tmp_path, capsys, no_launch):
    (tmp_path / "rank0_results_epoch0.json").write_text("{}")
    (tmp_path / "pipeline_1f1b_rank0_results_epoch0.json").write_text("{}")  # another mode's: not in the way
    with pytest.raises(SystemExit) as info:
        script.main(["--workdir", str(tmp_path)])
    assert info.value.code == 2
    assert "already holds results of this mode (rank0_results_epoch0.json)" in capsys.readouterr().err
    assert (tmp_path / "rank0_results_epoch0.json").is_file(), "nothing is touched when the run refuses"
    args = script.parse_args(["--workdir", str(tmp_path), "--overwrite"])
    # accepted, and the old results kept until the new run has succeeded (course.results.publish_results)
    assert args.overwrite and (tmp_path / "rank0_results_epoch0.json").is_file()
    assert (tmp_path / "pipeline_1f1b_rank0_results_epoch0.json").is_file()


def test_an_unwritable_workdir_is_refused_before_training(tmp_path, capsys, no_launch):
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    with pytest.raises(SystemExit) as info:
        script.main(["--workdir", str(blocker / "work")])
    assert info.value.code == 2
    assert f"--workdir {blocker / 'work'} cannot be written to" in capsys.readouterr().err
