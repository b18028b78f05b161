"""Repository-wide pytest set-up: markers from the one table of keys, longer time limits for notebooks,
a fast path for selecting assignments (``pytest -k a5_1_1``), a failed rank's error shown first, and ranks
reused between tests (:mod:`course.launch_pool`; a test marked ``fresh_processes`` gets processes of its own)."""
import re
from functools import lru_cache
from pathlib import Path

import pytest

from course.blocks import marked_spans
from course.tree import check_tree
from instructor.keys import KEYS, marker_lines

ROOT = Path(__file__).resolve().parent
NOTEBOOK_TIMEOUT_S = 900  # a whole notebook, executed top to bottom on 2 CPU cores
_KEY = r"a5_\d+_\d+"
_ONLY_KEYS = re.compile(rf"^[\s()]*({_KEY})([\s()]+or[\s()]+{_KEY})*[\s()]*$")


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
    # from full runs (project/tools/execute_notebooks.py).
    from course.notebook_run import QUICK_ENV

    os.environ.setdefault(QUICK_ENV, "1")
    config.addinivalue_line("markers", "fresh_processes: the test's runs start processes of their own (launcher "
                                       "tests: kills, hangs, restarts, process counts) instead of reusing pooled ranks")
    from course import launch_pool
    from course.launch import start_fork_server

    launch_pool.enable()
    if not config.option.collectonly:  # its imports (torch, GPT-2) overlap collection; ranks are forked from it
        start_fork_server()


def pytest_unconfigure(config):
    from course import launch_pool
    from course.launch import stop_fork_server

    launch_pool.shutdown()
    stop_fork_server()


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
            keys = set(re.findall(_KEY, expr))
            if keys <= set(KEYS):
                return keys
    return None


def may_hold_tests_of(path: Path, keys: set[str]) -> bool:
    """Whether the test file ``path`` can hold a test marked with one of ``keys``: its text names
    the marker (``pytest.mark.a5_1_1``, module-level ``pytestmark`` included). Test files, classes
    and tests never carry a key in their names (tests/instructor/test_selection.py checks both)."""
    text = path.read_text(encoding="utf-8")
    return any(f"mark.{k}" in text for k in keys)


def pytest_ignore_collect(collection_path, config):
    """With only keys selected, skip the notebooks and every test file that holds none of their tests,
    instead of importing them all and deselecting (grading a key collects only that key's tests)."""
    keys = selected_keys(config)
    if keys is None or collection_path.is_dir():
        return None
    if collection_path.suffix == ".ipynb":
        return True
    if collection_path.suffix == ".py" and collection_path.name.startswith("test_"):
        if not may_hold_tests_of(collection_path, keys):
            return True
    return None


class NotebookFile(pytest.File):
    """A notebook collected as one test: it must run top to bottom (``notebooks/*.ipynb``)."""

    def collect(self):
        yield NotebookItem.from_parent(self, name=self.path.name)


class NotebookItem(pytest.Item):
    """Runs the notebook in a Jupyter kernel (:func:`course.notebook_run.execute`, nbclient); fails with the
    failing cell's source and error, or when a cell tagged ``deterministic`` no longer prints its committed
    numbers (:func:`project.tools.check_notebooks.stale_values`)."""

    def runtest(self):
        import json

        from course.notebook_run import execute
        from project.tools.check_notebooks import stale_values

        fresh = execute(self.path, timeout=NOTEBOOK_TIMEOUT_S)
        # cells tagged "deterministic" must print what their committed outputs say (project/tools/check_notebooks.py)
        stale = stale_values(json.loads(self.path.read_text(encoding="utf-8")), fresh, self.path.name)
        assert not stale, "\n".join(map(str, stale))

    def repr_failure(self, excinfo):
        from nbclient.exceptions import CellExecutionError, CellTimeoutError

        if isinstance(excinfo.value, (CellExecutionError, CellTimeoutError)):
            return f"{self.path.name}: a cell failed\n" + re.sub(r"\x1b\[[0-9;]*m", "", str(excinfo.value))
        return super().repr_failure(excinfo)

    def reportinfo(self):
        return self.path, 0, f"notebook {self.path.name}"


