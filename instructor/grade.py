"""Grade a submission key by key, trusting nothing in it but the student's code.

    python instructor/grade.py                                  # grade this tree (yours, or the reference)
    python instructor/grade.py --submission ../alice            # grade Alice's copy of the course
    python instructor/grade.py --submission ../alice --keys a5_1_1 a5_1_2 --json results.json

**What a submission is**: the code between the BEGIN and END marker lines of each assignment
block (``ASSIGN5_x_y``) of the files that hold blocks (:mod:`instructor.submission`). Nothing
else is read.

**How a key is graded**:

1. Every submitted block of the key is checked against the block policy
   (:mod:`instructor.policy`: the imports, names and constructs an assignment may use, and that
   the code stays inside its block). A block that breaks a rule scores the key 0 without
   running, with the rule, file and line named, and is listed for the instructor to review.
2. The key's tests run in a fresh copy of *this* (the instructor's) tree in which the key's
   blocks hold the submission's code, the keys it depends on keep their reference solution and
   every other key's block is its stub — no reference solution the key does not need is in the
   copy. Pytest runs the key's tests from this tree with this tree's ``conftest.py`` and
   ``pyproject.toml``, in a process session of its own, with a time limit.
3. The results come only from the grader's pytest plugin (:mod:`instructor.grading_plugin`),
   which writes them to a file outside the copy. The key scores ``points × passed / expected``,
   where the expected tests are those this tree's own collection lists for the key (a missing
   test counts as failed), and **zero** when:

   * the pytest process ended without the plugin's complete session record (``os._exit``, a
     kill, a crash; printed summary lines are never read, so a forged one counts for nothing),
   * it ran past the time limit (a block that sleeps or hangs in a collective),
   * the test files, ``conftest.py``, ``pyproject.toml`` or the instructor tools in the copy
     changed while it ran, or the plugin saw pytest's or torch's internals patched,
   * the key's blocks cannot be taken from the submission (missing file or block, code that
     does not parse) or break the block policy.

4. Every process the key started is ended — also those that left its session: the grader makes
   itself the "child subreaper" of its descendants (Linux ``prctl``), so orphans are re-parented
   to it, and kills every process that carries the key's run id in its environment or descends
   from the grader.

**Feedback**: per failed test its name, the exception or assertion message (up to
:data:`instructor.leaks.FEEDBACK_CHARS` characters; the ``NotImplementedError("Assignment 5.x.y:
...")`` text included), and the first line of the student's own code in the traceback. A message
that quotes a line of reference code — as written or encoded (:mod:`instructor.leaks`) — is
withheld and listed for review. The full tracebacks go to ``--log_dir`` (instructor only), with
``review.txt`` listing what needs a look. The same text is in the Gradescope ``results.json``
(``--json``).

**Performance keys** (optional, ``--performance``): after the correctness keys,
:mod:`instructor.performance` measures the submission's speed as side-by-side ratios against torch's own
implementations and reports them in a section of their own — pass, fail or "not measurable here" (a loaded
machine: not graded, not a zero) — with their own points, apart from the correctness total; in Gradescope's
``results.json`` they are separate tests entries tagged ``performance``.

**Threat model**: docs/grading.md. In short, the walls are the policy, the copy without
unneeded reference code, the checks after the run and the withheld feedback; the student's
code still runs with the grader's user rights, so run the grader only inside a throw-away
container (Gradescope: :mod:`instructor.gradescope` builds the bundle).
"""
from __future__ import annotations

import argparse
import ctypes
import hashlib
import json
import os
import resource
import secrets
import signal
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if __name__ == "__main__":  # run as a file: import the packages of the tree this script sits in
    sys.path.insert(0, str(ROOT))

from course.cli import OptionParser  # noqa: E402
from instructor.keys import KEYS  # noqa: E402
from instructor.leaks import FEEDBACK_CHARS, ReferenceLines  # noqa: E402
from instructor.session import run_in_session  # noqa: E402
from instructor.submission import (PolicyError, SubmissionError, grading_tree, submission_root,  # noqa: E402
                                   submitted_code)

