"""Bad input is refused before any process starts, with a message that names the option or file
and says what to do (the scripts' ``parse_args``; exit code 2)."""
from __future__ import annotations

import os
import shutil
from collections import namedtuple

import pytest

import project.run_data_parallel as run_dp
import project.run_pipeline as run_pipeline
import project.run_tensor_parallel as run_tp
import project.train
from course.data import download_multi30k
from course.tokenizer import tokenizer_path
from tests.support.suggestions import suggested_fixes, with_option


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
    # preset small: 6 heads, which --tp 3 divides (with tiny's 4 the heads are refused first)
    err = refused(run_tp, ["--tp", "3", "--preset", "small", "--sequence_parallel", "--model_max_length", "128",
                           "--workdir", str(tmp_path)], capsys)
    assert "--model_max_length 128 is not divisible by 3" in err and "try --model_max_length 126" in err, err
    run_tp.parse_args(["--tp", "3", "--preset", "small", "--sequence_parallel", "--model_max_length", "126",
                       "--workdir", str(tmp_path)])  # the suggestion: accepted


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
    assert not target.parent.exists(), "the failed download left an empty data/ folder (in the repository)"


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


# ---- issue 52: every option and path checked before start, and nothing made by a refused run -------------

@pytest.mark.parametrize("value", ["0", "-1", "nan"])
def test_a_timeout_that_is_not_positive_is_refused(value, tmp_path, capsys):
    err = refused(project.train, ["--mode", "dp", "--timeout", value, "--workdir", str(tmp_path)], capsys)
    assert "--timeout must be > 0 seconds" in err, err
    from course.launch import launch

    with pytest.raises(ValueError, match="timeout must be > 0"):
        launch(print, 1, timeout=float(value))


def test_a_checkpoints_folder_that_cannot_be_written_is_refused_before_the_first_save(tmp_path, capsys):
    # a file where the checkpoints folder goes (permissions would not stop the root user the suite may run as)
    (tmp_path / "checkpoints").write_text("")
    err = refused(run_dp, ["--checkpoint_every", "5", "--workdir", str(tmp_path)], capsys)
    assert f"--workdir {tmp_path}: its checkpoints folder {tmp_path / 'checkpoints'} cannot be written to" in err, err


def test_a_checkpoints_folder_that_cannot_be_written_is_refused(tmp_path, capsys):
    """A file where the checkpoints folder goes (any user), and — where the user is not root, who writes into
    read-only folders — a read-only checkpoints folder: refused before start, naming the folder."""
    blocked = tmp_path / "blocked"
    blocked.mkdir()
    (blocked / "checkpoints").write_text("")
    err = refused(run_dp, ["--checkpoint_every", "5", "--workdir", str(blocked)], capsys)
    assert "its checkpoints folder" in err and "cannot be written to" in err and "is a file" in err, err
    if os.geteuid() != 0:
        read_only = tmp_path / "read_only"
        (read_only / "checkpoints").mkdir(parents=True, mode=0o755)
        (read_only / "checkpoints").chmod(0o555)
        err = refused(run_dp, ["--checkpoint_every", "5", "--workdir", str(read_only)], capsys)
        assert "its checkpoints folder" in err and "cannot be written to" in err, err


def test_a_refused_run_creates_no_folder(tmp_path, capsys):
    """The work directory, the trace's folder and the export's folder are made when a run starts, never by the checks
    of one that is then refused."""
    work, traces, export = tmp_path / "new" / "work", tmp_path / "traces", tmp_path / "exports"
    err = refused(run_dp, ["--workdir", str(work), "--trace", str(traces / "t.json"), "--export_hf",
                           str(export / "model"), "--checkpoint_every", "2", "--resume", "latest"], capsys)
    assert "--resume latest: no checkpoint in" in err, err
    assert sorted(p.name for p in tmp_path.iterdir()) == [], "a refused run left folders behind"
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    err = refused(run_dp, ["--workdir", str(work), "--trace", str(blocker / "traces" / "t.json")], capsys)
    assert f"--trace {blocker / 'traces' / 't.json'}: its folder {blocker / 'traces'} cannot be written to" in err, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a_file"]


