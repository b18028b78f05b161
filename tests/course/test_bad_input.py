"""Bad input is refused before any process starts, with a message that names the option or file
and says what to do (the scripts' ``parse_args``; exit code 2)."""
from __future__ import annotations

import shutil
from collections import namedtuple

import pytest

import project.run_data_parallel as run_dp
import project.run_pipeline as run_pipeline
import project.run_tensor_parallel as run_tp
import project.train
from course.data import download_multi30k
from course.tokenizer import tokenizer_path


@pytest.fixture(autouse=True)
def no_launch(monkeypatch):
    def fail(*args, **kwargs):
        raise AssertionError("a process was started despite bad input")
    monkeypatch.setattr(project.train, "launch", fail)  # the one launcher of every run script


def refused(script, argv, capsys) -> str:
    with pytest.raises(SystemExit) as info:
        script.main(argv)
    assert info.value.code == 2
    return capsys.readouterr().err


def test_sequence_parallel_needs_a_length_divisible_by_tp(tmp_path, capsys):
    err = refused(run_tp, ["--tp", "3", "--sequence_parallel", "--model_max_length", "128",
                           "--workdir", str(tmp_path)], capsys)
    assert "--model_max_length 128 is not divisible by 3" in err and "try --model_max_length 126" in err, err
    run_tp.parse_args(["--tp", "2", "--sequence_parallel", "--model_max_length", "128",
                       "--workdir", str(tmp_path)])  # divisible: accepted


def test_a_corrupt_cached_tokenizer_is_named(tmp_path, capsys):
    path = tokenizer_path(tmp_path, "multi30k", 5000, "de", "en")
    path.write_text('{"version": "1.0", "model": ')  # cut off mid-write
    err = refused(run_dp, ["--workdir", str(tmp_path)], capsys)
    assert f"the cached tokenizer {path} cannot be used" in err and "delete it" in err, err


def test_a_failed_download_leaves_no_empty_data_folder(tmp_path):
    target = tmp_path / "data" / "multi30k"
    with pytest.raises(OSError):
        download_multi30k(target, base_url="http://127.0.0.1:9/multi30k", timeout=5)  # nothing listens on port 9
    assert not target.exists(), "an empty folder would be taken for the corpus by the next run"


@pytest.mark.parametrize("value", ["-1e-3", "-0.001", "0", "nan"])
def test_a_learning_rate_that_is_not_positive_is_refused(value, tmp_path, capsys):
    err = refused(run_dp, ["--learning_rate", value, "--workdir", str(tmp_path)], capsys)
    assert "--learning_rate must be positive" in err, err


def test_the_pipeline_max_batches_message_describes_its_option(tmp_path, capsys):
    err = refused(run_pipeline, ["--max_batches", "0", "--workdir", str(tmp_path)], capsys)
    assert "--max_batches must be >= 1 batches per epoch (it is 150 by default here" in err, err
    err = refused(run_dp, ["--max_batches", "0", "--workdir", str(tmp_path)], capsys)
    assert "--max_batches must be >= 1 batches per epoch (or left out for whole epochs)" in err, err


def test_a_workdir_that_cannot_be_written_is_refused(tmp_path, capsys):
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    err = refused(run_dp, ["--workdir", str(blocker / "work")], capsys)
    assert f"--workdir {blocker / 'work'} cannot be written to" in err, err


def test_too_little_space_for_the_checkpoints_is_refused(tmp_path, capsys, monkeypatch):
    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda path: usage(10**9, 10**9 - 1000, 1000))
    err = refused(run_dp, ["--checkpoint_every", "10", "--workdir", str(tmp_path)], capsys)
    assert "GB free, but the checkpoints of this run need" in err and "leave out --checkpoint_every" in err, err


def test_checkpoint_options_are_checked(tmp_path, capsys):
    err = refused(run_dp, ["--resume", "latest", "--workdir", str(tmp_path)], capsys)
    assert "--resume latest: no checkpoint in" in err and "--checkpoint_every N first" in err, err
    err = refused(run_dp, ["--resume", str(tmp_path), "--workdir", str(tmp_path)], capsys)
    assert f"--resume {tmp_path} is not a checkpoint folder" in err, err
    err = refused(run_dp, ["--max_restarts", "2", "--workdir", str(tmp_path)], capsys)
    assert "also give --checkpoint_every N" in err, err
    err = refused(run_pipeline, ["--checkpoint_every", "0", "--workdir", str(tmp_path)], capsys)
    assert "--checkpoint_every must be >= 1" in err, err


@pytest.mark.parametrize("memory", [["--zero", "2"], ["--activation_checkpointing"], ["--precision", "bf16"]])
def test_memory_and_gradient_communication_options_are_not_combined(memory, tmp_path, capsys):
    err = refused(run_dp, [*memory, "--overlap", "--workdir", str(tmp_path)], capsys)
    assert "does its own gradient communication; drop --overlap" in err, err
