"""The grader against hostile submissions (instructor-only; not shipped to students).

Each submission is a copy of the reference solution with attacks planted in some keys' blocks
and in files the grader must ignore. It is graded by the real command line
(``instructor/grade.py --submission ...``) and must score **zero on every attacked key**, full
marks on the untouched keys, and leave no process behind:

* files outside the blocks: a ``conftest.py`` that rewrites every report to "passed" and ends
  pytest early with ``os._exit(0)`` after writing a passing JUnit report; test files with their
  assertions removed; module-level code that patches pytest when the module is imported;
* code in blocks: a fake pytest summary followed by ``os._exit(0)``; sleeping forever; patching
  pytest's ``TestReport``; starting a child that leaves the session and would outlive the run;
  rewriting another key's test files, or its own, on disk. The block policy refuses every one of
  them before anything runs (checked first); the walls behind it are then tried with the policy
  switched off (``--skip_policy``).

The Gradescope bundle is built and run on the reference and on the student release.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
import time
import zipfile
from pathlib import Path

import pytest

from instructor.keys import KEYS
from instructor.blocks import course_files, find_blocks
from instructor.release import make_release
from instructor.submission import marker_files

REPO = Path(__file__).resolve().parents[2]
GRADER = REPO / "instructor" / "grade.py"
# An untouched key graded beside the attacked ones, which must keep its full marks: one that depends on
# none of them and is quick to grade (mesh rank arithmetic, ~1 s of tests).
HONEST = "a5_6_1"
assert not KEYS[HONEST].depends_on


def make_submission(out: Path, blocks: dict[str, str], files: dict[str, str] | None = None) -> Path:
    """A copy of the reference with the first block of each key in ``blocks`` replaced by that code,
    and ``files`` (relative path -> text) written over it."""
    for name in course_files(REPO):
        (out / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / name, out / name)
    for key, code in blocks.items():
        path = out / marker_files(REPO, key)[0]
        lines = path.read_text().split("\n")
        block = [b for b in find_blocks(lines, str(path)) if b.marker == KEYS[key].marker][0]
        body = [block.indent + line if line else line for line in textwrap.dedent(code).strip("\n").split("\n")]
        lines[block.begin + 1:block.end] = body
        path.write_text("\n".join(lines))
    for name, text in (files or {}).items():
        (out / name).parent.mkdir(parents=True, exist_ok=True)
        (out / name).write_text(textwrap.dedent(text))
    return out


def grade(submission: Path, keys: list[str], tmp: Path, timeout: float = 300, policy: bool = True) -> dict[str, dict]:
    """Grade with the command line; ``{key: Gradescope test entry}``. ``policy=False`` switches the block
    policy off, to try the walls behind it (every attack here is also refused by the policy)."""
    out = tmp / "results.json"
    done = subprocess.run([sys.executable, str(GRADER), "--submission", str(submission), "--keys", *keys,
                           "--json", str(out), "--timeout", str(timeout), *([] if policy else ["--skip_policy"])],
                          capture_output=True, text=True, timeout=timeout * len(keys) + 180)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return {t["name"].split(":")[0]: t for t in json.loads(out.read_text())["tests"]}


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    state = Path(f"/proc/{pid}/stat")
    return not (state.is_file() and ") Z " in state.read_text())


HOSTILE_FILES = {
    # A conftest that rewrites every report to "passed", writes a passing JUnit report and leaves early.
    "conftest.py": '''
        import os, pytest
        @pytest.hookimpl(hookwrapper=True)
        def pytest_runtest_makereport(item, call):
            outcome = yield
            outcome.get_result().outcome = "passed"
        def pytest_sessionfinish(session, exitstatus):
            open("report.xml", "w").write('<testsuite tests="99" failures="0"/>')
            os._exit(0)
    ''',
    # A key's tests with the assertions removed.
    "tests/data_parallel/test_partition.py": "def test_nothing():\n    pass\n",
    "tests/pipeline/test_clock_cycles_and_split.py": "import pytest\n\n@pytest.mark.a5_2_1\ndef test_nothing():\n    pass\n",
    "pyproject.toml": "[tool.pytest.ini_options]\naddopts = '-p no:terminal'\n",
}


@pytest.mark.timeout(900)
def test_attacks_in_blocks_and_files_score_zero_and_leave_no_process(tmp_path):
    pid_file = tmp_path / "escaped.pid"
    blocks = {
        # a fake pytest summary, then an exit before pytest can report
        "a5_1_1": 'print("=========== 17 passed in 0.01s ===========", flush=True)\nimport os\nos._exit(0)',
        # sleeps forever
        "a5_2_1": "import time\ntime.sleep(3600)",
        # patches pytest's report objects so that every report says "passed"
        "a5_2_2": '''
            import _pytest.reports as _reports
            _init = _reports.TestReport.__init__
            def _forced(self, *args, **kwargs):
                _init(self, *args, **kwargs)
                self.outcome = "passed"
            _reports.TestReport.__init__ = _forced
            raise NotImplementedError("not done")
        ''',
        # starts a child in a session of its own, without the grader's environment, that would outlive the run
        # (gpipe_actions: the first 5.2.4 block)
        "a5_2_4": f'''
            import os, subprocess, sys
            if not os.path.exists({str(pid_file)!r}):
                subprocess.Popen([sys.executable, "-c", "import os, time; open({str(pid_file)!r}, 'a').write(str(os.getpid()) + chr(10)); time.sleep(900)"],
                                 start_new_session=True, env={{"PATH": os.environ.get("PATH", "")}})
            raise NotImplementedError("not done")
        ''',
    }
    files = dict(HOSTILE_FILES)
    # module-level code outside the blocks that patches pytest when imported: not taken from the submission
    files["data_parallel/gradients.py"] = ((REPO / "data_parallel/gradients.py").read_text()
                                           + "\nimport _pytest.reports\n_pytest.reports.TestReport.outcome = 'passed'\n")
    submission = make_submission(tmp_path / "submission", blocks, files)
    # with the block policy on, every attack that reaches outside is refused before anything runs (sleeping
    # does not reach outside: the time limit is what stops it)
    refused = grade(submission, ["a5_1_1", "a5_2_2", "a5_2_4"], tmp_path)
    for key, result in refused.items():
        assert result["score"] == 0 and "breaks the block policy" in result["output"], (key, result["output"])
    # the walls behind the policy: the sleeper alone with a short limit (no honest key shares it) ...
    slept = grade(submission, ["a5_2_1"], tmp_path, timeout=10, policy=False)["a5_2_1"]
    assert slept["score"] == 0 and "timed out after 10 s" in slept["output"], slept["output"]
    # ... the others with the grader's own limit
    results = grade(submission, ["a5_1_1", "a5_2_2", "a5_2_4", HONEST], tmp_path, policy=False)
    for key in ("a5_1_1", "a5_2_2"):
        assert results[key]["score"] == 0, f"{key} was attacked and scored {results[key]['score']}"
    # a5_2_4's attack sits in gpipe_actions only: its GPipe tests fail, its 1F1B tests (reference code) pass
    assert 0 < results["a5_2_4"]["score"] < results["a5_2_4"]["max_score"], results["a5_2_4"]
    assert "without the grader's complete session record" in results["a5_1_1"]["output"]
    assert "NotImplementedError" in results["a5_2_2"]["output"] or "patched" in results["a5_2_2"]["output"]
    assert results[HONEST]["score"] == results[HONEST]["max_score"], results[HONEST]["output"]
    deadline = time.monotonic() + 10
    while not pid_file.is_file() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert pid_file.is_file(), "the planted child never started"
    pids = [int(line) for line in pid_file.read_text().split()]
    deadline = time.monotonic() + 10
    while any(alive(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not any(alive(pid) for pid in pids), "a process the submission started outlived the grading"


@pytest.mark.timeout(300)
def test_rewriting_test_files_on_disk_scores_zero_for_the_key_that_did_it(tmp_path):
    blocks = {
        # correct code, but it rewrites another key's tests ...
        "a5_1_1": '''
            from pathlib import Path
            target = Path(__file__).resolve().parents[1] / "tests" / "data_parallel" / "test_gradients.py"
            target.write_text("def test_ok():\\n    pass\\n")
            return self.data[self.index[i]]
        ''',
        # ... and correct code that rewrites its own key's tests
        "a5_2_1": '''
            from pathlib import Path
            (Path(__file__).resolve().parents[1] / "tests" / "pipeline" / "test_clock_cycles_and_split.py").write_text("")
            for k in range(m + n - 1):
                yield [(k - j, j) for j in range(max(0, k - m + 1), min(k + 1, n))]
        ''',
    }
    # the first a5_1_1 block is Partition.__len__; put the attack in __getitem__'s (the second) instead
    submission = make_submission(tmp_path / "submission", {"a5_2_1": blocks["a5_2_1"]})
    path = submission / "data_parallel" / "partition.py"
    lines = path.read_text().split("\n")
    getitem = [b for b in find_blocks(lines, str(path)) if b.marker == "ASSIGN5_1_1"][1]
    lines[getitem.begin + 1:getitem.end] = [getitem.indent + line for line in
                                           textwrap.dedent(blocks["a5_1_1"]).strip("\n").split("\n")]
    path.write_text("\n".join(lines))
    results = grade(submission, ["a5_1_1", "a5_2_1", HONEST], tmp_path, policy=False)  # pathlib: refused
    for key in ("a5_1_1", "a5_2_1"):
        assert results[key]["score"] == 0 and "changed while the tests ran" in results[key]["output"], results[key]
    assert results[HONEST]["score"] == results[HONEST]["max_score"], results[HONEST]["output"]
    assert (REPO / "tests" / "data_parallel" / "test_gradients.py").read_text().count("def test_") >= 2, "the repo was touched"


@pytest.mark.timeout(300)
def test_feedback_shows_the_full_stub_message_and_the_students_line(tmp_path):
    release = tmp_path / "release"
    make_release(REPO, release)
    results = grade(release, ["a5_1_2"], tmp_path)
    output = results["a5_1_2"]["output"]
    assert results["a5_1_2"]["score"] == 0
    assert ("NotImplementedError: Assignment 5.1.2: implement average_gradients (process group set-up and all-reduce "
            "gradient averaging). See notebooks/01_data_parallel.ipynb; check with: pytest -k a5_1_2") in output
    assert "your code: data_parallel/gradients.py:" in output
    assert (tmp_path / "grading_logs" / "a5_1_2.txt").is_file(), "the full tracebacks go to a file"


@pytest.mark.timeout(400)
def test_gradescope_bundle_grades_the_reference_and_the_release(tmp_path):
    from instructor.gradescope import build_bundle

    bundle = build_bundle(tmp_path / "autograder.zip")
    with zipfile.ZipFile(bundle) as z:
        names = set(z.namelist())
    assert {"setup.sh", "run_autograder", "source/instructor/grade.py", "source/tests/data_parallel/test_partition.py"} <= names
    assert any(n.startswith("source/data/multi30k/") for n in names), "the bundle carries the data (no network)"
    for label, make in (("reference", lambda d: make_submission(d, {})), ("release", lambda d: make_release(REPO, d))):
        root = tmp_path / label / "autograder"
        with zipfile.ZipFile(bundle) as z:
            z.extractall(root)
        submission = root / "submission"
        make(submission)
        (root / "results").mkdir()
        env = dict(os.environ, AUTOGRADER_ROOT=str(root), GRADE_KEYS="a5_1_1 a5_2_1", PYTHON=sys.executable,
                   GRADE_PERFORMANCE="0")  # the performance keys: test_performance.py
        done = subprocess.run(["bash", str(root / "run_autograder")], env=env, capture_output=True, text=True,
                              timeout=300)
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
        payload = json.loads((root / "results" / "results.json").read_text())
        assert payload["score"] == (20 if label == "reference" else 0), (label, payload)


@pytest.mark.timeout(300)
def test_a_deadlocked_ring_fails_its_key_fast_and_is_named_a_deadlock(tmp_path):
    """A student's ring all-reduce in which every rank receives before it sends (the honest mistake that
    once cost 266 s over 7 relaunches): one launch, each rank's wait ends after the graded collective timeout,
    and the student reads that every rank was waiting for another (a deadlock), with where each one waited."""
    from tests.support.launching import GRADED_COLLECTIVE_TIMEOUT

    honest = "incoming = send_recv(chunks[send_c].contiguous(), right, torch.empty_like(chunks[recv_c]), left, group)"
    text = (REPO / "communication" / "ring.py").read_text()
    assert text.count(honest) == 1, "the ring's exchange line moved: update this test"
    indent = text.split(honest)[0].rsplit("\n", 1)[1]
    receive_first = (f"incoming = recv(torch.empty_like(chunks[recv_c]), left, group)\n"
                     f"{indent}isend(chunks[send_c].contiguous(), right, group).wait()")
    submission = make_submission(tmp_path / "submission", {},
                                 {"communication/ring.py": text.replace(honest, receive_first)})
    start = time.monotonic()
    result = grade(submission, ["a5_4_1"], tmp_path)["a5_4_1"]
    elapsed = time.monotonic() - start
    assert result["score"] < result["max_score"], result["output"]
    assert "all timed out waiting" in result["output"] and "a deadlock" in result["output"], result["output"][:3000]
    assert "your code: communication/ring.py:" in result["output"], result["output"][:3000]
    # one launch of the ring's cases, not one per test: a few collective timeouts, not seven relaunches
    assert elapsed < 8 * GRADED_COLLECTIVE_TIMEOUT + 60, f"the deadlocked key took {elapsed:.0f} s to grade"
