"""modal_run.py without network, credentials or GPUs.

What Modal exposes offline is checked directly: the remote function's resources (``.info()``:
GPU type and count, timeout, volume), the entry point's options (``modal run modal_run.py
--help``), and that bad options stop ``modal run`` before the app is created. The command each
mode builds is parsed by the script's own configuration, bad requests are refused with that configuration's
messages before anything is sent (also where torch is not installed), and the remote function's body
(``project.tools.modal_support.remote_run``) runs a tiny data-parallel job on the CPU. For ``--grade``:
the grader's command, its Gradescope JSON and log coming back, and the table printed from the JSON.
"""
from __future__ import annotations

import importlib.util
import json
import re
import subprocess
import sys
from dataclasses import asdict
from pathlib import Path

import pytest

from project.tools import modal_support as ms

REPO = Path(__file__).resolve().parents[2]
PY = "python"


@pytest.fixture(scope="module")
def modal_run():
    spec = importlib.util.spec_from_file_location("modal_run", REPO / "modal_run.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def modal_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "modal", "run", "modal_run.py", *args], cwd=REPO,
                          capture_output=True, text=True, timeout=60)


def test_remote_function_resources(modal_run):
    info = modal_run.train.info()  # offline: the definition made in this process
    assert info.gpus == [(ms.DEFAULT_GPU, 2)]
    assert info.timeout == modal_run.TIMEOUT >= 3600
    assert list(info.volumes) == [modal_run.VOLUME_PATH]
    assert info.volumes[modal_run.VOLUME_PATH].name == modal_run.VOLUME_NAME
    assert not info.volumes[modal_run.VOLUME_PATH].read_only


def test_image_requirements_leave_out_the_editable_install(modal_run):
    requirements = modal_run.image_requirements()
    assert "torch==2.13.0" in requirements and "modal==1.6.4" in requirements
    assert not [r for r in requirements if r.startswith(("-e", "."))]
    assert "-e ." in (REPO / "requirements.txt").read_text()  # the line this is about


def test_entrypoint_options_on_the_modal_cli():
    result = modal_cli("--help")
    assert result.returncode == 0, result.stderr
    for option in ("--mode", "--world-size", "--n-epochs", "--batch-size", "--micro-batches", "--virtual-stages",
                   "--cp", "--ep", "--attention", "--schedule", "--single-process", "--preset",
                   "--gpu", "--grade / --no-grade", "--launcher", "--extra"):
        assert option in result.stdout, (option, result.stdout)
    assert "--n-chunk" not in result.stdout and "--tp-size" not in result.stdout


@pytest.mark.parametrize("args, message", [
    (["--world-size", "5", "--gpu", "a10g"], "at most 4 A10G"),
    (["--world-size", "9"], f"at most 8 {ms.DEFAULT_GPU}"),
    (["--mode", "tensr"], "unknown --mode 'tensr'"),
    (["--mode", "tp", "--world-size", "4", "--tp", "2"], "= 2 ranks, but the world has 4 processes"),
    (["--mode", "3d", "--world-size", "8", "--schedule", "interleaved"], "--schedule: invalid choice: 'interleaved'"),
    (["--mode", "cp", "--world-size", "8", "--attention", "ulysses"], "12 heads are not divisible by 8"),
])
def test_bad_options_stop_modal_run_before_anything_is_sent(args, message):
    result = modal_cli(*args)
    assert result.returncode == 2, (result.stdout, result.stderr)
    assert message in result.stderr
    assert "Token" not in result.stderr + result.stdout  # stopped before a Modal client was even needed


def test_options_are_read_from_modal_run_argv(modal_run):
    entry = modal_run.main.info.raw_f
    path = str(REPO / "modal_run.py")
    read = ms.options_from_argv(["modal", "run", path + "::main", "--world-size", "4", "--mode", "tp",
                                 "--grade", "--extra", "--sequence_parallel"], entry, path)
    assert (read["world_size"], read["mode"], read["grade"], read["extra"]) == (4, "tp", True, "--sequence_parallel")
    assert read["tp"] is None and read["gpu"] == ms.DEFAULT_GPU
    assert ms.options_from_argv(["modal", "run", path, "--no-grade"], entry, path)["grade"] is False
    assert ms.options_from_argv(["modal", "run", path, "--help"], entry, path) is None
    assert ms.options_from_argv(["modal", "deploy", path], entry, path) is None
    assert ms.options_from_argv(["pytest", "tests"], entry, path) is None


