"""modal_run.py without network, credentials or GPUs.

What Modal exposes offline is checked directly: the remote function's resources (``.info()``:
GPU type and count, timeout, volume), the entry point's options (``modal run modal_run.py
--help``), and that bad options stop ``modal run`` before the app is created. The command each
mode builds is compared with the scripts' options, and the remote function's body
(``project.modal_support.remote_run``) runs a tiny data-parallel job on the CPU. For ``--grade``:
the grader's command, its Gradescope JSON and log coming back, and the table printed from the JSON.
"""
from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from dataclasses import asdict
from pathlib import Path

import pytest

from project import modal_support as ms

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
    for option in ("--mode", "--world-size", "--n-epochs", "--batch-size", "--n-chunk", "--tp-size",
                   "--model-parallel-mode", "--preset", "--gpu", "--grade / --no-grade", "--launcher", "--extra"):
        assert option in result.stdout, (option, result.stdout)


@pytest.mark.parametrize("args, message", [
    (["--world-size", "5", "--gpu", "a10g"], "at most 4 A10G"),
    (["--world-size", "9"], f"at most 8 {ms.DEFAULT_GPU}"),
    (["--mode", "tensr"], "unknown --mode 'tensr'"),
    (["--mode", "tensor", "--world-size", "4", "--tp-size", "2"], "--tp-size 2 differs from --world-size 4"),
])
def test_bad_options_stop_modal_run_before_anything_is_sent(args, message):
    result = modal_cli(*args)
    assert result.returncode == 2, (result.stdout, result.stderr)
    assert message in result.stderr
    assert "Token" not in result.stderr + result.stdout  # stopped before a Modal client was even needed


def test_options_are_read_from_modal_run_argv(modal_run):
    entry = modal_run.main.info.raw_f
    path = str(REPO / "modal_run.py")
    read = ms.options_from_argv(["modal", "run", path + "::main", "--world-size", "4", "--mode", "tensor",
                                 "--grade", "--extra", "--sequence_parallel"], entry, path)
    assert (read["world_size"], read["mode"], read["grade"], read["extra"]) == (4, "tensor", True, "--sequence_parallel")
    assert read["tp_size"] is None and read["gpu"] == ms.DEFAULT_GPU
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
    (dict(tp_size=2), "--tp-size is an option of --mode tensor"),
    (dict(n_chunk=4), "--n-chunk is an option of --mode pipeline"),
    (dict(mode="tensor", world_size=2, tp_size=4), "--tp-size 4 differs from --world-size 2"),
    (dict(mode="tensor", world_size=8), "n_head=12 of the GPT-2 preset does not split over --world-size 8"),
    (dict(mode="pipeline", world_size=8, preset="tiny"), "more than the 4 transformer blocks"),
    (dict(mode="pipeline", batch_size=30, n_chunk=4), "--batch-size 30 is not divisible by --n-chunk 4"),
    (dict(mode="pipeline", launcher="torchrun"), "needs a multi-process mode"),
    (dict(mode="data", world_size=4, batch_size=30), "--batch-size 30 is not divisible by --world-size 4"),
    (dict(preset="huge"), "unknown --preset 'huge'"),
    (dict(n_epochs=0), "--n-epochs must be a whole number >= 1"),
])
def test_invalid_combinations_are_refused(kwargs, message):
    with pytest.raises(ValueError) as error:
        ms.make_request(**kwargs)
    assert message in str(error.value)


def test_unknown_pipeline_schedule_is_refused_with_the_scripts_choices():
    with pytest.raises(ValueError, match="unknown --model-parallel-mode 'zigzag': choose one of .*1f1b"):
        ms.make_request(mode="pipeline", model_parallel_mode="zigzag")


