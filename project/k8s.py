"""Kubernetes manifests for a multi-node run of any mode of the registry (``project/modes.py``).

    python project/k8s.py --mode 3d --dp 2 --pp 2 --tp 2 --nodes 2 --gpus_per_node 4 --image registry/course:v1 \\
        --out llmsys-3d.yaml                       # then: kubectl apply -f llmsys-3d.yaml
    python project/k8s.py --kind trainjob --mode dp --nodes 4 --gpus_per_node 8 --image registry/course:v1

``--kind job`` (the default) writes plain Kubernetes, nothing but the cluster needed:

* a **headless Service** named like the job (``clusterIP: None``, ``publishNotReadyAddresses``), so that pod ``i``
  of the job has the stable DNS name ``<name>-<i>.<name>`` as soon as it has an address;
* an **Indexed Job** (``completionMode: Indexed``, ``completions = parallelism = --nodes``): one pod per node,
  each with ``JOB_COMPLETION_INDEX`` (the downward API's completion-index annotation) and ``--gpus_per_node``
  GPUs (``nvidia.com/gpu``). Every pod runs ``torchrun --nnodes N --nproc_per_node G --rdzv_backend c10d
  --rdzv_endpoint <name>-0.<name>:PORT --rdzv_id <name> --local_addr <name>-<i>.<name> project/train.py --mode
  ...``: the rendezvous is pod 0's stable name (pod 0 hosts c10d's store), and c10d numbers the nodes in the order
  of their addresses, ``--local_addr``: with up to 10 nodes the node rank is the completion index (beyond, the
  names sort as text, ``-10`` before ``-2``; nothing in the course depends on which pod holds which node rank —
  a node's G ranks are consecutive either way, so tensor-parallel groups stay inside a pod). An init container
  waits until pod 0's name resolves. The Multi30k files come from a read-only volume (``--data_claim``, at
  ``/data/multi30k``, ``LLMSYS_DATA_DIR``), results, checkpoints and the tokenizer go to a shared one
  (``--runs_claim``, ``/runs/<name>``, the run's ``--workdir``), ``/dev/shm`` is memory (NCCL's shared-memory
  transport). The environment is the course's: ``LLMSYS_DEVICE=cuda`` (a pod without GPUs stops with a message
  instead of training on its CPU), ``TORCH_NCCL_ASYNC_ERROR_HANDLING=1``, the NCCL flight recorder (2000 entries,
  dumped into the run's folder when a collective times out). ``backoffLimit: 0``: a failed pod fails the job
  (torchrun's ``--max_restarts`` restarts the ranks inside the pods first); ``activeDeadlineSeconds`` is the
  run's ``--timeout`` plus the rendezvous' ``--join_timeout``.

``--kind trainjob`` writes a **Kubeflow Trainer TrainJob** (``trainer.kubeflow.org/v1alpha1``, Trainer >= 2.2:
``runtimePatches``) on the ``torch-distributed`` ClusterTrainingRuntime that Kubeflow Trainer installs: the
runtime makes the JobSet, its headless service and the torchrun rendezvous (``PET_NNODES``,
``PET_NPROC_PER_NODE``, ``PET_NODE_RANK`` = the node's index, ``PET_MASTER_ADDR``/``PORT``, read by torchrun);
the TrainJob gives the image, the command, ``numNodes``, ``numProcPerNode``, the GPUs, the course's environment
and the two volumes. Why this and not the training operator's ``PyTorchJob`` (``kubeflow.org/v1``): README,
"Kubernetes".

The request is checked here first, with the mode's own configuration for ``nodes x gpus_per_node`` GPUs
(:meth:`course.config.RunConfig.for_machine`, no torch): a bad option, a mesh whose size is not the number of
GPUs, a tensor-parallel group that does not fit in a node, a one-process mode stop with a message (exit code 2)
before anything is written; an existing ``--out`` is not replaced without ``--overwrite``.
"""
from __future__ import annotations

import argparse
import os
import re
import shlex
import sys
from pathlib import Path

if __name__ == "__main__":  # run as a file: import the packages of the tree this script sits in
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from project.modes import MODES  # noqa: E402