@pytest.mark.parametrize("kwargs, message", [
    (dict(mode="expert"), "unknown --mode 'expert'"),
    (dict(gpu="V100"), "unknown --gpu 'V100'"),
    (dict(world_size=0), "--world-size must be a whole number >= 1"),
    (dict(world_size=8, gpu="A10"), "at most 4 A10"),
    (dict(launcher="mpirun"), "unknown --launcher"),
    (dict(learning_rate=1e-3), "unknown option(s) --learning-rate"),
    (dict(tp=2), "--tp is an option of --mode tp and 3d, not of --mode dp"),
    (dict(micro_batches=4), "--micro-batches is an option of --mode pipeline and 3d, not of --mode dp"),
    (dict(mode="moe", cp=2), "--cp is an option of --mode cp, not of --mode moe"),
    (dict(mode="tp", world_size=2, tp=4), "= 4 ranks, but the world has 2 processes"),
    (dict(mode="pipeline", launcher="torchrun"), "--launcher torchrun starts one process per GPU"),
    (dict(mode="dp", extra="--bogus 1"), "project/run_data_parallel.py: unrecognized arguments: --bogus 1"),
    (dict(mode="schedule_benchmark", batch_size=8), "--mode schedule_benchmark takes no --batch-size"),
    (dict(mode="benchmark", preset="huge"), "unknown --preset 'huge'"),
    (dict(grade=True, gpu_tests=True), "choose one"),
])
def test_modals_own_rules(kwargs, message):
    """What only Modal decides: modes, GPU types and counts, launchers, which mode an option belongs to, the
    mesh against --world-size."""
    with pytest.raises(ValueError) as error:
        ms.make_request(**kwargs)
    assert message in str(error.value)


# Requests every run mode's configuration refuses: (mode, Modal's options, the configuration's values that mean
# the same on world_size GPUs). The message must be the configuration's own, word for word.
REFUSED = [
    ("dp", dict(world_size=4, batch_size=30), dict(dp=4, batch_size=30)),
    ("dp", dict(zero=2, overlap=True), dict(dp=2, zero=2, overlap=True)),
    ("dp", dict(precision="bf16", compression="topk"), dict(dp=2, precision="bf16", compression="topk")),
    ("dp", dict(bucket_mb=0.0), dict(dp=2, bucket_mb=0.0)),
    ("dp", dict(n_epochs=0), dict(dp=2, n_epochs=0)),
    ("pipeline", dict(batch_size=30, micro_batches=4), dict(pp=2, batch_size=30, micro_batches=4)),
    ("pipeline", dict(world_size=8, preset="tiny"), dict(pp=8, preset="tiny")),
    ("pipeline", dict(world_size=2, schedule="1f1b", virtual_stages=2),
     dict(pp=2, schedule="1f1b", virtual_stages=2)),
    ("tp", dict(world_size=8), dict(tp=8)),
    ("3d", dict(world_size=8, dp=2, pp=2, tp=2, batch_size=30), dict(dp=2, pp=2, tp=2, batch_size=30)),
    ("3d", dict(world_size=8, dp=1, pp=8, tp=1, preset="tiny"), dict(dp=1, pp=8, tp=1, preset="tiny")),
    ("cp", dict(world_size=8, attention="ulysses"), dict(cp=8, attention="ulysses")),
    ("cp", dict(world_size=4, dp=2, batch_size=3), dict(dp=2, cp=2, batch_size=3)),
    ("moe", dict(world_size=4, ep=3), dict(dp=4, ep=3)),
    ("moe", dict(world_size=2, batch_size=3), dict(dp=2, batch_size=3)),
]


@pytest.mark.parametrize("mode, modal_options, values", REFUSED, ids=[f"{m}-{i}" for i, (m, _, _) in enumerate(REFUSED)])
def test_bad_requests_are_refused_with_the_configurations_own_message(mode, modal_options, values, monkeypatch,
                                                                       modal_run, tmp_path):
    from course.config import ConfigError

    cls = ms.config_class(mode)
    with pytest.raises(ConfigError) as own:  # the configuration itself, as the script would build it on the GPUs
        config = cls(**values, device="cuda", backend="nccl")
        config.resolve(here=False)
        config.check()
    with pytest.raises(ValueError) as error:
        ms.make_request(mode=mode, **modal_options)
    assert str(error.value) == str(own.value)

    fake = FakeRemote()  # through the entry point: refused before anything is sent
    monkeypatch.setattr(modal_run, "train", fake)
    with pytest.raises(SystemExit, match=re.escape(str(own.value))):
        modal_run.main.info.raw_f(mode=mode, results_dir=str(tmp_path), **modal_options)
    assert fake.options is None and fake.sent is None