def test_command_of_each_mode():
    data = ms.make_request(world_size=2, n_epochs=5, batch_size=64)
    assert data.gpu_spec == f"{ms.DEFAULT_GPU}:2"
    assert ms.build_command(data, "/vol/runs/r", python=PY, repo_root=Path("/root"), timeout=3000) == [
        PY, "/root/project/run_data_parallel.py", "--dp", "2", "--batch_size", "64", "--n_epochs", "5",
        "--device", "cuda", "--workdir", "/vol/runs/r", "--timeout", "3000"]

    pipe = ms.make_request(mode="pipeline", world_size=4, gpu="h100", model_parallel_mode="1f1b", n_chunk=8,
                           launcher="torchrun", preset="small")
    assert pipe.gpu_spec == "H100:4"
    assert ms.build_command(pipe, "/w", python=PY, repo_root=Path("/root")) == [
        PY, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=4", "/root/project/run_pipeline.py",
        "--pp", "4", "--preset", "small", "--micro_batches", "8", "--model_parallel_mode", "1f1b",
        "--device", "cuda", "--workdir", "/w"]

    tensor = ms.make_request(mode="tensor", world_size=4, tp_size=4, extra="--sequence_parallel --learning_rate 3e-4")
    assert ms.build_command(tensor, "/w", python=PY, repo_root=Path("/root")) == [
        PY, "/root/project/run_tensor_parallel.py", "--tp", "4", "--device", "cuda", "--workdir", "/w",
        "--sequence_parallel", "--learning_rate", "3e-4"]

    grade = ms.make_request(grade=True, world_size=2)
    assert ms.build_command(grade, "/vol/runs/g", python=PY, repo_root=Path("/root"), timeout=3000) == [
        PY, "instructor/grade.py", "--json", "/vol/runs/g/grade_results.json"]
    assert '"--json"' in (REPO / "instructor/grade.py").read_text()  # the grader's option


