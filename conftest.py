"""Repository-wide pytest set-up: markers from the one table of keys, longer time limits for notebooks,
a fast path for selecting assignments (``pytest -k a5_1_1``), and ranks reused between tests
(:mod:`course.launch_pool`; a test marked ``fresh_processes`` gets processes of its own)."""
import re
from pathlib import Path

import pytest

from course.tree import check_tree
from instructor.keys import KEYS, marker_lines

NOTEBOOK_TIMEOUT_S = 900  # a whole notebook, executed top to bottom on 2 CPU cores
_ONLY_KEYS = re.compile(r"^[\s()]*(a5_\d+_\d+)([\s()]+or[\s()]+a5_\d+_\d+)*[\s()]*$")


def pytest_configure(config):
    try:  # the tests of this checkout test this checkout's packages, not another copy's
        check_tree(Path(__file__).parent)
    except RuntimeError as exc:
        raise pytest.UsageError(str(exc)) from None
    for line in marker_lines():
        config.addinivalue_line("markers", line)
    # The GPU tier (tests/gpu: NCCL on CUDA GPUs against gloo) runs with `pytest -m gpu` only (tests/gpu/conftest.py).
    config.addinivalue_line("markers", "gpu: the GPU tier, NCCL on CUDA GPUs (run with pytest -m gpu)")
    # Every process the tests start — launcher workers, run scripts, notebook kernels — takes --device auto
    # as the CPU (course/launch.py, resolve_device_backend): the suite runs the same on a GPU machine.
    import os

    os.environ["LLMSYS_DEVICE"] = "cpu"
    # The notebooks run with their quick sizes here (course/notebook_run.py); their committed outputs come
    # from full runs (project/execute_notebooks.py).
    from course.notebook_run import QUICK_ENV

    os.environ.setdefault(QUICK_ENV, "1")
    config.addinivalue_line("markers", "fresh_processes: the test's runs start processes of their own (launcher "
                                       "tests: kills, hangs, restarts, process counts) instead of reusing pooled ranks")
    from course import launch_pool

    launch_pool.enable()


def pytest_unconfigure(config):
    from course import launch_pool

    launch_pool.shutdown()


@pytest.fixture(autouse=True)
def _pooled_or_fresh_processes(request):
    """Runs of a test marked ``fresh_processes`` start their own processes; others reuse pooled ranks."""
    from course import launch_pool

    if request.node.get_closest_marker("fresh_processes") is None:
        yield
        return
    with launch_pool.disabled():
        yield


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


def pytest_collection_modifyitems(items):
    for item in items:
        if str(item.path).endswith(".ipynb"):
            item.add_marker(pytest.mark.timeout(NOTEBOOK_TIMEOUT_S))