def test_bad_choices_are_refused_by_the_scripts_parser():
    with pytest.raises(ValueError, match=r"project/run_pipeline.py: argument --schedule: invalid choice: "
                                         r"'zigzag' \(choose from .*'1f1b'"):
        ms.make_request(mode="pipeline", schedule="zigzag")
    with pytest.raises(ValueError, match=r"argument --zero: invalid choice: 5 \(choose from 0, 1, 2, 3\)"):
        ms.make_request(zero=5)
    with pytest.raises(ValueError, match=r"--schedule: invalid choice: 'interleaved' \(choose from 'gpipe', '1f1b', "
                                         r"'zb-h1', 'zbv', 'dualpipev'\)"):
        ms.make_request(mode="3d", world_size=8, schedule="interleaved")
    with pytest.raises(ValueError, match=r"--attention: invalid choice: 'flash'"):
        ms.make_request(mode="cp", attention="flash")


def _parsed(request: ms.RunRequest):
    """The configuration the script builds from the command ``request`` makes (its own parser), resolved as on
    request.world_size GPUs, and the command's arguments."""
    command = ms.build_command(request, "/w", python=PY, repo_root=Path("/root"))
    args = command[command.index(f"/root/{ms.SCRIPTS[request.mode]}") + 1:]
    cls = ms.config_class(request.mode)
    config = cls(**vars(cls.parser().parse_args(args)))
    config.resolve(here=False)
    config.check()
    return config, args


# One request per run mode (the schedules too): Modal's options and what the script's configuration must hold.
EVERY_MODE = [
    ("dp", dict(world_size=4, batch_size=64, n_epochs=5), dict(dp=4, batch_size=64, n_epochs=5)),
    ("dp", dict(world_size=4, zero=3, precision="bf16", activation_checkpointing=True),
     dict(dp=4, zero=3, precision="bf16", activation_checkpointing=True)),
    ("dp", dict(world_size=2, bucket_mb=25.0, overlap=True), dict(dp=2, bucket_mb=25.0, overlap=True)),
    ("pipeline", dict(world_size=4), dict(pp=4, schedule=None, single_process="pipe")),
    ("pipeline", dict(world_size=2, single_process="sequential"), dict(pp=2, single_process="sequential")),
    ("pipeline", dict(world_size=4, schedule="1f1b", micro_batches=8, launcher="torchrun"),
     dict(pp=4, micro_batches=8, schedule="1f1b")),
    ("pipeline", dict(world_size=2, schedule="interleaved", virtual_stages=2, micro_batches=4),
     dict(pp=2, virtual_stages=2, micro_batches=4)),
    ("pipeline", dict(world_size=2, schedule="zb-h1"), dict(pp=2, schedule="zb-h1")),
    ("tp", dict(world_size=4, extra="--sequence_parallel"), dict(tp=4, sequence_parallel=True)),
    ("3d", dict(world_size=8), dict(dp=1, pp=4, tp=2, schedule="1f1b")),
    ("3d", dict(world_size=8, dp=2, pp=2, tp=2, schedule="gpipe", micro_batches=4),
     dict(dp=2, pp=2, tp=2, schedule="gpipe", micro_batches=4)),
    ("3d", dict(world_size=8, dp=2, pp=2, tp=2, schedule="zb-h1"), dict(dp=2, pp=2, tp=2, schedule="zb-h1")),
    ("cp", dict(world_size=4), dict(dp=1, cp=4, attention="ring", layout="zigzag")),
    ("cp", dict(world_size=8, dp=2, attention="ulysses", launcher="torchrun"),
     dict(dp=2, cp=4, attention="ulysses", layout="contiguous")),
    ("moe", dict(world_size=4), dict(dp=4, ep=4)),
    ("moe", dict(world_size=4, ep=2, extra="--num_experts 8 --top_k 1"), dict(dp=4, ep=2, num_experts=8, top_k=1)),
]


@pytest.mark.parametrize("mode, modal_options, expected", EVERY_MODE,
                         ids=[f"{m}-{i}" for i, (m, _, _) in enumerate(EVERY_MODE)])
