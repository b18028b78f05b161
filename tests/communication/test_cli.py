"""The gradient-communication options of project/run_data_parallel.py and the checks of project/tools/benchmark.py
(parse only: no process is started)."""
import pytest

from project import run_data_parallel
from project.tools import benchmark


def parse(*argv):
    return run_data_parallel.parse_args(["--workdir", "/tmp/llmsys_cli_comm_test", "--overwrite", *argv])


def test_default_is_average_gradients_and_options_pick_the_synchroniser():
    assert parse().communication_options() == [] and parse().memory_options() == []
    for argv in (["--bucket_mb", "1"], ["--overlap"], ["--compression", "topk"], ["--compression", "powersgd"]):
        assert parse(*argv).communication_options() == [argv[0]]


@pytest.mark.parametrize("argv,message", [
    (["--bucket_mb", "0"], "--bucket_mb must be > 0"),
    (["--topk_ratio", "1.5"], "--topk_ratio must be in"),
    (["--powersgd_rank", "0"], "--powersgd_rank must be >= 1"),
    (["--compression", "topk", "--overlap"], "drop --bucket_mb/--overlap"),
])
def test_bad_communication_options_stop_with_a_message(argv, message, capsys):
    with pytest.raises(SystemExit) as exc:
        parse(*argv)
    assert exc.value.code == 2 and message in capsys.readouterr().err


@pytest.mark.parametrize("argv,message", [
    (["--sizes", "12XB"], "cannot read the size"),
    (["--repeats", "2"], ">= 3"),
    (["--world_sizes", "1"], ">= 2"),
    (["--sizes", "1KB", "--skip_dp"], "at least two sizes"),
])
def test_bad_benchmark_options_stop_with_a_message(argv, message, capsys):
    with pytest.raises(SystemExit) as exc:
        benchmark.parse_args(argv)
    assert exc.value.code == 2 and message in capsys.readouterr().err


def test_sizes_are_read_in_powers_of_1024():
    assert benchmark.parse_size("1KB") == 1024 and benchmark.parse_size("64MB") == 64 * 2**20
    assert benchmark.parse_size("1KiB") == 1024 and benchmark.parse_size("4mib") == 4 * 2**20
    assert benchmark.parse_size("4096") == 4096
    assert benchmark.parse_args(["--sizes", "1MB", "1KB"]).sizes_bytes == [1024, 2**20]