RUN_ID_VAR = "LLMSYS_GRADE_RUN"
DEFAULT_TIMEOUT = 300.0  # seconds per key: above every key's time measured on a loaded machine (docs/grading.md)
WITHHELD = ("this test's message was withheld: it contained course code that is not yours (reference code, "
            "perhaps encoded). Your instructor has been told and will look at it.")
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
    review: list = field(default_factory=list)    # what the instructor should look at (policy, tampering, leaks)
    cpu_seconds: float = 0.0                      # CPU time of the key's pytest and every process it started


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
    try:
        run = run_in_session(cmd, cwd=tree, env=env, timeout=timeout)
    finally:
        kill_leftovers(run_id)
    out = {"start": None, "finish": None, "timed_out": run.timed_out, "output": run.output}
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


def grade_key(key: str, timeout: float = DEFAULT_TIMEOUT, root: Path = ROOT, submission: Path | None = None,
              expected: list[str] | None = None, log_dir: Path | None = None,
              references: ReferenceLines | None = None, enforce_policy: bool = True) -> KeyResult:
    """Grade ``key`` of ``submission`` (default: the tree ``root`` itself) against ``root``'s tests.

    ``references``: the reference lines feedback may not show (default: those of ``root``, less the
    submission's own code). ``enforce_policy=False`` skips the block policy — only for the grader's
    own tests of the walls behind it.
    """
    spec = KEYS[key]
    start = time.monotonic()
    source = submission_root(submission or root, root)
    if references is None:
        references = ReferenceLines.of_tree(root, submitted_code(source, root))

    def zero(reason: str, failures=(), review=()) -> KeyResult:
        return _withheld(KeyResult(key, spec.topic, 0, len(expected or []), 0.0, spec.points,
                                   time.monotonic() - start, reason, list(failures), list(review)), references)

    with tempfile.TemporaryDirectory(prefix=f"grade_{key}_") as tmp:
        tmp = Path(tmp)
        try:
            spliced = grading_tree(root, source, key, tmp / "tree", enforce_policy=enforce_policy)
        except PolicyError as exc:
            return zero(f"your code for {spec.number} breaks the block policy (instructor/policy.py), so it was not "
                        f"run; scored 0:\n{exc}", review=[f"block policy: {exc}"])
        except SubmissionError as exc:
            return zero(f"your code for {spec.number} could not be taken from the submission: {exc}")
        before = _digest(tmp / "tree")
        used = resource.getrusage(resource.RUSAGE_CHILDREN)
        result = _run_pytest(tmp / "tree", key, tmp / "record.jsonl", timeout)
        now = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu = now.ru_utime + now.ru_stime - used.ru_utime - used.ru_stime
        if result["timed_out"]:
            return zero(f"timed out after {timeout:.0f} s (a hung worker or an endless loop?); scored 0")
        finish = result["finish"]
        if result["start"] is None or finish is None:
            tail = "\n".join(result["output"].strip().splitlines()[-15:])
            return zero("pytest ended without the grader's complete session record (it exited early, was killed "
                        f"or crashed); scored 0. Last lines it printed:\n{tail}", review=["incomplete session record"])
        if _digest(tmp / "tree") != before:
            return zero("the tests, conftest.py, pyproject.toml or instructor tools changed while the tests ran; "
                        "scored 0", review=["test or configuration files changed during the run"])
        if finish["tampered"]:
            what = ", ".join(finish["tampered"])
            return zero(f"pytest's or torch's internals were patched during the run ({what}); scored 0",
                        review=[f"tampering: {what}"])
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
        if log_dir is not None and long:  # the instructor's copy: full tracebacks, nothing withheld
            log_dir.mkdir(parents=True, exist_ok=True)
            (log_dir / f"{key}.txt").write_text("\n".join(long), encoding="utf-8")
    total = len(wanted)
    if total == 0:
        return zero("no tests found for this key")
    if any(f.name.endswith("::<collection>") for f in failures):
        passed = 0
    return _withheld(KeyResult(key, spec.topic, passed, total, round(spec.points * passed / total, 2), spec.points,
                               time.monotonic() - start, "", failures, cpu_seconds=cpu), references)