def test_every_mode_builds_the_command_its_script_runs(mode, modal_options, expected):
    request = ms.make_request(mode=mode, **modal_options)
    config, args = _parsed(request)
    for name, value in expected.items():
        assert getattr(config, name) == value, (name, args)
    assert config.dims.world_size == request.world_size  # one GPU per rank of the mesh
    assert (config.device, config.preset) == ("cuda", "gpt2") and args[args.index("--device") + 1] == "cuda"
    assert request.gpu_spec == f"{ms.DEFAULT_GPU}:{request.world_size}"


def test_every_mode_is_a_run_script_with_a_configuration():
    from course.config import RunConfig

    assert set(ms.RUNS) == {"dp", "pipeline", "tp", "3d", "cp", "moe", "ft"}
    for mode, script in ms.SCRIPTS.items():
        assert (REPO / script).is_file()
        cls = ms.config_class(mode)
        assert issubclass(cls, RunConfig)
        assert f"from project.options.{ms.RUNS[mode]} import" in (REPO / script).read_text()  # the script's own
    owners = {name: [m for m in ms.RUNS if name in ms.script_options(m)] for name in ms.OPTIONS}
    assert all(owners.values()), owners  # every Modal option is some script's


def test_commands_of_each_mode():
    data = ms.make_request(world_size=2, n_epochs=5, batch_size=64)
    assert ms.build_command(data, "/vol/runs/r", python=PY, repo_root=Path("/root"), timeout=3000) == [
        PY, "/root/project/run_data_parallel.py", "--dp", "2", "--n_epochs", "5", "--batch_size", "64",
        "--device", "cuda", "--workdir", "/vol/runs/r", "--timeout", "3000"]
    pipe = ms.make_request(mode="pipeline", world_size=4, gpu="h100", schedule="1f1b", micro_batches=8,
                           launcher="torchrun", preset="small")
    assert pipe.gpu_spec == "H100:4"
    assert ms.build_command(pipe, "/w", python=PY, repo_root=Path("/root")) == [
        PY, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=4", "/root/project/run_pipeline.py",
        "--pp", "4", "--preset", "small", "--micro_batches", "8", "--schedule", "1f1b",
        "--device", "cuda", "--workdir", "/w"]
    tensor = ms.make_request(mode="tp", world_size=4, extra="--sequence_parallel --learning_rate 3e-4")
    assert ms.build_command(tensor, "/w", python=PY, repo_root=Path("/root")) == [
        PY, "/root/project/run_tensor_parallel.py", "--tp", "4", "--device", "cuda", "--workdir", "/w",
        "--sequence_parallel", "--learning_rate", "3e-4"]
    three_d = ms.make_request(mode="3d", world_size=8, dp=2, pp=2, tp=2, schedule="zb-h1", launcher="torchrun")
    assert ms.build_command(three_d, "/w", python=PY, repo_root=Path("/root")) == [
        PY, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=8", "/root/project/run_3d.py",
        "--dp", "2", "--pp", "2", "--tp", "2", "--schedule", "zb-h1", "--device", "cuda", "--workdir", "/w"]
    cp = ms.make_request(mode="cp", world_size=4, dp=2, attention="ulysses")
    assert ms.build_command(cp, "/w", python=PY, repo_root=Path("/root")) == [
        PY, "/root/project/run_context_parallel.py", "--dp", "2", "--cp", "2", "--attention", "ulysses",
        "--device", "cuda", "--workdir", "/w"]
    moe = ms.make_request(mode="moe", world_size=4, ep=2, n_epochs=1)
    assert ms.build_command(moe, "/w", python=PY, repo_root=Path("/root")) == [
        PY, "/root/project/run_moe.py", "--dp", "4", "--ep", "2", "--n_epochs", "1", "--device", "cuda",
        "--workdir", "/w"]
    grade = ms.make_request(grade=True, world_size=2)
    assert ms.build_command(grade, "/vol/runs/g", python=PY, repo_root=Path("/root"), timeout=3000) == [
        PY, "instructor/grade.py", "--json", "/vol/runs/g/grade_results.json"]
    assert '"--json"' in (REPO / "instructor/grade.py").read_text()  # the grader's option


