"""Repository-wide pytest set-up: markers from the one table of keys, longer time limits for notebooks,
a fast path for selecting assignments (``pytest -k a5_1_1``), workers pinned to the CPU, and the GPU tier.

* ``LLMSYS_DEVICE=cpu``: what ``--device auto`` means for every process the tests start (launcher
  workers, run scripts, notebook kernels), so the default suite runs on CPU with gloo — the same on a
  GPU machine (course/launch.py, ``resolve_device_backend``).
* ``pytest -m gpu`` runs the GPU tier (``tests/gpu``: NCCL against gloo); without ``gpu`` in ``-m`` its
  tests are deselected.
"""
import os
import re
from pathlib import Path

import pytest

from course.tree import check_tree
from instructor.keys import KEYS, marker_lines

NOTEBOOK_TIMEOUT_S = 900  # a whole notebook, executed top to bottom on 2 CPU cores
GPU_MARKER = "gpu"
os.environ["LLMSYS_DEVICE"] = "cpu"  # before any test imports the launcher or starts a process
_ONLY_KEYS = re.compile(r"^[\s()]*(a5_\d+_\d+)([\s()]+or[\s()]+a5_\d+_\d+)*[\s()]*$")


def pytest_configure(config):
    try:  # the tests of this checkout test this checkout's packages, not another copy's
        check_tree(Path(__file__).parent)
    except RuntimeError as exc:
        raise pytest.UsageError(str(exc)) from None
    for line in marker_lines():
        config.addinivalue_line("markers", line)
    config.addinivalue_line("markers", f"{GPU_MARKER}: the GPU tier, NCCL on CUDA GPUs (run with pytest -m gpu)")


def selected_keys(config) -> set[str] | None:
    """The keys asked for with ``-k``/``-m`` when the expression is nothing but keys joined by ``or``
    (e.g. ``-k a5_1_1``, ``-m "a5_2_1 or a5_2_2"``); None otherwise."""
    for expr in (config.getoption("keyword", ""), config.getoption("markexpr", "")):
        if expr and _ONLY_KEYS.match(expr):
            keys = set(re.findall(r"a5_\d+_\d+", expr))
            if keys <= set(KEYS):
                return keys
    return None


def pytest_ignore_collect(collection_path, config):
    """With only keys selected, skip the notebooks and every test file that holds none of their tests,
    instead of importing them all and deselecting (grading a key collects only that key's tests)."""
    keys = selected_keys(config)
    if keys is None or collection_path.is_dir():
        return None
    if collection_path.suffix == ".ipynb":
        return True
    if collection_path.suffix == ".py" and collection_path.name.startswith("test_"):
        text = collection_path.read_text(encoding="utf-8")
        if not any(f"mark.{k}" in text or k in collection_path.name for k in keys):
            return True
    return None


def pytest_collection_modifyitems(config, items):
    for item in items:
        if str(item.path).endswith(".ipynb"):
            item.add_marker(pytest.mark.timeout(NOTEBOOK_TIMEOUT_S))
    if re.search(rf"\b{GPU_MARKER}\b", config.getoption("markexpr", "") or ""):
        return  # -m gpu (or an expression naming it): the marker expression selects
    gpu = [item for item in items if item.get_closest_marker(GPU_MARKER)]
    if gpu:  # the default run leaves the GPU tier out
        config.hook.pytest_deselected(items=gpu)
        items[:] = [item for item in items if not item.get_closest_marker(GPU_MARKER)]
