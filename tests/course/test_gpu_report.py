"""Ungraded: the GPU report (``project/tools/gpu_report.py``) and what the notebooks read of it (``course.gpu_figures``).

The report's code runs here as a dry run (``--device cpu``: tiny sizes, every step of the GPU run, the GPU
tier with no GPU visible so that every test skips with its reason); without a GPU ``--device auto`` says so
and writes nothing; the notebooks' reader picks the newest real report, leaves out dry runs, and says so when
there is none. Nothing here depends on time or load: the figures are checked for their form (a median and a
spread of >= 3 repeats), the planner's prediction and the checkpointing check for their values.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from course import gpu_figures
from course.hardware import datasheet_bf16_peak

REPO = Path(__file__).resolve().parents[2]
DRY_RUN_TIMEOUT = 240  # seconds: about 10 s on a quiet 2-core machine (imports, the tier's 44 skips, tiny steps)


def run_bounded(command: list[str], timeout: float, env: dict) -> subprocess.CompletedProcess:
    """``command`` in a process group of its own; the whole group killed if it outlives ``timeout``."""
    proc = subprocess.Popen(command, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        raise AssertionError(f"{command} did not finish within {timeout} s:\n{out[-3000:]}\n{err[-3000:]}")
    finally:
        try:  # nothing of the group may outlive the test (the tier's pytest and its fork server included)
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return subprocess.CompletedProcess(command, proc.returncode, out, err)


@pytest.fixture(scope="module")
def dry_run(tmp_path_factory):
    """One dry run of the report: ``(completed process, report path, report)``."""
    out = tmp_path_factory.mktemp("gpu_report")
    env = dict(os.environ, LLMSYS_DEVICE="cpu", PYTHONPATH=str(REPO))
    result = run_bounded([sys.executable, "project/tools/gpu_report.py", "--device", "cpu", "--out", str(out),
                          "--repeats", "3", "--warmup", "1"], DRY_RUN_TIMEOUT, env)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    files = sorted(out.glob("*.json"))
    assert len(files) == 1, files
    return result, files[0], json.loads(files[0].read_text())


def _is_summary(s: dict, n: int = 3) -> bool:
    return set(s) == {"median", "min", "max", "n", "all"} and s["n"] == n and s["min"] <= s["median"] <= s["max"]


@pytest.mark.needs_solution  # the dry run checkpoints (assignment 5.5.4, stubbed in the student release)
def test_the_dry_run_records_every_figure_of_the_gpu_report(dry_run):
    from project.planner.config import PlanConfig
    from project.planner.memory import stage_memory

    result, path, r = dry_run
    assert path.name == f"cpu-dry-run-{r['date']}.json"
    assert r["kind"] == gpu_figures.KIND and r["dry_run"] is True and r["device"]["type"] == "cpu"
    assert {"torch", "cuda", "transformers", "python"} <= set(r["versions"])
    assert r["machine"]["conditions"] in ("quiet", "loaded", "oversubscribed") and "load_average_after" in r["machine"]
    # the GPU tier ran with no GPU visible: every test skipped, each with its reason
    tests = r["tests"]
    assert tests["env"] == {"CUDA_VISIBLE_DEVICES": ""} and not tests["timed_out"]
    assert tests["counts"]["passed"] == tests["counts"]["failed"] == 0 and tests["counts"]["skipped"] >= 15
    assert all(c["outcome"] == "skipped" and "no CUDA GPU" in c["message"] for c in tests["cases"]), tests["cases"]
    # the matrix-product peak: a median and a spread per size; no datasheet figure for a CPU
    m = r["matmul"]
    assert [s["n"] for s in m["sizes"]] == [64, 128] and all(_is_summary(s["flop_per_s"]) for s in m["sizes"])
    assert m["measured_peak"]["flop_per_s"]["median"] == max(s["flop_per_s"]["median"] for s in m["sizes"])
    assert m["datasheet"] is None and m["measured_over_datasheet"] is None
    # tokens/s and MFU, plain and with checkpointing, and the computed verdict between them
    t = r["training"]
    assert t["tokens_per_step"] == 2 * 16 and set(t["variants"]) == {"plain", "checkpointing"}
    for v in t["variants"].values():
        assert _is_summary(v["step_s"]) and _is_summary(v["tokens_per_s"]) and _is_summary(v["mfu_measured_peak"])
        assert v["mfu_datasheet"] is None
        for tokens, step in zip(v["tokens_per_s"]["all"], v["step_s"]["all"]):
            assert tokens == pytest.approx(t["tokens_per_step"] / step, rel=1e-12)
    assert t["checkpointing_vs_plain"]["verdict"] in ("faster", "slower", "indistinguishable")
    # peak memory beside the planner's prediction of the same configuration (project.planner.memory.stage_memory)
    for name, checkpointing in (("plain", False), ("checkpointing", True)):
        v = r["memory"]["variants"][name]
        plan = PlanConfig.for_test(preset="tiny", hardware="cpu", vocab_size=300, model_max_length=16, batch_size=2,
                                   precision="bf16", dropout=0.1, activation_checkpointing=checkpointing,
                                   activation_model="course", device="cpu")
        assert v["predicted_bytes"] == stage_memory(plan, 0).total and _is_summary(v["peak_bytes"])
    assert r["memory"]["variants"]["checkpointing"]["predicted"]["recompute"] > 0
    # the recomputation equals the forward pass on the device (the CPU here), in bf16 with dropout
    c = r["checkpointing"]
    assert c["equal"] and c["blocks"] == c["recomputed_blocks"] == c["equal_blocks"] == 4  # tiny: 4 blocks
    assert c["forward_dtype"] == c["recomputed_dtype"] == "torch.bfloat16" and c["dropout"] > 0
    # the planner's kernel figures: every product shape, memory-bound kernel and attention length measured with a
    # median and a spread (no datasheet on a CPU: no efficiency), and the planner's one-GPU step beside the measured
    # one, marked not comparable on the dry run
    from project.tools.gpu_report_kernels import ATTENTION_SEQS, PLANNER_SHAPES

    k = r["kernels"]
    assert [g["name"] for g in k["gemm"]] == [s[0] for s in PLANNER_SHAPES["cpu"]]
    assert all(_is_summary(g["flop_per_s"]) and g["efficiency"] is None for g in k["gemm"])
    assert set(k["memory"]) == {"copy", "add", "gelu", "layernorm"}
    assert all(_is_summary(m["bytes_per_s"]) for m in k["memory"].values())
    assert [a["seq"] for a in k["attention"]] == ATTENTION_SEQS["cpu"]
    assert all(_is_summary(a["forward_flop_per_s"]) for a in k["attention"])
    step = r["planner_step"]
    assert step["comparable"] is False and step["predicted_s"] > 0
    assert step["error"] == pytest.approx(step["predicted_s"] / step["measured_s"] - 1, rel=1e-12)
    assert step["measured_s"] == r["training"]["variants"]["plain"]["step_s"]["median"]
    assert sum(step["shares"].values()) == pytest.approx(1.0, rel=1e-9)
    assert "DRY RUN" in result.stdout and path.name in result.stdout and "not comparable" in result.stdout


@pytest.mark.needs_solution  # the dry run checkpoints (assignment 5.5.4, stubbed in the student release)
def test_the_notebooks_leave_dry_runs_out_and_read_what_the_report_writes(dry_run, tmp_path):
    _, path, report = dry_run
    assert gpu_figures.latest_report(path.parent) is None, "a dry run is not a GPU figure"
    (tmp_path / "real.json").write_text(json.dumps(dict(report, dry_run=False)))
    for part in gpu_figures.PARTS:  # the reader takes every field it needs from what the script writes
        text = gpu_figures.gpu_figures_text(part, tmp_path)
        assert text.startswith(f"Measured on CPU (dry run) on {report['date']}") and "real.json" in text


def test_without_a_gpu_auto_says_so_and_writes_nothing(tmp_path, monkeypatch, capsys):
    from project.tools import gpu_report

    monkeypatch.setenv("LLMSYS_DEVICE", "cpu")  # what a machine without CUDA gives --device auto (and the suite pins)
    assert gpu_report.main(["--device", "auto", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("no GPU here") and "nothing was measured or written" in out and "--device cpu" in out
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("args, message", [
    (["--device", "cpu", "--out", "r.json"], "--out is the folder of the report"),
    (["--device", "cpu", "--batch_size", "0"], "--batch_size must be >= 1"),
    (["--device", "cpu", "--matmul_sizes", "0"], "--matmul_sizes must be positive"),
    (["--device", "cpu", "--repeats", "2"], "--repeats must be >= 3"),
    (["--device", "cpu", "--preset", "huge"], "argument --preset: invalid choice: 'huge'"),
    (["--device", "cpu", "--vocab_size", "10"], "the planner cannot take this configuration: --vocab_size"),
])
def test_bad_options_are_refused_before_anything_runs(args, message, capsys):
    from project.tools import gpu_report

    with pytest.raises(SystemExit) as info:
        gpu_report.parse(args)
    assert info.value.code == 2 and message in capsys.readouterr().err


def test_a_report_never_replaces_an_earlier_one(tmp_path):
    from project.tools.gpu_report import free_path

    assert free_path(tmp_path, "gpu-2026-01-01") == tmp_path / "gpu-2026-01-01.json"
    (tmp_path / "gpu-2026-01-01.json").write_text("{}")
    (tmp_path / "gpu-2026-01-01-2.json").write_text("{}")
    assert free_path(tmp_path, "gpu-2026-01-01") == tmp_path / "gpu-2026-01-01-3.json"


def test_datasheet_peaks_are_the_dense_bf16_figures_of_the_gpu_named():
    expected = {"NVIDIA H100 80GB HBM3": ("H100 SXM5", 989e12), "NVIDIA H100 PCIe": ("H100 PCIe", 756e12),
                "NVIDIA H200": ("H200 SXM", 989e12), "NVIDIA GH200 480GB": ("GH200 (H100 compute)", 989e12),
                "NVIDIA A100-SXM4-80GB": ("A100", 312e12), "NVIDIA A100 80GB PCIe": ("A100", 312e12),
                "NVIDIA L4": ("L4", 121e12), "NVIDIA A10": ("A10", 125e12)}
    for name, (model, flops) in expected.items():
        found = datasheet_bf16_peak(name)
        assert (found["model"], found["flops"]) == (model, flops), name
    assert datasheet_bf16_peak("NVIDIA A10G") is None and datasheet_bf16_peak("Tesla T4") is None


# ---- the notebooks' reader on fabricated reports ------------------------------------------------------

def fabricated(created: str, name: str = "NVIDIA H100 80GB HBM3", tokens_per_s: float = 4e5) -> dict:
    def s(x):
        return {"median": x, "min": 0.9 * x, "max": 1.1 * x, "n": 5, "all": [0.9 * x, x, x, x, 1.1 * x]}

    variant = {"step_s": s(0.02), "tokens_per_s": s(tokens_per_s), "mfu_datasheet": s(0.25),
               "mfu_measured_peak": s(0.35), "activation_checkpointing": False}
    return {"kind": gpu_figures.KIND, "version": 1, "created": created, "date": created[:10], "dry_run": False,
            "device": {"type": "cuda", "name": name, "slug": "x"},
            "versions": {"torch": "2.11.0+cu130", "cuda": "13.0", "transformers": "5.17.0", "python": "3.12"},
            "tests": {"counts": {"passed": 7, "failed": 0, "skipped": 37}, "timed_out": False},
            "matmul": {"sizes": [{"n": 8192, "flop_per_s": s(7.0e14)}],
                       "measured_peak": {"n": 8192, "flop_per_s": s(7.0e14)},
                       "datasheet": {"model": "H100 SXM5", "flops": 989e12, "source": "datasheet"},
                       "measured_over_datasheet": 7.0e14 / 989e12},
            "training": {"preset": "gpt2", "n_params": 89e6, "batch_size": 64, "seq_len": 128, "vocab_size": 5000,
                         "model_flops_per_step": 4.5e12,
                         "variants": {"plain": variant, "checkpointing": dict(variant, tokens_per_s=s(3e5))},
                         "checkpointing_vs_plain": {"names": ["checkpointing", "plain"], "unit": "s",
                                                    "a": {"all": [1.33] * 7}, "b": {"all": [1.0] * 7}}},
            "memory": {"measure": "torch.cuda.max_memory_allocated (reset per measurement)", "planner": "plan",
                       "variants": {"plain": {"peak_bytes": s(6e9), "predicted_bytes": 5e9,
                                              "measured_over_predicted": 1.2},
                                    "checkpointing": {"peak_bytes": s(3e9), "predicted_bytes": 2e9,
                                                      "measured_over_predicted": 1.5}}},
            "checkpointing": {"device": "cuda:0", "dropout": 0.1, "blocks": 12, "equal_blocks": 12,
                              "forward_dtype": "torch.bfloat16", "recomputed_dtype": "torch.bfloat16",
                              "loss_equal": True, "max_gradient_difference": 0.0}}


def test_the_reader_shows_the_newest_real_report_with_device_and_date(tmp_path):
    (tmp_path / "old.json").write_text(json.dumps(fabricated("2026-01-02T10:00:00+00:00", "NVIDIA A100-SXM4-80GB")))
    (tmp_path / "new.json").write_text(json.dumps(fabricated("2026-03-04T10:00:00+00:00")))
    (tmp_path / "dry.json").write_text(json.dumps(dict(fabricated("2026-05-06T10:00:00+00:00", "CPU"), dry_run=True)))
    (tmp_path / "other.json").write_text(json.dumps({"machine": {}, "config": {}}))  # another benchmark's JSON
    report = gpu_figures.latest_report(tmp_path)
    assert report["file"] == "new.json" and report["device"]["name"] == "NVIDIA H100 80GB HBM3"

    memory = gpu_figures.gpu_figures("memory", tmp_path)
    assert (memory["device"], memory["date"]) == ("NVIDIA H100 80GB HBM3", "2026-03-04")
    rows = {r["figure"]: r for r in memory["rows"]}
    assert rows["peak memory of a step, bf16"]["median"] == pytest.approx(6.0)  # GB
    assert rows["planner's prediction, bf16"]["median"] == pytest.approx(5.0)
    assert rows["planner's prediction, bf16 + activation checkpointing"]["note"] == "measured / predicted 1.50"
    assert [r["figure"] for r in memory["rows"]][0] == "peak memory of a step, bf16", "plain first"
    assert any("12 of 12 blocks recomputed bit-equal" in note for note in memory["notes"])

    throughput = gpu_figures.gpu_figures("throughput", tmp_path)
    rows = {r["figure"]: r for r in throughput["rows"]}
    assert rows["bf16 matrix product, n = 8192"]["median"] == pytest.approx(700.0)  # TFLOP/s
    assert rows["datasheet peak, H100 SXM5 (dense bf16)"]["median"] == pytest.approx(989.0)
    assert rows["tokens/s, bf16"]["median"] == 4e5
    assert rows["tokens/s, bf16 + activation checkpointing"]["median"] == 3e5
    assert rows["MFU against the datasheet, bf16"]["median"] == pytest.approx(25.0)  # percent
    assert rows["MFU against the measured product peak, bf16"]["median"] == pytest.approx(35.0)

    text = gpu_figures.gpu_figures_text("throughput", tmp_path)
    assert text.startswith("Measured on NVIDIA H100 80GB HBM3 on 2026-03-04 (torch 2.11.0+cu130, CUDA 13.0; "
                           "GPU tier on one GPU: 7 passed, 0 failed, 37 skipped; new.json)")
    assert "verdict: checkpointing is slower than plain" in text and str(tmp_path) not in text  # no absolute path


def test_without_a_report_the_reader_says_how_to_make_one(tmp_path):
    assert gpu_figures.latest_report(tmp_path) is None and gpu_figures.gpu_figures("memory", tmp_path) is None
    text = gpu_figures.gpu_figures_text("memory", tmp_path)
    assert text.startswith("No GPU report yet") and "python project/tools/gpu_report.py" in text
    with pytest.raises(ValueError, match="part must be one of"):
        gpu_figures.gpu_figures("speed", tmp_path)
    (tmp_path / "broken.json").write_text("{")
    with pytest.raises(ValueError, match="broken.json .*is not JSON"):
        gpu_figures.latest_report(tmp_path)


@pytest.mark.needs_solution  # runs memory.checkpointing (assignment 5.5.4), which the student release stubs
def test_the_recomputation_check_sees_other_dropout_masks(monkeypatch):
    """Planted: a recomputation that does not get the forward pass's random state back (``torch.set_rng_state``
    doing nothing) draws other dropout masks; the check the report records must say so."""
    import torch

    from memory.labs.experiments import recomputation_check

    assert recomputation_check("cpu", "tiny", 300, 16, 2)["equal"]
    monkeypatch.setattr(torch, "set_rng_state", lambda state: None)
    planted = recomputation_check("cpu", "tiny", 300, 16, 2)
    assert planted["recomputed_blocks"] == planted["blocks"] == 4
    assert not planted["equal"] and planted["equal_blocks"] < planted["blocks"] and planted["max_abs_difference"] > 0


def test_a_stubbed_checkpointing_is_refused_before_anything_runs(monkeypatch, capsys):
    from course import assignments
    from project.tools import gpu_report

    monkeypatch.setattr(assignments, "stubs", lambda tree=None: {
        "ASSIGN5_5_4": ("memory/checkpointing.py", "Assignment 5.5.4: implement CheckpointFunction.forward")})
    with pytest.raises(SystemExit) as info:
        gpu_report.parse(["--device", "cpu"])
    err = capsys.readouterr().err
    assert info.value.code == 2 and "measures activation checkpointing" in err
    assert "5.5.4 in memory/checkpointing.py" in err