def _withheld(result: KeyResult, references: ReferenceLines) -> KeyResult:
    """``result`` with every message cut to :data:`FEEDBACK_CHARS` and every one that quotes reference code
    (plain or encoded, :mod:`instructor.leaks`) replaced by a notice; its summary ``output`` rebuilt."""
    for f in result.failures:
        message = f.message if len(f.message) <= FEEDBACK_CHARS else \
            f.message[:FEEDBACK_CHARS] + f"\n[... {len(f.message) - FEEDBACK_CHARS} more characters cut]"
        found = references.found_in(message)
        if found:
            result.review.append(f"feedback of {f.name} withheld: it quoted reference code ({found[0]}): {found[1]!r}")
            message = WITHHELD
        f.message = message
    if result.failures:
        result.output = "not passed:\n" + "\n".join(_describe(f) for f in result.failures)
    elif not result.output:
        result.output = "all tests passed"
    else:
        found = references.found_in(result.output[:FEEDBACK_CHARS])
        if found:
            result.review.append(f"a message withheld: it quoted reference code ({found[0]}): {found[1]!r}")
            result.output = f"scored 0; {WITHHELD}"
    return result


def _describe(f: TestFeedback) -> str:
    text = f"- {f.name}\n    {f.message.strip().replace(chr(10), chr(10) + '    ')}"
    if f.student_line:
        text += f"\n    your code: {f.student_line}"
    return text


# ---- reports ------------------------------------------------------------------------------------

def gradescope(results: list[KeyResult], performance: list | None = None) -> dict:
    """The Gradescope autograder ``results.json`` payload: one test entry per key, then (``performance``: the
    :class:`instructor.performance.PerfResult` list) one per performance key, tagged ``performance``, with its
    own ``max_score`` (0 when not measurable here: not graded). ``output`` states the two totals apart."""
    correct, best = round(sum(r.points for r in results), 2), sum(r.max_points for r in results)
    tests = [{"name": f"{r.key}: {r.topic}", "score": r.points, "max_score": r.max_points, "tags": ["correctness"],
              "output": f"{r.passed}/{r.total} tests passed in {r.seconds:.0f} s\n{r.output}"}
             for r in results]
    summary = f"Correctness: {correct:g}/{best} points."
    score = correct
    if performance is not None:
        from instructor.performance import gradescope_tests

        extra = gradescope_tests(performance)
        got = round(sum(t["score"] for t in extra), 2)
        graded = sum(t["max_score"] for t in extra)
        unmeasured = [r.key for r in performance if r.points is None]
        summary += (f" Performance (optional, apart from correctness): {got:g}/{graded} points"
                    + (f"; not measurable here (a loaded machine, not graded): {', '.join(unmeasured)}" if unmeasured
                       else "") + ".")
        tests += extra
        score = round(correct + got, 2)
    return {"score": score, "output": summary, "tests": tests}


def print_table(results: list[KeyResult]) -> None:
    print(f"{'key':<8} {'topic':<52} {'tests':>7} {'points':>9} {'cpu':>6} {'time':>6}")
    for r in results:
        print(f"{r.key:<8} {r.topic[:52]:<52} {f'{r.passed}/{r.total}':>7} {f'{r.points:g}/{r.max_points}':>9} "
              f"{r.cpu_seconds:>5.0f}s {r.seconds:>5.0f}s")
    total, best = sum(r.points for r in results), sum(r.max_points for r in results)
    print(f"{'total':<8} {'':<52} {'':>7} {f'{total:g}/{best}':>9}")
    for r in results:
        if r.passed < r.total or r.total == 0:
            print(f"\n{r.key}: {r.output}")
    flagged = [r for r in results if r.review]
    if flagged:
        print("\nFOR THE INSTRUCTOR TO REVIEW:")
        for r in flagged:
            for note in r.review:
                print(f"  {r.key}: {note}")


