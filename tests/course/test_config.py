"""The run configuration (course.config): one option table, one dataclass per command with its own defaults as data,
the same option names in every script, checks before any process starts."""
from __future__ import annotations

import dataclasses

import pytest

from project.run_3d import ThreeDConfig
from project.run_context_parallel import ContextParallelConfig
from project.run_data_parallel import DataParallelConfig
from project.run_moe import MoERunConfig
from project.run_pipeline import PipelineConfig
from project.run_tensor_parallel import TensorParallelConfig

CONFIGS = (DataParallelConfig, PipelineConfig, TensorParallelConfig, ThreeDConfig, MoERunConfig,
           ContextParallelConfig)
SHARED = ("--device", "--backend", "--workdir", "--batch_size", "--preset", "--seed", "--checkpoint_every", "--resume")


def _options(cls) -> set[str]:
    return {s for action in cls.parser()._actions for s in action.option_strings}


@pytest.mark.parametrize("cls", CONFIGS, ids=lambda c: c.__name__)
def test_every_script_takes_the_shared_options_and_its_mesh_sizes_by_the_same_names(cls):
    options = _options(cls)
    assert set(SHARED) <= options
    for name in cls.takes:
        assert f"--{name}" in options
    for name in ("dp", "pp", "tp", "cp", "ep", "micro_batches", "virtual_stages"):
        assert (f"--{name}" in options) == (name in cls.takes), (cls.__name__, name)


def test_a_command_differs_from_the_table_by_data_only():
    """Every option is declared once, in the table (course.config.RunConfig); a command's configuration holds no
    field of its own, only its defaults, choices and notes, and takes the table's help, type and section."""
    from course.config import RunConfig, table_field

    table = {f.name: f for f in dataclasses.fields(RunConfig)}
    for cls in CONFIGS:
        assert {f.name for f in dataclasses.fields(cls)} == set(table), cls.__name__
        for name in (*cls.defaults, *cls.choices, *cls.notes):
            assert name in cls.options(), (cls.__name__, name)
        for f in dataclasses.fields(cls):
            assert f.metadata == table[f.name].metadata, (cls.__name__, f.name)
            assert f.default == cls.defaults.get(f.name, table_field(f.name).default), (cls.__name__, f.name)
    assert PipelineConfig().micro_batches == 4 and ThreeDConfig().micro_batches == 8 and RunConfig().micro_batches == 1
    help_text = " ".join(PipelineConfig.parser().format_help().split())
    assert "default: torchrun's WORLD_SIZE, else 2" in help_text and "--zero" not in help_text


def test_a_configuration_is_checked_before_anything_runs_and_records_its_options():
    from course.config import ConfigError

    config = ThreeDConfig.for_test(dp=2, pp=2, tp=2, micro_batches=4, batch_size=16, device="cpu")
    assert config.world_size == 8 and config.dims.shape == (2, 2, 2) and config.preset == "tiny"
    record = config.record()
    assert set(ThreeDConfig.options()) | {"cp", "ep"} == set(record) and "zero" not in record
    with pytest.raises(ConfigError, match="not divisible by --dp 2 x --micro_batches 4"):
        ThreeDConfig.for_test(dp=2, pp=2, tp=2, micro_batches=4, batch_size=12, device="cpu")
    with pytest.raises(ConfigError, match="this run takes --dp, not --tp 2"):
        DataParallelConfig.for_test(dp=2, tp=2, device="cpu")


def test_context_parallel_configuration_refuses_what_cannot_run_before_any_process():
    from course.config import ConfigError

    config = ContextParallelConfig.for_test(dp=2, cp=2, seq_len=256, batch_size=4, device="cpu")
    assert config.world_size == 4 and config.dims.cp == 2 and config.layout == "zigzag"
    assert ContextParallelConfig.for_test(cp=2, attention="ulysses", device="cpu").layout == "contiguous"
    with pytest.raises(ConfigError, match=r"6 heads are not divisible by 4; choose cp in \[1, 2, 3, 6\]"):
        ContextParallelConfig.for_test(cp=4, attention="ulysses", preset="small", device="cpu")
    with pytest.raises(ConfigError, match="must be divisible by 8 .* try --seq_len 1016"):
        ContextParallelConfig.for_test(cp=4, seq_len=1020, device="cpu")
    with pytest.raises(ConfigError, match="Ulysses always uses the contiguous layout"):
        ContextParallelConfig.for_test(cp=2, attention="ulysses", layout="zigzag", device="cpu")
    with pytest.raises(ConfigError, match="this run takes --dp, --cp, not --tp 2"):
        ContextParallelConfig.for_test(cp=2, tp=2, device="cpu")


def test_context_parallel_script_stops_on_indivisible_heads_with_a_message(capsys, tmp_path):
    from project.run_context_parallel import main

    with pytest.raises(SystemExit) as stop:
        main(["--cp", "3", "--attention", "ulysses", "--preset", "tiny", "--seq_len", "384", "--device", "cpu",
              "--workdir", str(tmp_path)])
    assert stop.value.code == 2
    assert "4 heads are not divisible by 3" in capsys.readouterr().err


def test_the_v_schedules_are_refused_where_they_cannot_run():
    """The 3D step builds one tensor-parallel stage per rank: it refuses ZB-V and DualPipeV naming what to use; the
    pipeline script refuses DualPipeV with fewer micro-batches than its 2 x pp stages and a V with other than two
    chunks per process, before any process starts."""
    from course.config import ConfigError

    for name in ("dualpipev", "zbv"):
        with pytest.raises(ConfigError, match=f"--schedule {name} places two stages on every rank.*run_pipeline.py "
                                              f"--schedule {name} \\(pipeline parallelism alone\\).*--schedule zb-h1"):
            ThreeDConfig.for_test(dp=1, pp=2, tp=1, micro_batches=4, batch_size=8, schedule=name, device="cpu")
    with pytest.raises(ConfigError, match=r"DualPipeV needs at least as many micro-batches as its 2 x --pp = 6 stages"):
        PipelineConfig.for_test(schedule="dualpipev", pp=3, micro_batches=4, batch_size=8, device="cpu")
    with pytest.raises(ConfigError, match="drop --virtual_stages 3 or set it to 2"):
        PipelineConfig.for_test(schedule="zbv", pp=2, virtual_stages=3, micro_batches=4, batch_size=8,
                                device="cpu")
    config = PipelineConfig.for_test(schedule="dualpipev", pp=2, micro_batches=4, batch_size=8, device="cpu")
    assert config.virtual_stages == 2


def test_an_option_has_one_name_on_the_command_line(capsys):
    """No abbreviations stand in for an option (``--micro`` is not ``--micro_batches``): one name per option."""
    with pytest.raises(SystemExit):
        PipelineConfig.from_command_line(["--micro", "2"], environment=False)
    assert "unrecognized arguments: --micro 2" in capsys.readouterr().err