def test_configurations_import_and_check_without_torch():
    """The configuration, every mode's configuration and Modal's checks run where torch cannot be imported
    (``modal run`` on a laptop): ``torch`` is made unimportable before anything is imported."""
    code = """
import sys
sys.modules["torch"] = None  # import torch now raises ImportError
from course.config import ConfigError, RunConfig
from project.tools import modal_support as ms
for mode in ms.RUNS:
    devices = 8 if mode == "3d" else 4  # 3d: its default mesh, 1 x 4 x 2
    config = ms.config_class(mode).for_machine(devices, device="cuda", backend="nccl")  # resolved and checked
    assert config.dims.world_size == devices, (mode, config.dims)
ms.make_request(mode="3d", world_size=8, schedule="zb-h1")
ms.make_request(mode="cp", world_size=4, attention="ulysses")
ms.make_request(mode="moe", world_size=4, ep=2)
ms.make_request(mode="tp", world_size=4, extra="--block_types spd")
ms.make_request(mode="pipeline", world_size=2, schedule="interleaved")
try:
    ms.make_request(mode="cp", world_size=8, attention="ulysses")
except ConfigError as exc:
    assert "not divisible by 8" in str(exc)
else:
    raise AssertionError("not refused")
loaded = sorted(m for m in sys.modules if m.split(".")[0] in ("torch", "transformers", "numpy") and sys.modules[m])
assert not loaded, loaded
print("ok")
"""
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stdout + result.stderr


def test_every_benchmark_option_exists_in_its_parser():
    """The options modal_run passes to the benchmarks are options of their parsers (course.benchmarking's)."""
    import importlib

    for mode, (where, size_options, (out_option, _)) in ms.BENCHMARKS.items():
        name = where.split()[1] if where.startswith("-m ") else str(Path(where).with_suffix("")).replace("/", ".")
        parser = importlib.import_module(name).make_parser()
        options = {s for action in parser._actions for s in action.option_strings}
        for option in (*size_options, out_option, "--device", "--timeout", *(["--preset"] if mode == "benchmark" else [])):
            assert option in options, (mode, option)


def _results(rank, epoch, loss, **extra):
    return json.dumps(dict(validation_loss=loss, bleu=12.5, training_time=30.0, tokens_per_sec=1000.0,
                           config={}, rank=rank, epoch=epoch, **extra))


def test_summary_and_copies(tmp_path):
    files = {"rank0_results_epoch0.json": _results(0, 0, 4.25, global_tokens_per_sec=2000.0),
             "rank1_results_epoch0.json": _results(1, 0, 9.99),
             "pipeline_1f1b_rank3_results_epoch0.json": _results(3, 0, 4.5),
             "translations_epoch0.json": "[]"}
    table = ms.summarize(files).splitlines()
    assert table[1].split() == ["data_parallel", "0", "4.250", "12.50", "30.0", "2000"]
    assert table[2].split() == ["pipeline_1f1b", "0", "4.500", "12.50", "30.0", "1000"]
    assert len(table) == 3
    folder = ms.save_files(files, tmp_path / "copy")
    assert sorted(p.name for p in folder.iterdir()) == sorted(files)


def _gradescope_payload():
    """A Gradescope JSON as ``instructor/grade.py --json`` writes it, and the rows it came from."""
    from instructor.grade import KeyResult, gradescope

    rows = [KeyResult("a5_1_1", "dataset partitioning: Partition", 2, 2, 10.0, 10, 12.0, "all tests passed"),
            KeyResult("a5_1_2", "all-reduce", 1, 2, 5.0, 10, 30.0, "not passed:\ntest_c: failure assert False"),
            KeyResult("a5_3_5", "sequence parallelism", 0, 0, 0.0, 10, 600.0, "timed out after 600 s; scored 0")]
    return json.dumps(gradescope(rows), indent=2), rows


def test_grade_table_from_the_gradescope_json(capsys):
    from instructor.grade import print_table

    payload, rows = _gradescope_payload()
    ms.print_grade(payload)
    out = capsys.readouterr().out
    print_table(rows)
    assert out == capsys.readouterr().out  # the grader's own table, rebuilt from its JSON
    lines = out.splitlines()
    # columns: key, topic, tests, points, CPU seconds, seconds
    assert lines[1].split()[:2] == ["a5_1_1", "dataset"] and lines[1].split()[-4:-2] == ["2/2", "10/10"]
    assert lines[2].split()[-4:-2] == ["1/2", "5/10"] and lines[3].split()[-4:-2] == ["0/0", "0/10"]
    assert lines[4].split() == ["total", "15/30"]
    assert "a5_1_2: not passed:" in out and "test_c: failure assert False" in out
    assert "a5_3_5: timed out after 600 s; scored 0" in out and "a5_1_1: all" not in out