def test_a_data_dir_variable_pointing_nowhere_is_an_error_naming_it(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("LLMSYS_DATA_DIR", str(tmp_path / "nowhere"))
    err = refused(run_dp, ["--workdir", str(tmp_path / "work")], capsys)
    assert f"$LLMSYS_DATA_DIR={tmp_path / 'nowhere'} does not hold the Multi30k files" in err, err
    assert "unset it" in err and not (tmp_path / "work").exists(), err


@pytest.mark.parametrize("script,argv,wrong,right", [
    (project.train, ["--mode", "dp", "--max_batchs", "3"], "--max_batchs", "--max_batches"),
    (run_pipeline, ["--micro_batchs=4"], "--micro_batchs", "--micro_batches"),
    (project.train, ["--mod", "dp"], "--mod", "--mode"),
])
def test_a_mistyped_option_gets_the_closest_one_suggested(script, argv, wrong, right, tmp_path, capsys):
    err = refused(script, [*argv, "--workdir", str(tmp_path)], capsys)
    assert f"{wrong}: did you mean {right}?" in err, err


def _shown_values(action) -> list:
    """The values ``--help`` shows for an option: its metavar's ``{a,b}`` when it has one, else its choices."""
    metavar = action.metavar if isinstance(action.metavar, str) else ""
    if metavar.startswith("{") and metavar.endswith("}"):
        return [action.type(v) if action.type else v for v in metavar[1:-1].split(",")]
    return list(action.choices or [])


@pytest.mark.parametrize("name", sorted(project.train.MODES))
def test_each_modes_help_lists_only_values_it_accepts(name, capsys):
    """Every choice ``--mode NAME --help`` shows is one the mode runs — with its defaults, or with one other option
    set to a value the help shows too (``--balance auto`` needs a ``--schedule``). The device
    and back-end depend on the machine, a preset on the mesh sizes: those are left out."""
    from course.config import ConfigError

    config = project.train.MODES[name].config
    shown = {a.dest: _shown_values(a) for a in config.parser()._actions
             if a.dest not in ("device", "backend", "preset") and _shown_values(a)}

    def accepted(values: dict) -> bool:
        try:
            config.for_test(**values)
        except ConfigError:
            return False
        return True

    for dest, values in shown.items():
        for value in values:
            partners = [{other: v} for other, others in shown.items() if other != dest for v in others]
            assert any(accepted({dest: value, **partner}) for partner in [{}, *partners]), (
                f"--mode {name} --help lists --{dest} {value}, which it refuses whatever else is chosen")


def test_the_3d_help_lists_its_schedules_but_not_the_v_shaped_ones(capsys):
    from three_d import SCHEDULES, V_SCHEDULES

    with pytest.raises(SystemExit):
        project.train.parse_args(["--mode", "3d", "--help"])
    shown = capsys.readouterr().out
    assert all(s in shown for s in SCHEDULES) and not any(v in shown for v in V_SCHEDULES), shown
    err = refused(project.train, ["--mode", "3d", "--schedule", "zbv"], capsys)  # still refused with what to run
    assert "--schedule zbv places two stages on every rank" in err and "--schedule zb-h1" in err, err


# An error that suggests a fix: following it must pass the checks (options of the mode, the suggestion's form).
SUGGESTIONS = [
    ("cp", ["--attention", "ulysses", "--cp", "3"]),  # heads first: "choose cp in [1, 2, 4]", not a --seq_len
    ("cp", ["--cp", "3"]),
    ("cp", ["--dp", "2", "--cp", "2", "--batch_size", "3"]),
    ("tp", ["--tp", "3", "--sequence_parallel"]),  # heads first: "choose --tp in [1, 2, 4]"
    ("tp", ["--tp", "2", "--sequence_parallel", "--model_max_length", "127"]),
    ("tp", ["--preset", "gpt2-xl"]),
    ("dp", ["--dp", "3"]),
    ("dp", ["--dp", "4", "--zero", "3", "--hsdp", "3"]),
    ("dp", ["--bucket_mb", "0"]),
    ("dp", ["--dp", "4", "--zero", "3", "--zeropp", "hpz", "--zeropp_group", "3"]),
    ("pipeline", ["--schedule", "1f1b", "--pp", "2", "--micro_batches", "3"]),
    ("pipeline", ["--schedule", "1f1b", "--batch_size", "4", "--micro_batches", "8"]),
    ("pipeline", ["--schedule", "dualpipev", "--pp", "2", "--micro_batches", "2", "--virtual_stages", "2"]),
    ("pipeline", ["--schedule", "1f1b", "--pp", "8"]),
    ("3d", ["--batch_size", "12"]),
    ("3d", ["--pp", "8"]),
    ("moe", ["--dp", "3", "--batch_size", "30"]),  # one problem: 4 experts over --ep 3
    ("moe", ["--dp", "4", "--ep", "3"]),
]
@pytest.mark.parametrize("mode,argv", SUGGESTIONS, ids=[f"{m}:{' '.join(a)}" for m, a in SUGGESTIONS])
def test_every_suggested_fix_passes_the_checks(mode, argv, capsys):
    config = project.train.MODES[mode].config
    with pytest.raises(SystemExit):
        config.from_command_line(argv, environment=False)
    err = capsys.readouterr().err
    fixes = suggested_fixes(err)
    assert fixes, f"no concrete fix suggested: {err}"
    for option, value in fixes:
        fixed = with_option(argv, option, value)
        try:
            config.from_command_line(fixed, environment=False)
        except SystemExit:
            raise AssertionError(f"{' '.join(argv)}: the suggested {option} {value} fails the checks too:\n"
                                 f"{capsys.readouterr().err}") from None


def test_the_grader_checks_its_json_folder_before_grading(tmp_path, capsys, monkeypatch):
    import instructor.grade as grade

    graded = []
    monkeypatch.setattr(grade, "grade", lambda *a, **k: graded.append(a) or [])
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    with pytest.raises(SystemExit) as info:
        grade.main(["--keys", "a5_1_1", "--json", str(blocker / "out" / "results.json")])
    assert info.value.code == 2 and not graded, "a key was graded before the --json folder was checked"
    assert f"--json {blocker / 'out' / 'results.json'}: its folder {blocker / 'out'} cannot be written to" in \
        capsys.readouterr().err
    target = tmp_path / "missing" / "folder" / "results.json"  # can be made: made when the results are written
    assert grade.main(["--keys", "a5_1_1", "--json", str(target)]) == 0 and target.is_file() and graded


def test_a_benchmark_checks_its_out_file_before_it_starts(tmp_path, capsys):
    """The benchmark harness's check (course.benchmarking.check), which every benchmark's parse runs before it
    measures anything."""
    import project.tools.benchmark as benchmark

    (tmp_path / "a_file").write_text("")
    for out, message in ((tmp_path, f"--out {tmp_path} is a folder"),
                         (tmp_path / "a_file" / "x.json", "its folder " + str(tmp_path / "a_file") + " cannot be "
                          "written to")):
        with pytest.raises(SystemExit) as info:
            benchmark.parse_args(["--out", str(out)])
        assert info.value.code == 2 and message in capsys.readouterr().err
    assert benchmark.parse_args(["--out", str(tmp_path / "new" / "x.json")]).out == tmp_path / "new" / "x.json"
    assert not (tmp_path / "new").exists()