def test_every_mode_option_exists_in_its_script():
    """The options modal_run passes are options of the scripts (their configuration's command line, former
    names included) and of the benchmarks (read from their source)."""
    import importlib

    for mode, script in ms.SCRIPTS.items():
        module = importlib.import_module(str(Path(script).with_suffix("")).replace("/", "."))
        config = module.parse_args.__annotations__["return"]
        config = getattr(module, config) if isinstance(config, str) else config
        options = {s for action in config.parser()._actions for s in action.option_strings}
        for option in [ms.SIZE_OPTION[mode]] if mode in ms.SIZE_OPTION else ["--dp", "--pp", "--tp"]:
            assert option in options, (mode, option)
        for name in ms.PASSTHROUGH + ms.FLAGS:
            if mode in ms.MODE_ONLY_OPTIONS.get(name, (mode,)):
                assert f"--{name}" in options, (mode, name)
        assert {"--device", "--workdir", "--timeout"} <= options
    for mode, (where, size_options, (out_option, _)) in ms.BENCHMARKS.items():  # course.benchmarking's parsers
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
    request = ms.make_request(mode="data", world_size=2, batch_size=8, max_batches=2,
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
    entry(mode="tensor", world_size=4, gpu="a100-80gb", n_epochs=3, results_dir=str(tmp_path))
    assert fake.options == dict(gpu="A100-80GB:4", cpu=8.0, memory=4 * 6144)
    request, name = fake.sent
    assert (request["mode"], request["world_size"], request["options"]) == ("tensor", 4, {"n_epochs": 3})
    assert name.startswith("tensor-4xA100-80GB-")
    assert json.loads((tmp_path / name / "rank0_results_epoch0.json").read_text())["validation_loss"] == 3.5
    out = capsys.readouterr().out
    assert "data_parallel" in out and "3.500" in out

    monkeypatch.setattr(modal_run, "train", FakeRemote(returncode=1))
    with pytest.raises(SystemExit, match="last line of the log"):
        entry(world_size=2, results_dir=str(tmp_path))
    with pytest.raises(SystemExit, match="at most 4 A10"):
        entry(world_size=6, gpu="A10", results_dir=str(tmp_path))


# ---- 3D, the data-parallel memory and communication options, the benchmarks, the GPU tier ----------


@pytest.mark.parametrize("kwargs, message", [
    (dict(mode="3d", world_size=8, dp=2, pp=2, tp=1), "--dp 2 x --pp 2 x --tp 1 = 4 ranks, but --world-size is 8"),
    (dict(mode="3d", world_size=8, tp=8), "--tp 8 does not divide the preset's 12 heads"),
    (dict(mode="3d", world_size=8, pp=8, tp=1, preset="tiny"), "--pp 8 stages is more than the 4 transformer blocks"),
    (dict(mode="3d", world_size=4, batch_size=30), "--batch-size 30 is not divisible by --dp 1 x --n-chunk 8"),
    (dict(mode="data", dp=2), "--dp is an option of --mode 3d"),
    (dict(mode="tensor", zero=1), "--zero is an option of --mode data"),
    (dict(zero=5), "--zero must be one of 0, 1, 2, 3"),
    (dict(compression="gzip"), "--compression must be one of none, topk, powersgd"),
    (dict(mode="3d", schedule="zigzag"), "--schedule must be one of 1f1b, gpipe"),
    (dict(bucket_mb=0.0), "--bucket-mb must be > 0"),
    (dict(zero=2, overlap=True), "--zero run the memory part's training step"),
    (dict(precision="bf16", compression="topk"), "--precision bf16 run the memory part's training step"),
    (dict(mode="benchmark", zero=1), "--zero is an option of --mode data"),
    (dict(mode="schedule_benchmark", batch_size=8), "--mode schedule_benchmark takes no --batch-size"),
    (dict(grade=True, gpu_tests=True), "choose one"),
])
def test_invalid_3d_memory_communication_and_benchmark_requests_are_refused(kwargs, message):
    with pytest.raises(ValueError) as error:
        ms.make_request(**kwargs)
    assert message in str(error.value)


def test_commands_of_3d_memory_communication_and_the_benchmarks():
    three_d = ms.make_request(mode="3d", world_size=8, n_epochs=2)  # dp x pp x tp filled in: 1 x 4 x 2
    assert three_d.options == {"n_epochs": 2, "dp": 1, "pp": 4, "tp": 2}
    assert ms.build_command(three_d, "/w", python=PY, repo_root=Path("/root"), timeout=100) == [
        PY, "/root/project/run_3d.py", "--dp", "1", "--pp", "4", "--tp", "2", "--n_epochs", "2", "--device", "cuda",
        "--workdir", "/w", "--timeout", "100"]
    explicit = ms.make_request(mode="3d", world_size=8, dp=2, pp=2, tp=2, schedule="gpipe", n_chunk=4,
                               launcher="torchrun")
    assert ms.build_command(explicit, "/w", python=PY, repo_root=Path("/root")) == [
        PY, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=8", "/root/project/run_3d.py",
        "--dp", "2", "--pp", "2", "--tp", "2", "--micro_batches", "4", "--schedule", "gpipe", "--device", "cuda",
        "--workdir", "/w"]
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
        PY, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=8", "/root/project/benchmark.py",
        "--world_sizes", "8", "--dp", "8", "--device", "cuda", "--out", "/w/benchmark_communication.json",
        "--timeout", "60"]
    sched = ms.make_request(mode="schedule_benchmark", world_size=4, extra="--micro_batches 8 16")
    assert ms.build_command(sched, "/w", python=PY, repo_root=Path("/root"), timeout=60) == [
        PY, "-m", "pipeline.schedule_benchmark", "--pp", "4", "--device", "cuda", "--out", "/w/schedule_benchmark.json",
        "--timeout", "60", "--micro_batches", "8", "16"]
    fact = ms.make_request(mode="factorisation_benchmark", world_size=8, launcher="torchrun")
    assert ms.build_command(fact, "/w", python=PY, repo_root=Path("/root")) == [
        PY, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=8", "-m", "three_d.factorisation_benchmark",
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
        assert all("needs 1 CUDA GPUs (NCCL); this machine has no CUDA GPU" in line for line in summary[1:]), summary
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
    assert bad.returncode == 2 and "--dp 3 x --pp" in bad.stderr, bad.stderr