def test_remote_grade_returns_the_gradescope_json_and_the_log(tmp_path):
    """``remote_run`` runs the grader from the repository root and returns its JSON and log."""
    payload, _ = _gradescope_payload()
    root = tmp_path / "repo"
    (root / "instructor").mkdir(parents=True)
    (root / "instructor" / "grade.py").write_text(  # stands in for the grader: argv and cwd as remote_run gives them
        "import os, sys\nprint('grading in', os.getcwd())\n"
        f"assert sys.argv[1] == '--json'\nopen(sys.argv[2], 'w').write({payload!r})\n")
    request = ms.make_request(grade=True, dataset="not_multi30k")  # no data download
    result = ms.remote_run(asdict(request), "g", volume_root=tmp_path / "vol", repo_root=root)
    assert result["returncode"] == 0, "\n".join(result["log_tail"])
    assert result["command"][1:] == ["instructor/grade.py", "--json", str(tmp_path / "vol/runs/g/grade_results.json")]
    assert result["files"][ms.GRADE_JSON] == payload
    assert result["files"]["log.txt"].startswith(f"grading in {root}")


@pytest.mark.needs_solution
def test_remote_function_body_runs_a_tiny_data_parallel_job_on_cpu(tmp_path):
    request = ms.make_request(mode="dp", world_size=2, batch_size=8, max_batches=2,
                              extra="--device cpu --n_bleu 2 --quiet --vocab_size 1000 --max_train_examples 2000 "
                                    "--max_val_batches 1")
    committed = []
    result = ms.remote_run(asdict(request), "tiny", volume_root=tmp_path / "vol", timeout=600,
                           after_run=lambda: committed.append(True))
    assert result["returncode"] == 0, "\n".join(result["log_tail"])
    assert committed == [True]
    workdir = tmp_path / "vol" / "runs" / "tiny"
    assert result["workdir"] == str(workdir)
    assert result["command"][1:3] == [str(REPO / "project/run_data_parallel.py"), "--dp"]
    assert {"rank0_results_epoch0.json", "rank1_results_epoch0.json"} <= set(result["files"])
    assert "tokenizer" not in " ".join(result["files"])
    for rank in (0, 1):
        on_volume = json.loads((workdir / f"rank{rank}_results_epoch0.json").read_text())
        assert on_volume == json.loads(result["files"][f"rank{rank}_results_epoch0.json"])
        assert on_volume["config"]["world_size"] == 2 and on_volume["config"]["device"] == "cpu"
    assert "data parallel: dp=2" in (workdir / "log.txt").read_text()
    assert ms.summarize(result["files"]).splitlines()[1].startswith("data_parallel")


class FakeRemote:
    """Stands in for ``train`` in the entry point: records what would be sent, returns a canned result."""

    def __init__(self, returncode=0):
        self.returncode, self.options, self.sent = returncode, None, None

    def with_options(self, **options):
        self.options = options
        return self

    def remote(self, request, name):
        self.sent = (request, name)
        files = {"rank0_results_epoch0.json": _results(0, 0, 3.5), "translations_epoch0.json": "[]"}
        return dict(command=["python", "x.py"], returncode=self.returncode, seconds=1.0, workdir=f"/vol/runs/{name}",
                    log_tail=["last line of the log"], files=files)


class FakeGradeRemote(FakeRemote):
    def remote(self, request, name):
        result = super().remote(request, name)
        result["files"] = {ms.GRADE_JSON: _gradescope_payload()[0], "log.txt": "grading a5_1_1 ..."}
        return result


def test_entrypoint_grade_prints_the_grade_table(modal_run, monkeypatch, tmp_path, capsys):
    fake = FakeGradeRemote()
    monkeypatch.setattr(modal_run, "train", fake)
    modal_run.main.info.raw_f(grade=True, results_dir=str(tmp_path))
    request, name = fake.sent
    assert request["grade"] is True and name.startswith(f"grade-2x{ms.DEFAULT_GPU}-")
    assert (tmp_path / name / ms.GRADE_JSON).read_text() == _gradescope_payload()[0]
    assert ["total", "15/30"] in [line.split() for line in capsys.readouterr().out.splitlines()]
    monkeypatch.setattr(modal_run, "train", FakeRemote())  # no grade JSON came back: the log's last lines
    modal_run.main.info.raw_f(grade=True, results_dir=str(tmp_path))
    assert capsys.readouterr().out.rstrip().endswith("last line of the log")


