"""Grade a submission key by key, trusting nothing in it but the student's code.

    python instructor/grade.py                                  # grade this tree (the reference: full marks)
    python instructor/grade.py --submission ../alice            # grade Alice's copy of the course
    python instructor/grade.py --submission ../alice --keys a5_1_1 a5_1_2 --json results.json

**What a submission is**: the code between the BEGIN and END marker lines of each assignment
block (``ASSIGN5_x_y``) of the files that hold blocks (:mod:`instructor.submission`). Nothing
else is read.

**How a key is graded**: in a fresh copy of *this* (the instructor's) tree, in which only that
key's blocks hold the submission's code (the other keys keep the reference solution), pytest
runs the key's tests from this tree with this tree's ``conftest.py`` and ``pyproject.toml``,
in a process session of its own, with a time limit. Its results come only from the grader's
pytest plugin (:mod:`instructor.grading_plugin`), which writes them to a file outside the copy.
The key scores ``points × passed / expected``, where the expected tests are those this tree's
own collection lists for the key (a missing test counts as failed), and **zero** when:

* the pytest process ended without the plugin's complete session record (``os._exit``, a
  kill, a crash; printed summary lines are never read, so a forged one counts for nothing),
* it ran past the time limit (a block that sleeps or hangs in a collective),
* the test files, ``conftest.py``, ``pyproject.toml`` or the instructor tools in the copy
  changed while it ran, or the plugin saw pytest's reporting internals patched,
* the key's blocks cannot be taken from the submission (missing file or block, code that
  does not parse).

After each key every process it started is ended — also those that left its session: the
grader makes itself the "child subreaper" of its descendants (Linux ``prctl``), so orphans
are re-parented to it, and kills every process that carries the key's run id in its
environment or descends from the grader.

**Threat model.** Defended: the submission's tests, conftest, configuration, reports and
plugins (none of them is used); edits to test or config files during a run (detected);
code in one key's blocks affecting another key (it never runs there); early exits, hangs,
forged output, processes left behind; patching pytest's report objects or ``CallInfo``
(detected). *Not* defended: the student's code runs with the grader's rights and in the same
process as pytest, so a determined attacker can read the grader's files (including the
reference solutions of the other keys in the copy) or subvert the plugin from inside the
process. Run the grader inside the throw-away container the autograding service provides
(Gradescope: :mod:`instructor.gradescope` builds the bundle), never on a machine with
anything to protect, and review submissions flagged for tampering.

**Feedback**: per failed test its name, the exception or assertion message in full (the
``NotImplementedError("Assignment 5.x.y: ...")`` text included), and the first line of the
student's own code in the traceback; the full tracebacks go to ``--log_dir``. The same text is
in the Gradescope ``results.json`` (``--json``).
"""
from __future__ import annotations

import argparse
import ctypes
import hashlib
import json
import os
import secrets
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if __name__ == "__main__":  # run as a file: import the packages of the tree this script sits in
    sys.path.insert(0, str(ROOT))

from instructor.keys import KEYS  # noqa: E402
from instructor.submission import SubmissionError, grading_tree, submission_root  # noqa: E402

RUN_ID_VAR = "LLMSYS_GRADE_RUN"
GUARDED = ("tests", "conftest.py", "pyproject.toml", "instructor")  # must not change during a key's run


@dataclass
class TestFeedback:
    name: str
    message: str
    student_line: str = ""


@dataclass
class KeyResult:
    key: str
    topic: str
    passed: int
    total: int
    points: float
    max_points: int
    seconds: float
    output: str
    failures: list = field(default_factory=list)  # TestFeedback of each test that did not pass


# ---- processes --------------------------------------------------------------------------------

_SUBREAPER = {"on": False}


def become_subreaper() -> bool:
    """Ask Linux to re-parent our orphaned descendants to us (``PR_SET_CHILD_SUBREAPER``).

    From then on :func:`kill_leftovers` also kills every descendant of this process, so call it
    only in a process that exists to grade (the command line), not inside a test session.
    """
    try:
        _SUBREAPER["on"] = ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        _SUBREAPER["on"] = False
    return _SUBREAPER["on"]