def pytest_collect_file(file_path, parent):
    if file_path.suffix == ".ipynb" and ".ipynb_checkpoints" not in file_path.parts:
        return NotebookFile.from_parent(parent, path=file_path)
    return None


def pytest_collection_modifyitems(items):
    for item in items:
        if str(item.path).endswith(".ipynb"):
            item.add_marker(pytest.mark.timeout(NOTEBOOK_TIMEOUT_S))


# ---- a failed rank, as the student needs to see it ----------------------------------------------------

_FRAME = re.compile(r'^\s*File "([^"]+)", line (\d+), in (\S+)\s*$')


@lru_cache(maxsize=None)
def _block_lines(path: str) -> tuple[tuple[int, int], ...]:
    """1-based (first, last) lines between the assignment markers of the file ``path`` (none if not ours)."""
    try:
        if not Path(path).resolve().is_relative_to(ROOT):
            return ()
        lines = Path(path).read_text(encoding="utf-8").split("\n")
    except (OSError, UnicodeDecodeError):
        return ()
    return tuple((block.begin + 2, block.end) for block in marked_spans(lines))


def rank_failure_summary(message: str) -> str:
    """The first lines a student reads when a launched rank failed: which rank raised what, and the
    line of the assignment code (between the markers) it was in — else the innermost line of the
    course's code outside the launcher and the tests."""
    lines = message.split("\n")
    head = lines[0].rstrip(":")
    frames = [(m.group(1), int(m.group(2)), m.group(3), i) for i, line in enumerate(lines) if (m := _FRAME.match(line))]
    last = max((i for *_, i in frames), default=-1)
    error = next((line.strip() for line in lines[last + 2:] if line.strip() and not line.startswith(" ")), "")
    if not error and last >= 0:
        error = next((line.strip() for line in lines[last + 1:] if line.strip() and not line.startswith("    ")), "")

    def code_at(path, line):
        try:
            return Path(path).read_text(encoding="utf-8").split("\n")[line - 1].strip()
        except (OSError, IndexError, UnicodeDecodeError):
            return ""

    def shown(path):
        try:
            return str(Path(path).resolve().relative_to(ROOT))
        except ValueError:
            return path

    ours = [(p, n, f) for p, n, f, _ in frames if any(lo <= n <= hi for lo, hi in _block_lines(p))]
    course = [(p, n, f) for p, n, f, _ in frames
              if Path(p).resolve().is_relative_to(ROOT) and not shown(p).startswith(("tests/", "course/launch.py"))]
    where = ours[-1] if ours else course[-1] if course else None
    summary = [f"{head}: {error}" if error else head]
    if where:
        label = "your code" if ours else "in"
        summary.append(f"  {label}: {shown(where[0])}:{where[1]} in {where[2]}")
        text = code_at(where[0], where[1])
        if text:
            summary.append(f"      {text}")
    return "\n".join(summary)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """A test failed because a launched rank failed (``course.launch.RankFailure``): the report starts
    with the rank's error and the line of the student's code, then the rank's own traceback and where
    the other ranks were — not the launcher's source, which is what pytest would show first."""
    outcome = yield
    report = outcome.get_result()
    excinfo = call.excinfo
    if excinfo is None or not report.failed or excinfo.typename != "RankFailure":
        return
    message = str(excinfo.value)
    tests = [e for e in excinfo.traceback if Path(str(e.path)).resolve().is_relative_to(ROOT / "tests")]
    support = ROOT / "tests" / "support"
    entry = next((e for e in reversed(tests) if not Path(str(e.path)).resolve().is_relative_to(support)),
                 tests[-1] if tests else None)
    launched = f"\n\n(the ranks were launched by {Path(str(entry.path)).relative_to(ROOT)}:{entry.lineno + 1})" \
        if entry is not None else ""
    report.longrepr = f"{rank_failure_summary(message)}\n\n{message}{launched}"