def test_entrypoint_sends_the_checked_request_and_summarises_what_comes_back(modal_run, monkeypatch, tmp_path,
                                                                              capsys):
    fake = FakeRemote()
    monkeypatch.setattr(modal_run, "train", fake)
    entry = modal_run.main.info.raw_f
    entry(mode="tp", world_size=4, gpu="a100-80gb", n_epochs=3, results_dir=str(tmp_path))
    assert fake.options == dict(gpu="A100-80GB:4", cpu=8.0, memory=4 * 6144)
    request, name = fake.sent
    assert (request["mode"], request["world_size"], request["options"]) == ("tp", 4, {"tp": 4, "n_epochs": 3})
    assert name.startswith("tp-4xA100-80GB-")
    assert json.loads((tmp_path / name / "rank0_results_epoch0.json").read_text())["validation_loss"] == 3.5
    out = capsys.readouterr().out
    assert "data_parallel" in out and "3.500" in out

    monkeypatch.setattr(modal_run, "train", FakeRemote(returncode=1))
    with pytest.raises(SystemExit, match="last line of the log"):
        entry(world_size=2, results_dir=str(tmp_path))
    with pytest.raises(SystemExit, match="at most 4 A10"):
        entry(world_size=6, gpu="A10", results_dir=str(tmp_path))


# ---- 3D, the data-parallel memory and communication options, the benchmarks, the GPU tier ----------


def test_commands_of_memory_communication_the_benchmarks_and_the_gpu_tier():
    memory = ms.make_request(world_size=4, zero=3, precision="bf16", activation_checkpointing=True)
    assert ms.build_command(memory, "/w", python=PY, repo_root=Path("/root")) == [
        PY, "/root/project/run_data_parallel.py", "--dp", "4", "--zero", "3", "--precision", "bf16",
        "--activation_checkpointing", "--device", "cuda", "--workdir", "/w"]
    comm = ms.make_request(world_size=2, bucket_mb=25.0, overlap=True)
    assert ms.build_command(comm, "/w", python=PY, repo_root=Path("/root"))[2:] == [
        "--dp", "2", "--bucket_mb", "25.0", "--overlap", "--device", "cuda", "--workdir", "/w"]
    topk = ms.make_request(world_size=2, compression="topk", extra="--topk_ratio 0.05")
    assert ms.build_command(topk, "/w", python=PY, repo_root=Path("/root"))[-3:] == ["/w", "--topk_ratio", "0.05"]

    bench = ms.make_request(mode="benchmark", world_size=8, launcher="torchrun")
    assert ms.build_command(bench, "/w", python=PY, repo_root=Path("/root"), timeout=60) == [
        PY, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=8", "/root/project/tools/benchmark.py",
        "--world_sizes", "8", "--dp", "8", "--device", "cuda", "--out", "/w/benchmark_communication.json",
        "--timeout", "60"]
    sched = ms.make_request(mode="schedule_benchmark", world_size=4, extra="--micro_batches 8 16")
    assert ms.build_command(sched, "/w", python=PY, repo_root=Path("/root"), timeout=60) == [
        PY, "-m", "pipeline.labs.schedule_benchmark", "--pp", "4", "--device", "cuda", "--out", "/w/schedule_benchmark.json",
        "--timeout", "60", "--micro_batches", "8", "16"]
    fact = ms.make_request(mode="factorisation_benchmark", world_size=8, launcher="torchrun")
    assert ms.build_command(fact, "/w", python=PY, repo_root=Path("/root")) == [
        PY, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=8", "-m", "three_d.labs.factorisation_benchmark",
        "--world_size", "8", "--device", "cuda", "--out", "/w/factorisation_benchmark.json"]

    tier = ms.make_request(gpu_tests=True, world_size=8, gpu="h100")
    assert tier.gpu_spec == "H100:8" and ms.run_name(tier).startswith("gpu-tests-8xH100-")
    assert ms.build_command(tier, "/vol/runs/t", python=PY, repo_root=Path("/root")) == [
        PY, "-m", "pytest", "-m", "gpu", "-rs", "-q", "tests/gpu", "--junitxml", "/vol/runs/t/gpu_tier.xml"]