PROG = "k8s.py"
KINDS = ("job", "trainjob")
DATA_MOUNT, RUNS_MOUNT = "/data/multi30k", "/runs"
TRAINER_API = "trainer.kubeflow.org/v1alpha1"
MANAGER = "llmsys-parallel-course/k8s"  # the TrainJob's runtime patch's owner
LABEL = "llmsys-parallel-course/job"
INDEX_ANNOTATION = "batch.kubernetes.io/job-completion-index"
# Options the manifest sets itself: where the run writes and reads, and its device.
SET_HERE = {"workdir": f"the run's folder is {RUNS_MOUNT}/<name> on the --runs_claim volume",
            "data_dir": f"the data comes from the --data_claim volume at {DATA_MOUNT}",
            "device": "the pods train on their GPUs (LLMSYS_DEVICE=cuda)"}
WAIT_FOR_HOST = ("import socket, sys, time\n"
                 "host, deadline = sys.argv[1], time.time() + float(sys.argv[2])\n"
                 "while True:\n"
                 "    try:\n"
                 "        socket.getaddrinfo(host, None)\n"
                 "        break\n"
                 "    except OSError:\n"
                 "        if time.time() > deadline:\n"
                 "            sys.exit(f'the rendezvous host {host} did not resolve within {sys.argv[2]} s')\n"
                 "        time.sleep(2)\n")


def front_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG, allow_abbrev=False, formatter_class=argparse.ArgumentDefaultsHelpFormatter,
        description="Write the Kubernetes manifest of a multi-node run; every other option is the mode's "
                    "(python project/train.py --mode MODE --help).")
    parser.add_argument("--mode", required=True, choices=tuple(MODES), help="the training mode")
    parser.add_argument("--nodes", type=int, required=True, help="pods (nodes) of the job")
    parser.add_argument("--gpus_per_node", type=int, required=True, help="GPUs (ranks) per pod")
    parser.add_argument("--image", required=True, help="a container image holding the course (requirements.txt "
                                                       "installed, the repository at --code_dir)")
    parser.add_argument("--kind", choices=KINDS, default="job",
                        help="job: an Indexed Job and a headless Service; trainjob: a Kubeflow Trainer TrainJob")
    parser.add_argument("--name", default=None, help="the job's name (default: llmsys-<mode>-<nodes>x<gpus>)")
    parser.add_argument("--namespace", default=None, help="the namespace (default: kubectl's)")
    parser.add_argument("--code_dir", default="/workspace/course", help="where the image holds the repository")
    parser.add_argument("--data_claim", default="llmsys-data", help="PersistentVolumeClaim holding the Multi30k files")
    parser.add_argument("--runs_claim", default="llmsys-runs",
                        help="PersistentVolumeClaim (ReadWriteMany) for results, checkpoints and the tokenizer")
    parser.add_argument("--port", type=int, default=29400, help="the rendezvous port on pod 0 (job)")
    parser.add_argument("--max_restarts", type=int, default=0, help="torchrun's restarts of the ranks (job)")
    parser.add_argument("--join_timeout", type=int, default=600,
                        help="seconds the pods wait for each other (image pulls, scheduling) (job)")
    parser.add_argument("--runtime", default="torch-distributed", help="the ClusterTrainingRuntime (trainjob)")
    parser.add_argument("--out", default=None, help="write the manifest to this file (default: print it)")
    parser.add_argument("--overwrite", action="store_true", help="replace an existing --out")
    return parser


