"""Every tensor a part creates says where it lives — so no collective can get a tensor on the wrong device.

On GPUs a run's process group is ``"cpu:gloo,cuda:nccl"`` (``course.launch``): CUDA tensors travel over
NCCL, host tensors over gloo. A collective is right when every rank hands it a tensor on the same
device, the one its data lives on: gradients, parameters, activations and the buffers built from them
on the run's device; counts, flags and timings on the host (docs/architecture.md, "Devices and
back-ends"). A tensor factory that names no device makes a CPU tensor whatever the run's device —
on a GPU run that is a ZeRO buffer the parameters are re-pointed into, a PowerSGD ``Q`` multiplied by
a CUDA gradient, a grad-norm accumulator that one rank sends over gloo while the others use NCCL.

So, read statically (the AST of every module of ``course/`` and of every part): each call of a tensor
factory (``torch.zeros``, ``torch.tensor``, ``torch.randn``, ...) either names its ``device=``, or is
moved at once (``torch.randint(...).to(device)``), or sits in one of the few places listed in
:data:`HOST_ONLY` with the reason it is right on the host. ``*_like`` and ``tensor.new_*`` take their
device from a tensor and are not factories here. The scan fails on an allow-list entry that no longer
matches anything, and checks that it found the modules and the calls it is about.
"""
from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
NOT_PARTS = {"tests", "instructor", "project", "notebooks", "docs", "results", "workdir", "data"}
FACTORIES = {"tensor", "as_tensor", "zeros", "ones", "empty", "full", "arange", "rand", "randn", "randint",
             "randperm", "eye", "linspace", "logspace", "empty_strided", "from_numpy", "frombuffer"}
MOVES = {"to", "cuda", "cpu"}

# (module path, enclosing function or class.method) -> why a device-less factory is right there.
HOST_ONLY = {
    ("course/collate.py", "Collate.__call__"):
        "builds a batch on the host (a DataLoader's collate function); each mode moves it with to_device",
    ("course/decoding.py", "greedy_translate"):
        "the token bookkeeping of greedy decoding stays on the host; each forward's inputs go .to(device)",
    ("tensor_parallel/labs/experiments.py", "basics_worker"):
        "a notebook demonstration of f, g and the split layers on host tensors (printed values); the run's "
        "group carries them over gloo",
    ("tensor_parallel/labs/experiments.py", "gpt2_report_worker"):
        "compares the TP model with transformers' model, both built on the host, on a batch drawn there",
    ("tensor_parallel/labs/experiments.py", "activation_memory"):
        "counts the bytes autograd saves per block of a model built on the host (the same count on every device)",
}


def modules() -> list[Path]:
    """Every module of the shared library and of every part (a top-level package that is not a tool)."""
    packages = [p for p in REPO.iterdir() if p.is_dir() and (p / "__init__.py").is_file() and p.name not in NOT_PARTS]
    return sorted(f for pkg in packages for f in pkg.rglob("*.py") if "__pycache__" not in f.parts)


def factory_calls(path: Path):
    """``(qualname of the enclosing function, line, factory, moved)`` of every torch factory call in ``path``."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    moved = set()
    for node in ast.walk(tree):  # torch.x(...).to(...) / .cuda() / .cpu(): the factory's result is moved at once
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in MOVES:
            moved.add(id(node.func.value))
    found = []

    def visit(node, scope):
        for child in ast.iter_child_nodes(node):
            inner = scope
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                inner = f"{scope}.{child.name}" if scope else child.name
            if (isinstance(child, ast.Call) and isinstance(child.func, ast.Attribute)
                    and isinstance(child.func.value, ast.Name) and child.func.value.id == "torch"
                    and child.func.attr in FACTORIES):
                named = any(k.arg == "device" for k in child.keywords)
                found.append((scope, child.lineno, child.func.attr, named or id(child) in moved))
            visit(child, inner)

    visit(tree, "")
    return found


def test_every_tensor_factory_names_its_device():
    files = modules()
    names = {f.relative_to(REPO).parts[0] for f in files}
    assert {"course", "data_parallel", "pipeline", "tensor_parallel", "communication", "memory", "three_d",
            "context_parallel"} <= names
    calls, unplaced, used = 0, [], set()
    for path in files:
        rel = path.relative_to(REPO).as_posix()
        for scope, line, factory, placed in factory_calls(path):
            calls += 1
            if placed:
                continue
            key = next((k for k in HOST_ONLY if k[0] == rel and (scope == k[1] or scope.startswith(k[1] + "."))), None)
            if key is None:
                unplaced.append(f"{rel}:{line} torch.{factory}(...) in {scope or 'the module'}")
            else:
                used.add(key)
    assert calls > 60, f"found only {calls} factory calls: is the scan still reading the packages?"
    assert not unplaced, ("tensor factories that name no device (add device=<the data's device> — a parameter's, "
                          "the batch's, context().device — or device=\"cpu\" for a count, flag or timing sent "
                          "over gloo; see docs/architecture.md, \"Devices and back-ends\"):\n  " + "\n  ".join(unplaced))
    stale = set(HOST_ONLY) - used
    assert not stale, f"HOST_ONLY entries that match no device-less factory any more (remove them): {sorted(stale)}"


def test_the_scan_sees_what_it_should():
    """The scanner itself: a device-less factory is reported, a named or moved one is not."""
    import tempfile

    source = ("import torch\n"
              "def f(x):\n"
              "    a = torch.zeros(3)\n"                        # reported
              "    b = torch.zeros(3, device=x.device)\n"       # named
              "    c = torch.randint(0, 5, (2,)).to(x.device)\n"  # moved at once
              "    d = torch.zeros_like(x)\n"                   # derived: not a factory
              "    return a, b, c, d\n"
              "class K:\n"
              "    def g(self):\n"
              "        return torch.tensor([1.0])\n")          # reported, in K.g
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "m.py"
        path.write_text(source)
        found = [(scope, factory, placed) for scope, _, factory, placed in factory_calls(path)]
    assert found == [("f", "zeros", False), ("f", "zeros", True), ("f", "randint", True), ("K.g", "tensor", False)]
