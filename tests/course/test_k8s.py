"""The Kubernetes manifests of ``project/k8s.py``, tested without a cluster.

* Every document parses into the official ``kubernetes`` client's models (Service, Job) or the Kubeflow Trainer
  SDK's (``kubeflow_trainer_api``: TrainJob) and comes back unchanged: a field the models do not know would be
  dropped on the way (the clients ignore unknown keys), so the round trip finds it.
* The Job's pods, run here as local processes: for each completion index, the init container's and the trainer
  container's command lines and environment are taken from the manifest as the kubelet would build them (the
  downward API's completion index, ``$(VAR)`` expanded from the variables before it), with only what this machine
  lacks replaced: ``torchrun`` by ``python -m torch.distributed.run``, pod ``i``'s DNS name ``<job>-<i>.<job>`` by
  ``127.0.0.<i + 1>`` (loopback addresses that sort like the pods' names) and the rendezvous port by a free one,
  the image's paths (``/workspace/course``, the two volumes) by this checkout and folders of the test, and
  ``LLMSYS_DEVICE=cuda`` by ``cpu`` (no GPUs: gloo). Two pods x two ranks train pipeline 1F1B over 4 stages and
  must give **exactly** the one-process run's losses: with one micro-batch every stage runs the same operations on
  the same tensors as the one process does, dropout is off, and the only sum across processes is the tied
  embedding's gradient, two terms (commutative, so exact). Each pod's ranks are its node's (node rank = completion
  index: c10d numbers the nodes by their addresses).
* A bad request stops before anything is written.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from tests.course.test_fail_safe import assert_all_gone, descendants, needs_proc

REPO = Path(__file__).resolve().parents[2]
TRAINING = ["--preset", "tiny", "--batch_size", "8", "--model_max_length", "32", "--vocab_size", "1000",
            "--max_train_examples", "2000", "--n_bleu", "0", "--max_val_batches", "1", "--max_batches", "3",
            "--dropout", "0", "--quiet"]
PIPELINE = ["--mode", "pipeline", "--schedule", "1f1b", "--pp", "4", "--micro_batches", "1", *TRAINING]
CLUSTER = ["--nodes", "2", "--gpus_per_node", "2", "--image", "registry.example/llmsys-course:test"]


def manifest(tmp_path, *argv) -> list[dict]:
    from project.k8s import main

    out = tmp_path / f"manifest{len(list(tmp_path.glob('manifest*')))}.yaml"
    assert main([*argv, "--out", str(out)]) == 0
    return list(yaml.safe_load_all(out.read_text()))


class _Response:  # what kubernetes.client.ApiClient.deserialize reads: an HTTP response's body
    def __init__(self, doc: dict):
        self.data = json.dumps(doc)


def round_trip(doc: dict) -> dict:
    """``doc`` through its official model and back (unknown fields are dropped on the way)."""
    if doc["apiVersion"].startswith("trainer.kubeflow.org/"):
        from kubeflow_trainer_api import models

        return getattr(models, f"TrainerV1alpha1{doc['kind']}").from_dict(doc).to_dict()
    from kubernetes import client

    api = client.ApiClient()
    model = {("v1", "Service"): "V1Service", ("batch/v1", "Job"): "V1Job"}[(doc["apiVersion"], doc["kind"])]
    return api.sanitize_for_serialization(api.deserialize(_Response(doc), model))


@pytest.mark.parametrize("kind", ["job", "trainjob"])
@pytest.mark.parametrize("request_", [PIPELINE, ["--mode", "3d", "--dp", "1", "--pp", "2", "--tp", "2"],
                                      ["--mode", "dp", "--zero", "3", "--checkpoint_every", "100"]],
                         ids=["1f1b", "3d", "dp-zero3"])
def test_every_document_parses_into_the_official_models_with_no_unknown_field(tmp_path, kind, request_):
    docs = manifest(tmp_path, *request_, *CLUSTER, "--kind", kind)
    assert [d["kind"] for d in docs] == (["Service", "Job"] if kind == "job" else ["TrainJob"])
    for doc in docs:
        assert round_trip(doc) == doc, f"{doc['kind']}: a field the official model does not know (dropped)"
    if kind == "job":
        service, job = docs
        pod = job["spec"]["template"]["spec"]
        assert service["spec"]["clusterIP"] == "None" and pod["subdomain"] == service["metadata"]["name"]
        assert job["spec"]["completionMode"] == "Indexed" and job["spec"]["completions"] == 2
        trainer = pod["containers"][0]
        assert trainer["resources"]["limits"] == {"nvidia.com/gpu": "2"}
        assert trainer["command"] == ["torchrun"] and "--rdzv_backend=c10d" in trainer["args"]
        training = trainer["args"][trainer["args"].index("/workspace/course/project/train.py"):]
    else:
        trainer = docs[0]["spec"]["trainer"]
        assert (trainer["numNodes"], trainer["numProcPerNode"]) == (2, 2)
        assert docs[0]["spec"]["runtimeRef"]["kind"] == "ClusterTrainingRuntime"
        training = trainer["command"][1:]
    # the same training command in both kinds: the mode, its options as given, the run's folder on the volume
    assert training == ["/workspace/course/project/train.py", *request_, "--workdir",
                        f"/runs/llmsys-{request_[1]}-2x2"]


@pytest.mark.parametrize("argv,message", [
    (["--mode", "3d", "--dp", "1", "--pp", "2", "--tp", "2", "--nodes", "3"], "choose sizes whose product is 6"),
    (["--mode", "tp", "--tp", "4"], "must sit inside one node"),
    (["--mode", "dp", "--batch_size", "6"], "--batch_size 6 is not divisible by --dp 4"),
    (["--mode", "pipeline", "--single_process", "sequential"], "runs in one process"),
    (["--mode", "dp", "--workdir", "/tmp/x"], "--workdir: the run's folder is /runs/<name>"),
    (["--mode", "dp", "--no_such_option", "1"], "unrecognized arguments: --no_such_option"),
    (["--mode", "tp", "--tp", "2", "--name", "Not_A_DNS_Name"], "must be a DNS label"),
], ids=["mesh-vs-gpus", "tp-across-nodes", "batch", "one-process", "workdir", "unknown", "name"])
def test_a_bad_request_stops_before_writing(tmp_path, capsys, argv, message):
    from project.k8s import main

    out = tmp_path / "manifest.yaml"
    cluster = {"--nodes": "2", "--gpus_per_node": "2", "--image": "x"}
    for option, value in cluster.items():
        if option not in argv:
            argv = [*argv, option, value]
    with pytest.raises(SystemExit) as stop:
        main([*argv, "--out", str(out)])
    assert stop.value.code == 2 and message in capsys.readouterr().err
    assert not out.exists()


def test_an_existing_manifest_is_not_replaced(tmp_path, capsys):
    from project.k8s import main

    out = tmp_path / "manifest.yaml"
    out.write_text("mine")
    with pytest.raises(SystemExit):
        main([*PIPELINE, *CLUSTER, "--out", str(out)])
    assert out.read_text() == "mine" and "--overwrite" in capsys.readouterr().err


# ---- the Job's pods as local processes --------------------------------------------------------------------

def _expand(text: str, env: dict) -> str:
    """Kubernetes' ``$(VAR)`` expansion (a variable not defined stays as written)."""
    return re.sub(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", lambda m: env.get(m.group(1), m.group(0)), text)


def pod_commands(job: dict, index: int, replace: dict) -> tuple[list[list[str]], dict]:
    """Pod ``index``'s init containers' and trainer's command lines and the trainer's environment, as the kubelet
    makes them from the manifest, with the strings of ``replace`` replaced (longest first)."""
    spec = job["spec"]["template"]["spec"]
    annotations = {"batch.kubernetes.io/job-completion-index": str(index)}
    env: dict[str, str] = {}
    for var in spec["containers"][0]["env"]:
        if "valueFrom" in var:
            path = var["valueFrom"]["fieldRef"]["fieldPath"]
            key = re.fullmatch(r"metadata\.annotations\['([^']+)'\]", path).group(1)
            env[var["name"]] = annotations[key]
        else:
            env[var["name"]] = _expand(var["value"], env)

    def local(text: str) -> str:
        for old in sorted(replace, key=len, reverse=True):
            text = text.replace(old, replace[old])
        return text

    commands = [[local(_expand(a, env)) for a in [*c.get("command", []), *c.get("args", [])]]
                for c in [*spec.get("initContainers", []), spec["containers"][0]]]
    return commands, {k: local(v) for k, v in env.items()}


def _environ(pid: int) -> dict[str, str]:
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return {}
    return dict(kv.decode(errors="replace").split("=", 1) for kv in raw.split(b"\0") if b"=" in kv)


@needs_proc
@pytest.mark.needs_solution
@pytest.mark.timeout(300)
def test_the_jobs_pods_train_the_one_process_runs_losses(tmp_path):
    from course.data import resolve_data_dir
    from course.launch import free_port
    from project.options.run_pipeline import PipelineConfig
    from project.train import run

    job = next(d for d in manifest(tmp_path, *PIPELINE, *CLUSTER) if d["kind"] == "Job")
    name = job["metadata"]["name"]
    runs = tmp_path / "runs"
    replace = {"/workspace/course": str(REPO), "/runs": str(runs), "/data/multi30k": str(resolve_data_dir()),
               f"{name}-0.{name}:29400": f"127.0.0.1:{free_port()}"}
    replace.update({f"{name}-{i}.{name}": f"127.0.0.{i + 1}" for i in range(2)})
    base = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    pods, seen = [], {}
    try:
        for index in range(2):
            commands, env = pod_commands(job, index, replace)
            *init, trainer = commands
            env = {**base, **env, "LLMSYS_DEVICE": "cpu", "OMP_NUM_THREADS": "1"}
            assert env["LLMSYS_DEVICE"] == "cpu" and dict(pod_commands(job, index, {})[1])["LLMSYS_DEVICE"] == "cuda"
            for command in init:  # wait-for-rendezvous-host: pod 0's name resolves
                command = [sys.executable if a == "python" else a for a in command]
                subprocess.run(command, env=env, check=True, timeout=60)
            assert trainer[0] == "torchrun"
            log = open(tmp_path / f"pod{index}.log", "w")
            pods.append(subprocess.Popen([sys.executable, "-m", "torch.distributed.run", *trainer[1:]], env=env,
                                         stdout=log, stderr=subprocess.STDOUT, start_new_session=True))
        deadline = time.monotonic() + 240
        while any(p.poll() is None for p in pods) and time.monotonic() < deadline:
            for index, pod in enumerate(pods):  # each rank: its pod, node rank and rank
                for pid in descendants(pod.pid):
                    e = _environ(pid)
                    if "RANK" in e and "GROUP_RANK" in e:
                        seen[pid] = (index, int(e["GROUP_RANK"]), int(e["RANK"]), e.get("JOB_COMPLETION_INDEX"))
            time.sleep(0.1)
        everyone = set().union(*(descendants(p.pid) for p in pods))
    finally:
        for pod in pods:
            if pod.poll() is None:
                os.killpg(pod.pid, signal.SIGKILL)
            pod.wait()
    logs = "\n".join(f"--- pod {i}:\n{(tmp_path / f'pod{i}.log').read_text()[-3000:]}" for i in range(len(pods)))
    assert [p.returncode for p in pods] == [0, 0], logs
    assert_all_gone(everyone)
    # pod i held node rank i and the ranks 2i, 2i + 1; its processes saw their completion index
    assert sorted(set(seen.values())) == [(0, 0, 0, "0"), (0, 0, 1, "0"), (1, 1, 2, "1"), (1, 1, 3, "1")], seen

    workdir = runs / name
    losses = {r: json.loads((workdir / f"pipeline_1f1b_rank{r}_results_epoch0.json").read_text())["train_losses"]
              for r in range(4)}
    one = tmp_path / "one_process"
    one.mkdir()
    for tokenizer in workdir.glob("tokenizer_*.json"):  # the same tokenizer (training it again is not under test)
        shutil.copy(tokenizer, one / tokenizer.name)
    config = PipelineConfig.from_command_line([*TRAINING, "--single_process", "sequential", "--pp", "4",
                                               "--device", "cpu", "--workdir", str(one)], environment=False)
    assert run(config) == 0
    reference = json.loads((one / "pipeline_sequential_rank0_results_epoch0.json").read_text())["train_losses"]
    assert len(reference) == 3
    for r in range(4):
        assert losses[r] == reference, f"rank {r}: {losses[r]} vs one process {reference}"