def grade(keys: list[str], submission: Path | None = None, timeout: float = DEFAULT_TIMEOUT,
          log_dir: Path | None = None, root: Path = ROOT, quiet: bool = False,
          enforce_policy: bool = True) -> list[KeyResult]:
    """Grade ``keys`` of ``submission`` (None: this tree) key by key (:func:`main`'s work; it makes this
    process the subreaper of everything the keys start, see :func:`become_subreaper`)."""
    become_subreaper()
    expected = expected_tests(root, keys)
    references = ReferenceLines.of_tree(root, submitted_code(submission_root(submission or root, root), root))
    results = []
    for key in keys:
        if not quiet:
            print(f"grading {key} ...", flush=True)
        results.append(grade_key(key, timeout, root, submission, expected[key], log_dir, references, enforce_policy))
        if log_dir is not None and results[-1].review:
            log_dir.mkdir(parents=True, exist_ok=True)
            (log_dir / "review.txt").open("a", encoding="utf-8").write(
                "".join(f"{key}: {note}\n" for note in results[-1].review))
    return results


def main(argv=None) -> int:
    parser = OptionParser(description="Grade a submission key by key: only the code between the markers "
                                                 "is taken from it, each block is checked against the block policy "
                                                 "(instructor/policy.py), and each key's tests run in a fresh copy of "
                                                 "this tree (docs/grading.md).")
    parser.add_argument("--submission", default=None,
                        help="the copy of the course to grade (default: this tree itself: in a student's copy, the "
                             "student's own code; in the instructor's tree, the reference solution)")
    parser.add_argument("--keys", nargs="+", default=list(KEYS), choices=list(KEYS), metavar="KEY",
                        help="keys to grade (default: all)")
    parser.add_argument("--json", default=None, help="write the Gradescope results.json here")
    parser.add_argument("--log_dir", default=None, help="write each key's full tracebacks here (default: beside --json)")
    parser.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT,
                        help=f"seconds allowed per key (default {DEFAULT_TIMEOUT:.0f}; every key takes well under a "
                             "minute on 2 CPU cores, docs/grading.md)")
    parser.add_argument("--performance", action="store_true",
                        help="also measure the optional performance keys (instructor/performance.py): side-by-side "
                             "speed ratios, reported apart from the correctness points")
    parser.add_argument("--skip_policy", action="store_true",
                        help="do not check the blocks against the block policy: only to try the grader's other "
                             "walls (tests/instructor/test_grading.py), never to grade")
    args = parser.parse_args(argv)
    from course.output_paths import require_writable_output
    from course.tree import check_tree

    # before any key is graded (a whole grading takes many minutes): where the results and the logs go
    require_writable_output(parser, args.json, "--json")
    require_writable_output(parser, args.log_dir, "--log_dir", folder=True)

    try:  # the grader's own tree must be the one its packages come from
        check_tree(ROOT)
    except RuntimeError as exc:
        parser.error(str(exc))
    submission = Path(args.submission).resolve() if args.submission else None
    if submission is not None and not submission.is_dir():
        parser.error(f"--submission {submission} is not a folder")
    log_dir = Path(args.log_dir) if args.log_dir else (Path(args.json).resolve().parent / "grading_logs"
                                                        if args.json else None)
    results = grade(args.keys, submission, args.timeout, log_dir, enforce_policy=not args.skip_policy)
    print_table(results)
    performance = None
    if args.performance:
        from instructor import performance as perf

        performance = perf.grade_performance(None, submission, timeout=args.timeout)
        perf.print_table(performance)
    if args.json:
        from course.results import write_json

        write_json(args.json, gradescope(results, performance))  # its folder made if need be (checked above)
        print(f"wrote {args.json}")
    if log_dir is not None and log_dir.is_dir():
        print(f"full tracebacks (and review.txt, if anything needs a look): {log_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