def _processes() -> dict[int, tuple[int, bytes]]:
    """``{pid: (parent pid, environment)}`` of every process we can see (Linux ``/proc``)."""
    found = {}
    for entry in Path("/proc").iterdir() if Path("/proc").is_dir() else []:
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            ppid = int(stat[stat.rindex(")") + 2:].split()[1])
            env = (entry / "environ").read_bytes()
        except (OSError, ValueError):
            continue
        found[int(entry.name)] = (ppid, env)
    return found


def kill_leftovers(run_id: str) -> list[int]:
    """Kill every process of a key's run: those with its run id in their environment and, once
    :func:`become_subreaper` was called, every descendant of the grader. Returns the pids killed."""
    me = os.getpid()
    procs = _processes()
    doomed = {pid for pid, (_, env) in procs.items() if f"{RUN_ID_VAR}={run_id}".encode() in env and pid != me}
    children: dict[int, list[int]] = {}
    for pid, (ppid, _) in procs.items():
        children.setdefault(ppid, []).append(pid)
    todo = list(children.get(me, [])) if _SUBREAPER["on"] else []
    while todo:
        pid = todo.pop()
        doomed.add(pid)
        todo += children.get(pid, [])
    for pid in doomed:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:  # reap what became our children
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            break
        if pid == 0:
            if not any(p in _processes() for p in doomed):
                break
            time.sleep(0.05)
    return sorted(doomed)


# ---- one key ------------------------------------------------------------------------------------

def _digest(root: Path) -> str:
    h = hashlib.sha256()
    for name in GUARDED:
        path = root / name
        files = sorted(p for p in path.rglob("*") if p.is_file() and "__pycache__" not in p.parts) if path.is_dir() \
            else [path] if path.is_file() else []
        for f in files:
            h.update(str(f.relative_to(root)).encode())
            h.update(f.read_bytes())
    return h.hexdigest()


def expected_tests(root: Path, keys: list[str], timeout: float = 300) -> dict[str, list[str]]:
    """The node ids of each key's tests in the tree ``root`` (one collection run, with the plugin).

    Raises:
        RuntimeError: the collection did not complete.
    """
    with tempfile.TemporaryDirectory() as tmp:
        records = _run_pytest(root, " or ".join(keys), Path(tmp) / "collect.jsonl", timeout, extra=["--collect-only"])
    finish = records["finish"]
    if not finish:
        raise RuntimeError(f"collecting the graded tests in {root} failed:\n{records['output'][-2000:]}")
    return {k: [n for n in finish["collected"] if k in finish["markers"].get(n, [])] for k in keys}


