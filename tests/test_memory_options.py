"""The memory options of project/run_data_parallel.py are checked before any process starts
(ungraded)."""
import pytest

from project.run_data_parallel import parse_args


def test_zero_stage_must_be_0_to_3(tmp_path, capsys):
    with pytest.raises(SystemExit):
        parse_args(["--zero", "4", "--workdir", str(tmp_path)])
    assert "--zero" in capsys.readouterr().err


def test_sharded_runs_refuse_checkpoints(tmp_path, capsys):
    with pytest.raises(SystemExit):
        parse_args(["--zero", "2", "--checkpoint_every", "5", "--workdir", str(tmp_path)])
    assert "--zero 2 cannot write or resume checkpoints" in capsys.readouterr().err


def test_precision_choices(tmp_path, capsys):
    with pytest.raises(SystemExit):
        parse_args(["--precision", "fp16", "--workdir", str(tmp_path)])
    assert "--precision" in capsys.readouterr().err


def test_defaults_are_plain_data_parallelism(tmp_path):
    args = parse_args(["--workdir", str(tmp_path)])
    assert (args.zero, args.activation_checkpointing, args.precision) == (0, False, "fp32")