def _dns_label(name: str) -> bool:
    return bool(re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", name))


def check_request(argv: list[str] | None = None):
    """``(front options, the mode's options, the mode's configuration)`` of a request, checked (see the module
    docstring); exits with code 2 and a message before anything is written otherwise."""
    from course.config import ConfigError

    parser = front_parser()
    front, rest = parser.parse_known_args(argv)
    if front.nodes < 1 or front.gpus_per_node < 1:
        parser.error(f"--nodes {front.nodes} and --gpus_per_node {front.gpus_per_node} must be >= 1")
    front.name = front.name or f"llmsys-{front.mode}-{front.nodes}x{front.gpus_per_node}".replace("_", "-")
    longest = f"{front.name}-{front.nodes - 1}"
    if not _dns_label(front.name) or len(longest) > 63:
        parser.error(f"--name {front.name!r}: a job's pods are named <name>-<index> ({longest}), which must be a DNS "
                     "label: lower-case letters, digits and '-', at most 63 characters")
    mode = MODES[front.mode]
    prog = f"{PROG} --mode {front.mode}"
    mode_parser = mode.config.parser(prog)
    values = vars(mode_parser.parse_args(rest))
    given = {a.split("=")[0].lstrip("-") for a in rest if a.startswith("--")}
    for name, why in SET_HERE.items():
        if name in given:
            parser.error(f"--{name}: {why}; leave it out")
    devices = front.nodes * front.gpus_per_node
    try:
        config = mode.config.for_machine(devices, **{**values, "device": "cuda", "backend": "nccl"})
    except ConfigError as exc:
        parser.error(f"--mode {front.mode} on {front.nodes} x {front.gpus_per_node} GPUs: {exc}")
    if mode.runs_in_process(config):
        parser.error(f"--mode {front.mode} with these options runs in one process; a multi-node job runs one process "
                     "per GPU: choose a schedule (e.g. --schedule 1f1b)")
    tp = getattr(config, "tp", 1) or 1
    if front.gpus_per_node % tp:
        parser.error(f"--tp {tp} does not divide --gpus_per_node {front.gpus_per_node}: a tensor-parallel group "
                     "(consecutive ranks) must sit inside one node, where its all-reduces stay on NVLink")
    return front, rest, config


def course_env(name: str) -> list[dict]:
    """The environment every rank of the run gets (both kinds)."""
    return [{"name": "LLMSYS_DEVICE", "value": "cuda"},
            {"name": "LLMSYS_DATA_DIR", "value": DATA_MOUNT},
            {"name": "TORCH_NCCL_ASYNC_ERROR_HANDLING", "value": "1"},
            {"name": "TORCH_FR_BUFFER_SIZE", "value": "2000"},
            {"name": "TORCH_NCCL_DUMP_ON_TIMEOUT", "value": "1"},
            {"name": "TORCH_FR_DUMP_TEMP_FILE", "value": f"{RUNS_MOUNT}/{name}/flight_recorder_rank_"},
            {"name": "NCCL_DEBUG", "value": "WARN"},
            {"name": "PYTHONUNBUFFERED", "value": "1"}]


def training_command(front, rest: list[str]) -> list[str]:
    """``project/train.py --mode MODE <the mode's options> --workdir /runs/<name>`` in the image."""
    return [f"{front.code_dir}/project/train.py", "--mode", front.mode, *rest, "--workdir",
            f"{RUNS_MOUNT}/{front.name}"]


def _volumes(front) -> tuple[list[dict], list[dict]]:
    volumes = [{"name": "data", "persistentVolumeClaim": {"claimName": front.data_claim, "readOnly": True}},
               {"name": "runs", "persistentVolumeClaim": {"claimName": front.runs_claim}},
               {"name": "dshm", "emptyDir": {"medium": "Memory"}}]
    mounts = [{"name": "data", "mountPath": DATA_MOUNT, "readOnly": True},
              {"name": "runs", "mountPath": RUNS_MOUNT},
              {"name": "dshm", "mountPath": "/dev/shm"}]
    return volumes, mounts


def _metadata(front, **extra) -> dict:
    meta = {"name": front.name, "labels": {LABEL: front.name}, **extra}
    if front.namespace:
        meta["namespace"] = front.namespace
    return meta


def job_manifests(front, rest: list[str], config) -> list[dict]:
    """The headless Service and the Indexed Job (see the module docstring)."""
    name, nodes, gpus = front.name, front.nodes, front.gpus_per_node
    endpoint_host = f"{name}-0.{name}"
    volumes, mounts = _volumes(front)
    env = [{"name": "JOB_COMPLETION_INDEX",
            "valueFrom": {"fieldRef": {"fieldPath": f"metadata.annotations['{INDEX_ANNOTATION}']"}}},
           {"name": "NODE_ADDR", "value": f"{name}-$(JOB_COMPLETION_INDEX).{name}"},
           *course_env(name)]
    torchrun = [f"--nnodes={nodes}", f"--nproc_per_node={gpus}", "--rdzv_backend=c10d",
                f"--rdzv_endpoint={endpoint_host}:{front.port}", f"--rdzv_id={name}", "--local_addr=$(NODE_ADDR)",
                f"--max_restarts={front.max_restarts}", f"--rdzv_conf=join_timeout={front.join_timeout}"]
    service = {"apiVersion": "v1", "kind": "Service", "metadata": _metadata(front),
               "spec": {"clusterIP": "None", "publishNotReadyAddresses": True, "selector": {LABEL: name},
                        "ports": [{"name": "rendezvous", "port": front.port, "targetPort": front.port}]}}
    job = {"apiVersion": "batch/v1", "kind": "Job", "metadata": _metadata(front),
           "spec": {"completionMode": "Indexed", "completions": nodes, "parallelism": nodes, "backoffLimit": 0,
                    "activeDeadlineSeconds": int(config.timeout) + front.join_timeout,
                    "template": {"metadata": {"labels": {LABEL: name}},
                                 "spec": {"subdomain": name, "restartPolicy": "Never",
                                          "initContainers": [{
                                              "name": "wait-for-rendezvous-host", "image": front.image,
                                              "command": ["python", "-c", WAIT_FOR_HOST, endpoint_host,
                                                          str(front.join_timeout)]}],
                                          "containers": [{
                                              "name": "trainer", "image": front.image, "command": ["torchrun"],
                                              "args": [*torchrun, *training_command(front, rest)], "env": env,
                                              "ports": [{"name": "rendezvous", "containerPort": front.port}],
                                              "resources": {"limits": {"nvidia.com/gpu": str(gpus)}},
                                              "volumeMounts": mounts}],
                                          "volumes": volumes}}}}
    return [service, job]


def trainjob_manifests(front, rest: list[str], config) -> list[dict]:
    """The TrainJob (see the module docstring)."""
    volumes, mounts = _volumes(front)
    pod = {"spec": {"volumes": volumes, "containers": [{"name": "node", "volumeMounts": mounts}]}}
    patch = {"manager": MANAGER, "trainingRuntimeSpec": {"template": {"spec": {"replicatedJobs": [
        {"name": "node", "template": {"spec": {"template": pod}}}]}}}}
    return [{"apiVersion": TRAINER_API, "kind": "TrainJob", "metadata": _metadata(front),
             "spec": {"runtimeRef": {"apiGroup": "trainer.kubeflow.org", "kind": "ClusterTrainingRuntime",
                                     "name": front.runtime},
                      "activeDeadlineSeconds": int(config.timeout) + front.join_timeout,
                      "trainer": {"image": front.image, "command": ["torchrun", *training_command(front, rest)],
                                  "numNodes": front.nodes, "numProcPerNode": front.gpus_per_node,
                                  "resourcesPerNode": {"limits": {"nvidia.com/gpu": str(front.gpus_per_node)}},
                                  "env": course_env(front.name)},
                      "runtimePatches": [patch]}}]


def manifests(front, rest: list[str], config) -> list[dict]:
    return (job_manifests if front.kind == "job" else trainjob_manifests)(front, rest, config)


def render(front, rest: list[str], documents: list[dict], argv: list[str]) -> str:
    """The manifest as YAML documents, after a comment saying what made it and how to start it."""
    import yaml

    head = (f"# {front.kind} for python project/{PROG} {shlex.join(argv)}\n"
            f"# {front.nodes} node(s) x {front.gpus_per_node} GPU(s), image {front.image}; start it with "
            "kubectl apply -f <this file>\n"
            f"# needs: PersistentVolumeClaims {front.data_claim} (the Multi30k files) and {front.runs_claim} "
            "(ReadWriteMany)" + (f"; Kubeflow Trainer >= 2.2 with the ClusterTrainingRuntime {front.runtime}"
                                 if front.kind == "trainjob" else "") + "\n")
    return head + yaml.safe_dump_all(documents, sort_keys=False, width=120)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    front, rest, config = check_request(argv)
    text = render(front, rest, manifests(front, rest, config), argv)
    if front.out is None:
        sys.stdout.write(text)
        return 0
    out = Path(front.out)
    if out.exists() and not front.overwrite:
        front_parser().error(f"--out {out} exists; pass --overwrite to replace it, or choose another file")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
    tmp.write_text(text)
    os.replace(tmp, out)
    print(f"wrote {out}: {front.kind} {front.name}, {front.nodes} x {front.gpus_per_node} GPUs "
          f"(kubectl apply -f {out})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