def _run_pytest(tree: Path, marker_expr: str, record: Path, timeout: float, extra=(), run_id: str | None = None):
    """Run pytest on ``tree``'s tests for ``marker_expr`` with the grading plugin; return the record.

    Returns ``{"start": {...}, "finish": {...}, "timed_out": bool, "output": str}``; ``finish``
    is None unless the session record is complete and carries the nonce.
    """
    nonce = secrets.token_hex(16)
    run_id = run_id or secrets.token_hex(8)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "LLMSYS_GRADE"))}
    env.update(PYTHONPATH=str(tree), PYTHONDONTWRITEBYTECODE="1", PYTEST_DISABLE_PLUGIN_AUTOLOAD="1",
               LLMSYS_GRADE_RECORD=str(record), LLMSYS_GRADE_NONCE=nonce, **{RUN_ID_VAR: run_id})
    try:
        from course.data import resolve_data_dir

        env["LLMSYS_DATA_DIR"] = str(resolve_data_dir())
    except Exception:  # noqa: BLE001 - the tests that need data will say so
        pass
    cmd = [sys.executable, "-m", "pytest", "-p", "instructor.grading_plugin", "-p", "pytest_timeout",
           "-p", "no:cacheprovider", "-o", "addopts=", "-q", "-m", marker_expr, "--rootdir", str(tree),
           "-c", str(tree / "pyproject.toml"), *extra, "tests"]
    proc = subprocess.Popen(cmd, cwd=tree, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    timed_out = False
    try:
        output, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        timed_out = True
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        output, _ = proc.communicate()
    finally:
        kill_leftovers(run_id)
    out = {"start": None, "finish": None, "timed_out": timed_out, "output": output or ""}
    if record.is_file():
        for line in record.read_text(encoding="utf-8", errors="replace").splitlines():
            try:
                event = json.loads(line)
            except json.JSONDecodeError:
                continue
            if event.get("nonce") == nonce and event.get("event") in ("start", "finish"):
                out[event["event"]] = event
    return out


def _student_line(spliced, frames) -> str:
    for path, line in frames:
        if spliced is not None and spliced.is_student_line(path, line):
            source = Path(path) if Path(path).is_absolute() else spliced.root / path
            try:
                text = source.read_text(encoding="utf-8").split("\n")[line - 1].strip()
            except (OSError, IndexError):
                text = ""
            rel = Path(path).resolve().relative_to(spliced.root.resolve()) if Path(path).is_absolute() else path
            return f"{rel}:{line}: {text}"
    return ""


def grade_key(key: str, timeout: float = 600.0, root: Path = ROOT, submission: Path | None = None,
              expected: list[str] | None = None, log_dir: Path | None = None) -> KeyResult:
    """Grade ``key`` of ``submission`` (default: the tree ``root`` itself) against ``root``'s tests."""
    spec = KEYS[key]
    start = time.monotonic()

    def zero(reason: str, failures=()) -> KeyResult:
        return KeyResult(key, spec.topic, 0, len(expected or []), 0.0, spec.points, time.monotonic() - start,
                         reason, list(failures))

    with tempfile.TemporaryDirectory(prefix=f"grade_{key}_") as tmp:
        tmp = Path(tmp)
        try:
            spliced = grading_tree(root, submission_root(submission or root, root), key, tmp / "tree")
        except SubmissionError as exc:
            return zero(f"your code for {spec.number} could not be taken from the submission: {exc}")
        before = _digest(tmp / "tree")
        result = _run_pytest(tmp / "tree", key, tmp / "record.jsonl", timeout)
        if result["timed_out"]:
            return zero(f"timed out after {timeout:.0f} s (a hung worker or an endless loop?); scored 0")
        finish = result["finish"]
        if result["start"] is None or finish is None:
            tail = "\n".join(result["output"].strip().splitlines()[-15:])
            return zero("pytest ended without the grader's complete session record (it exited early, was killed "
                        f"or crashed); scored 0. Last lines it printed:\n{tail}")
        if _digest(tmp / "tree") != before:
            return zero("the tests, conftest.py, pyproject.toml or instructor tools changed while the tests ran; "
                        "scored 0")
        if finish["tampered"]:
            return zero(f"pytest's reporting internals were patched during the run ({', '.join(finish['tampered'])}); "
                        "scored 0")
        tests = finish["tests"]
        wanted = expected if expected is not None else finish["collected"]
        failures, passed, long = [], 0, []
        for nodeid in wanted:
            entry = tests.get(nodeid)
            if nodeid not in finish["collected"]:
                failures.append(TestFeedback(nodeid, "this test was not run"))
            elif entry is not None and (entry["failed"] or entry["skipped"]):
                failures.append(TestFeedback(nodeid, entry["message"], _student_line(spliced, entry["frames"])))
                long.append(f"==== {nodeid} ({entry['when']})\n{entry['longrepr']}\n")
            else:
                passed += 1
        for nodeid, entry in tests.items():  # collection errors are failures too
            if nodeid.endswith("::<collection>"):
                failures.append(TestFeedback(nodeid, entry["message"]))
                long.append(f"==== {nodeid}\n{entry['longrepr']}\n")
        if log_dir is not None and long:
            log_dir.mkdir(parents=True, exist_ok=True)
            (log_dir / f"{key}.txt").write_text("\n".join(long), encoding="utf-8")
    total = len(wanted)
    if total == 0:
        return zero("no tests found for this key")
    if any(f.name.endswith("::<collection>") for f in failures):
        passed = 0
    output = "all tests passed" if not failures else "not passed:\n" + "\n".join(_describe(f) for f in failures)
    return KeyResult(key, spec.topic, passed, total, round(spec.points * passed / total, 2), spec.points,
                     time.monotonic() - start, output, failures)


def _describe(f: TestFeedback) -> str:
    text = f"- {f.name}\n    {f.message.strip().replace(chr(10), chr(10) + '    ')}"
    if f.student_line:
        text += f"\n    your code: {f.student_line}"
    return text


# ---- reports ------------------------------------------------------------------------------------

def gradescope(results: list[KeyResult]) -> dict:
    """The Gradescope autograder ``results.json`` payload: one test entry per key."""
    return {
        "score": round(sum(r.points for r in results), 2),
        "tests": [{"name": f"{r.key}: {r.topic}", "score": r.points, "max_score": r.max_points,
                   "output": f"{r.passed}/{r.total} tests passed in {r.seconds:.0f} s\n{r.output}"}
                  for r in results],
    }


def print_table(results: list[KeyResult]) -> None:
    print(f"{'key':<8} {'topic':<58} {'tests':>7} {'points':>9} {'time':>6}")
    for r in results:
        print(f"{r.key:<8} {r.topic[:58]:<58} {f'{r.passed}/{r.total}':>7} {f'{r.points:g}/{r.max_points}':>9} "
              f"{r.seconds:>5.0f}s")
    total, best = sum(r.points for r in results), sum(r.max_points for r in results)
    print(f"{'total':<8} {'':<58} {'':>7} {f'{total:g}/{best}':>9}")
    for r in results:
        if r.passed < r.total or r.total == 0:
            print(f"\n{r.key}: {r.output}")


def grade(keys: list[str], submission: Path | None = None, timeout: float = 600.0,
          log_dir: Path | None = None, root: Path = ROOT, quiet: bool = False) -> list[KeyResult]:
    """Grade ``keys`` of ``submission`` (None: this tree) key by key (:func:`main`'s work; it makes this
    process the subreaper of everything the keys start, see :func:`become_subreaper`)."""
    become_subreaper()
    expected = expected_tests(root, keys)
    results = []
    for key in keys:
        if not quiet:
            print(f"grading {key} ...", flush=True)
        results.append(grade_key(key, timeout, root, submission, expected[key], log_dir))
    return results


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description="Grade a submission key by key (only the code between the markers "
                                                 "is taken from it).")
    parser.add_argument("--submission", default=None,
                        help="the student's copy of the course (default: this tree, i.e. the reference solution)")
    parser.add_argument("--keys", nargs="+", default=list(KEYS), choices=list(KEYS), metavar="KEY",
                        help="keys to grade (default: all)")
    parser.add_argument("--json", default=None, help="write the Gradescope results.json here")
    parser.add_argument("--log_dir", default=None, help="write each key's full tracebacks here (default: beside --json)")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds allowed per key")
    args = parser.parse_args(argv)
    from course.tree import check_tree

    try:  # the grader's own tree must be the one its packages come from
        check_tree(ROOT)
    except RuntimeError as exc:
        parser.error(str(exc))
    submission = Path(args.submission).resolve() if args.submission else None
    if submission is not None and not submission.is_dir():
        parser.error(f"--submission {submission} is not a folder")
    log_dir = Path(args.log_dir) if args.log_dir else (Path(args.json).resolve().parent / "grading_logs"
                                                        if args.json else None)
    results = grade(args.keys, submission, args.timeout, log_dir)
    print_table(results)
    if args.json:
        Path(args.json).write_text(json.dumps(gradescope(results), indent=2))
        print(f"wrote {args.json}")
    if log_dir is not None and log_dir.is_dir():
        print(f"full tracebacks: {log_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
