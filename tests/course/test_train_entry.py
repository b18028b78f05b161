"""The one entry point ``project/train.py --mode NAME`` over the registry of training modes (``project/modes.py``).

* every registered mode trains from it on the CPU: 2 steps of the tiny settings of the run-script tests
  (tests/support/rendezvous.py's ``tiny_run``), one small mesh each, its results files named by its
  configuration's prefix (ungraded: the runs need the solutions);
* a missing or unknown mode, and an option the mode refuses, stop with a message before any process starts;
  ``--help`` with a mode shows that mode's options;
* the registry is what Modal and the documented commands use: Modal's request builder accepts every mode (by its
  Modal name and by its registry name) and builds that mode's documented command, each ``project/run_*.py`` is
  its mode's configuration, and a name or configuration registered twice is refused.
"""
from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from project import modes, train
from project.tools import modal_support
from tests.support.rendezvous import tiny_run

REPO = Path(__file__).resolve().parents[2]

# The smallest mesh of each mode that runs its own code (2 ranks; 3d as dp 1 x pp 2 x tp 1: its stage runner and
# pipeline schedule, without a third and fourth rank), with the options its run-script test uses.
SMALL = {
    "dp": ["--dp", "2"],
    "pipeline": ["--schedule", "1f1b", "--pp", "2", "--micro_batches", "2"],
    "tp": ["--tp", "2"],
    "3d": ["--dp", "1", "--pp", "2", "--tp", "1", "--micro_batches", "2"],
    "cp": ["--cp", "2", "--seq_len", "256", "--batch_size", "4"],
    "moe": ["--dp", "2", "--ep", "2"],
    "ft": ["--replicas", "1"],  # one replica group under torchft's lighthouse (ft_replica0_rank0_...)
}


def test_every_registered_mode_has_small_settings_here():
    assert set(SMALL) == set(modes.MODES), "a new mode: add its smallest run to SMALL"


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    return tmp_path_factory.mktemp("train_entry")  # one tokenizer for every mode's run (the prefixes differ)


@pytest.mark.needs_solution
@pytest.mark.timeout(300)
@pytest.mark.parametrize("name", list(SMALL))
def test_each_mode_trains_from_the_one_entry_point(name, workdir):
    assert train.main(["--mode", name, *tiny_run(workdir, *SMALL[name])]) == 0
    config = modes.MODES[name].config.from_command_line(tiny_run(workdir, *SMALL[name]), environment=False)
    for rank in range(config.world_size):
        r = json.loads((workdir / f"{config.results_prefix}rank{rank}_results_epoch0.json").read_text())
        assert r["steps"] == 2 and len(r["train_losses"]) == 2, (name, rank, r["steps"])
        assert all(x is None or math.isfinite(x) for x in r["train_losses"]), (name, rank, r["train_losses"])
        assert math.isfinite(r["validation_loss"]), (name, rank)


@pytest.fixture
def no_launch(monkeypatch):
    monkeypatch.setattr(train, "launch", lambda *a, **k: pytest.fail("a process was started"))


@pytest.mark.parametrize("argv, message", [
    ([], "choose a training mode: --mode {dp,pipeline,tp,3d,cp,moe,ft}"),
    (["--dp", "2"], "choose a training mode: --mode {dp,pipeline,tp,3d,cp,moe,ft}"),
    (["--mode", "tensor"], "argument --mode: invalid choice: 'tensor' (choose from 'dp', 'pipeline', 'tp', '3d', 'cp', "
                           "'moe', 'ft')"),
    (["--mode", "dp", "--tp", "2"], "train.py --mode dp: error: unrecognized arguments: --tp 2"),
    (["--mode", "tp", "--tp", "3"], "--tp 3 does not divide"),
    (["--mode", "3d", "--dp", "3", "--pp", "1", "--tp", "1"], "not divisible by --dp 3 x --micro_batches"),
])
def test_a_bad_mode_or_option_stops_before_any_process_starts(argv, message, capsys, tmp_path, no_launch):
    with pytest.raises(SystemExit) as info:
        train.main([*argv, "--workdir", str(tmp_path)] if argv else argv)
    assert info.value.code == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize("name, timeout", [("tp", None), ("3d", 600.0)])