def _gpu_tier_xml(tmp_path, *args) -> str:
    """The JUnit XML of a real ``pytest -m gpu`` run of part of the tier (on this machine)."""
    xml = tmp_path / "tier.xml"
    subprocess.run([sys.executable, "-m", "pytest", "-m", "gpu", "-q", "-p", "no:randomly", *args, "--junitxml",
                    str(xml)], cwd=REPO, capture_output=True, text=True, timeout=240)
    return xml.read_text()


def test_gpu_tier_summary_from_its_junit_report(tmp_path):
    import torch

    summary = ms.summarize_gpu_tier(_gpu_tier_xml(tmp_path, "tests/gpu/test_measure_cuda.py")).splitlines()
    if not torch.cuda.is_available():
        n_tests = (REPO / "tests/gpu/test_measure_cuda.py").read_text().count("\ndef test_")  # unparametrised
        assert summary[0] == f"GPU tier (pytest -m gpu): 0 passed, 0 failed, {n_tests} skipped", summary
        # Each skipped test says how many GPUs it needs (1 or 2 in this file) and that this machine has none.
        assert all(re.search(r"needs \d CUDA GPUs \(NCCL\); this machine has no CUDA GPU", line)
                   for line in summary[1:]), summary
    made_up = ('<testsuites><testsuite><testcase classname="tests.gpu.test_x" name="test_a"/>'
               '<testcase classname="tests.gpu.test_x" name="test_b"><failure message="AssertionError: NCCL and gloo '
               'differ&#10;more"/></testcase><testcase classname="tests.gpu.test_y" name="test_c"><skipped '
               'message="needs 8 CUDA GPUs"/></testcase></testsuite></testsuites>')
    assert ms.summarize_gpu_tier(made_up).splitlines() == [
        "GPU tier (pytest -m gpu): 1 passed, 1 failed, 1 skipped",
        "  FAILED  test_x::test_b: AssertionError: NCCL and gloo differ",
        "  skipped test_y::test_c: needs 8 CUDA GPUs"]


def test_remote_gpu_tier_runs_pytest_and_returns_its_report(tmp_path, monkeypatch):
    staged = []
    monkeypatch.setattr(ms, "ensure_multi30k", lambda target: staged.append(target) or target)
    request = ms.make_request(gpu_tests=True, extra="-k stopwatch")
    result = ms.remote_run(asdict(request), "t", volume_root=tmp_path / "vol")
    # the tier's run-script tests read Multi30k: it is staged on the volume as for the scripts' runs
    assert staged == [tmp_path / "vol" / "data" / "multi30k"]
    assert result["command"][1:5] == ["-m", "pytest", "-m", "gpu"]
    assert ms.GPU_TIER_XML in result["files"], "\n".join(result["log_tail"])
    assert ms.summarize_gpu_tier(result["files"][ms.GPU_TIER_XML]).startswith("GPU tier (pytest -m gpu): ")


class FakeTierRemote(FakeRemote):
    def remote(self, request, name):
        result = super().remote(request, name)
        xml = ('<testsuites><testsuite><testcase classname="tests.gpu.test_x" name="test_a"/></testsuite>'
               '</testsuites>')
        result["files"] = {ms.GPU_TIER_XML: xml, "log.txt": "..."}
        return result


def test_entrypoint_gpu_tests_prints_the_tier_summary(modal_run, monkeypatch, tmp_path, capsys):
    fake = FakeTierRemote()
    monkeypatch.setattr(modal_run, "train", fake)
    modal_run.main.info.raw_f(gpu_tests=True, world_size=8, results_dir=str(tmp_path))
    request, name = fake.sent
    assert request["gpu_tests"] is True and fake.options["gpu"] == f"{ms.DEFAULT_GPU}:8"
    assert "GPU tier (pytest -m gpu): 1 passed, 0 failed, 0 skipped" in capsys.readouterr().out


def test_modal_cli_takes_the_new_options():
    result = modal_cli("--help")
    for option in ("--dp", "--pp", "--tp", "--schedule", "--zero", "--precision", "--activation-checkpointing",
                   "--bucket-mb", "--overlap", "--compression", "--gpu-tests / --no-gpu-tests"):
        assert option in result.stdout, option
    bad = modal_cli("--mode", "3d", "--world-size", "8", "--dp", "3")
    assert bad.returncode == 2 and "dp x pp x tp = 3 x 4 x 2 = 24 ranks" in bad.stderr, bad.stderr