def test_the_tail_launches_the_one_worker_with_the_modes_collective_timeout(name, timeout, monkeypatch, capsys,
                                                                             tmp_path):
    """What the entry point hands the launcher (replaced here, so nothing starts): the one worker, the mode's name
    and configuration, its world size and its collective timeout (None: the launcher's default); a rank's failure
    ends the run with exit code 1 and the error on stderr."""
    from course.launch import RankFailure

    calls = []

    def planted(*args, **kwargs):
        calls.append((args, kwargs))
        raise RankFailure(1, "rank 1 failed: planted")

    monkeypatch.setattr(train, "launch", planted)
    assert train.main(["--mode", name, *tiny_run(tmp_path, *SMALL[name])]) == 1
    (args, kwargs), = calls
    worker, world, mode, config = args
    assert (worker, world, mode) == (modes.train_worker, config.world_size, name)
    assert type(config) is modes.MODES[name].config and config.max_batches == 2
    assert kwargs.get("collective_timeout") == timeout and kwargs["timeout"] == config.timeout
    assert "run failed: rank 1 failed: planted" in capsys.readouterr().err


def test_help_lists_the_modes_and_with_a_mode_its_options(capsys):
    with pytest.raises(SystemExit) as info:
        train.parse_args(["--help"])
    assert info.value.code == 0
    out = capsys.readouterr().out
    assert all(f"  {m.name} " in out and m.script_path in out for m in modes.MODES.values()), out
    with pytest.raises(SystemExit) as info:
        train.parse_args(["--mode", "tp", "--help"])
    assert info.value.code == 0
    out = capsys.readouterr().out
    assert "usage: train.py --mode tp" in out and "--sequence_parallel" in out and "--schedule" not in out


def test_run_as_a_file_it_refuses_an_unknown_mode_with_the_list():
    result = subprocess.run([sys.executable, "project/train.py", "--mode", "expert"], cwd=REPO, capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 2 and "invalid choice: 'expert'" in result.stderr, result.stderr


def test_each_documented_command_is_its_modes_configuration():
    import importlib

    for mode in modes.MODES.values():
        script = importlib.import_module(f"project.{mode.script}")
        assert (REPO / mode.script_path).is_file()
        assert script.parse_args.__annotations__["return"] == mode.config.__name__
        assert script.main.__module__ == script.parse_args.__module__ == train.__name__  # the one tail's


@pytest.mark.parametrize("mode", list(modes.MODES.values()), ids=list(modes.MODES))
def test_modals_request_builder_accepts_every_mode(mode):
    probe = mode.config(device="cuda", backend="nccl")
    probe.resolve(2, here=False)  # its default mesh for 2 GPUs (3d: its default 1 x 4 x 2)
    world = probe.dims.world_size
    request = modal_support.make_request(mode=mode.name, world_size=world)
    assert request.mode == mode.name
    command = modal_support.build_command(request, "/w", python="python", repo_root=Path("/root"))
    assert command[1] == f"/root/{mode.script_path}", command
    assert command[command.index("--workdir") + 1] == "/w"


def test_a_mode_is_registered_once(monkeypatch):
    monkeypatch.setattr(modes, "MODES", dict(modes.MODES))
    tp = modes.MODES["tp"]
    with pytest.raises(ValueError, match="registered already"):
        modes.register(modes.Mode("tp", type("Other", (tp.config,), {}), tp.script, tp.builder, tp.describe))
    with pytest.raises(ValueError, match="configuration already"):
        modes.register(modes.Mode("tp2", tp.config, tp.script, tp.builder, tp.describe))
    with pytest.raises(ValueError, match="unknown mode 'tp2': choose one of dp, pipeline, tp, 3d, cp, moe"):
        modes.mode_named("tp2")
