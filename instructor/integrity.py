"""Grading integrity: do the graded tests really tell a solution from a stub? (instructor-only)

    python instructor/integrity.py            # all three checks, all keys
    python instructor/integrity.py --keys a5_1_1 a5_1_2

1. **solution**: on this repository every graded test passes (``--skip_solution_run``: only
   collect them, when the plain ``pytest`` has just run them);
2. **release**: on the student release every graded test fails, and every pure
   infrastructure test (neither graded nor ``needs_solution``) still passes;
3. **isolation**: for each key K, in a tree where only K's blocks are stubbed, K's tests
   all fail and the tests of every other key pass — except keys that declare K among
   ``depends_on`` (instructor/keys.py), which may fail too;
4. **grader**: ``instructor/grade.py`` gives this tree full marks and the release zero on
   every key (``--skip_grader`` leaves it out).

To stay fast, check 3 runs only the test files that can reach K's code: a test file is
run when its static import closure (``import``/``from`` statements anywhere in it and in
the course modules it imports) contains a file holding K's blocks. Files outside that
closure run the very same code as on the solution, where check 1 saw them pass.
Exits 1 and lists every violation if any check fails.
"""
from __future__ import annotations

import argparse
import ast
import os
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if __name__ == "__main__":  # run as a file: import the packages of the tree this script sits in
    sys.path.insert(0, str(ROOT))

from course.data import resolve_data_dir  # noqa: E402
from instructor.keys import KEYS  # noqa: E402
from instructor.blocks import BEGIN, course_files  # noqa: E402
from instructor.release import make_release  # noqa: E402

PACKAGES = ("course", "project", "instructor", "data_parallel", "pipeline", "tensor_parallel", "communication", "memory", "three_d", "tests")
GRADED = " or ".join(KEYS)


def run_pytest(root: Path, marker_expr: str, files: list[str], timeout: float,
               collect_only: bool = False) -> dict[str, tuple[bool, set[str]]]:
    """Run ``pytest -m marker_expr files`` in ``root``; {test id: (passed, its markers)}.

    With ``collect_only`` nothing runs and every collected test counts as passed.
    """
    env = dict(os.environ, LLMSYS_DATA_DIR=str(resolve_data_dir()), PYTHONDONTWRITEBYTECODE="1")
    base = [sys.executable, "-m", "pytest", "-q", "-m", marker_expr, "-p", "no:nbmake", "-o", "addopts=",
            "-p", "no:cacheprovider"]
    if collect_only:
        proc = subprocess.run(base + ["--collect-only", *files], cwd=root, capture_output=True, text=True,
                              timeout=timeout, env=env)
        results = {}
        for line in proc.stdout.splitlines():
            if "::" in line and line.startswith("tests/"):
                path, name = line.split("::", 1)
                case = ET.Element("testcase", classname=path[:-3].replace("/", "."), name=name.split("::")[-1])
                results[f"{case.get('classname')}::{case.get('name')}"] = (True, test_keys(root, case))
        return results
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.xml"
        cmd = base + [f"--junitxml={report}", "-o", "junit_family=xunit1", *files]
        proc = subprocess.run(cmd, cwd=root, capture_output=True, text=True, timeout=timeout, env=env)
        if proc.returncode not in (0, 1, 5):  # 2-4: interrupted (e.g. collection errors), internal or usage error
            raise RuntimeError(f"pytest exited {proc.returncode} in {root}:\n{(proc.stdout + proc.stderr)[-3000:]}")
        if not report.is_file():
            raise RuntimeError(f"pytest crashed in {root}:\n{(proc.stdout + proc.stderr)[-3000:]}")
        results = {}
        for case in ET.parse(report).getroot().iter("testcase"):
            test_id = f"{case.get('classname')}::{case.get('name')}"
            ok = not any(child.tag in ("failure", "error", "skipped") for child in case)
            results[test_id] = (ok, test_keys(root, case))
        return results


_MARKS: dict[Path, tuple[dict[str, set[str]], set[str]]] = {}


def test_keys(root: Path, case) -> set[str]:
    """The assignment keys a test case carries (module-level ``pytestmark`` or its decorators)."""
    module = case.get("classname").split(".")  # tests.<part>.test_file[.Class]
    path = next((root.joinpath(*module[:n]).with_suffix(".py") for n in range(len(module), 1, -1)
                 if root.joinpath(*module[:n]).with_suffix(".py").is_file()), None)
    if path is None:
        return set()
    if path not in _MARKS:
        _MARKS[path] = _marks_in(path)
    per_test, module_marks = _MARKS[path]
    name = case.get("name").split("[")[0]
    return module_marks | per_test.get(name, set())


def _marks_in(path: Path):
    tree = ast.parse(path.read_text())
    text_marks = lambda node: {k for k in KEYS if f"mark.{k}" in ast.unparse(node)}  # noqa: E731
    module_marks, per_test = set(), {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "pytestmark" for t in node.targets):
            module_marks |= text_marks(node.value)
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            marks = set().union(*(text_marks(d) for d in node.decorator_list)) if node.decorator_list else set()
            per_test[node.name] = marks
            if isinstance(node, ast.ClassDef):
                for sub in node.body:
                    if isinstance(sub, ast.FunctionDef):
                        per_test[sub.name] = marks
    return per_test, module_marks


def module_file(root: Path, dotted: str) -> Path | None:
    parts = dotted.split(".")
    if parts[0] not in PACKAGES:
        return None
    for candidate in (root.joinpath(*parts).with_suffix(".py"), root.joinpath(*parts, "__init__.py")):
        if candidate.is_file():
            return candidate
    return None


def import_closure(root: Path, start: Path) -> set[Path]:
    """Course files ``start`` can import, following every import statement (also inside functions)."""
    seen, todo = set(), [start]
    while todo:
        path = todo.pop()
        if path in seen:
            continue
        seen.add(path)
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            for name in names:
                parts = name.split(".")
                for i in range(1, len(parts) + 1):  # a package's __init__ runs too
                    found = module_file(root, ".".join(parts[:i]))
                    if found and found not in seen:
                        todo.append(found)
    return seen


def files_with_marker(root: Path) -> dict[str, set[Path]]:
    found: dict[str, set[Path]] = {}
    for name in course_files(root):
        if name.endswith(".py"):
            for line in (root / name).read_text().splitlines():
                m = BEGIN.match(line)
                if m:
                    found.setdefault(m.group(2), set()).add(root / name)
    return found


def check(keys: list[str], timeout: float, run_solution: bool = True) -> list[str]:
    problems: list[str] = []
    tests = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "tests").rglob("test_*.py"))
    wanted = " or ".join(keys)

    t0 = time.monotonic()
    if run_solution:
        solution = run_pytest(ROOT, wanted, tests, timeout)
        problems += [f"solution: {t} fails" for t, (ok, _) in solution.items() if not ok]
        print(f"[1] solution: {sum(ok for ok, _ in solution.values())}/{len(solution)} graded tests pass "
              f"({time.monotonic() - t0:.0f} s)", flush=True)
    else:
        solution = run_pytest(ROOT, wanted, tests, timeout, collect_only=True)
        print(f"[1] solution: {len(solution)} graded tests collected (their run is the plain `pytest`)", flush=True)

    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.monotonic()
        release = Path(tmp) / "release"
        make_release(ROOT, release)
        shipped = [t for t in tests if (release / t).is_file()]
        graded = run_pytest(release, wanted, shipped, timeout)
        problems += [f"release: graded test {t} passes on the stubs" for t, (ok, _) in graded.items() if ok]
        missing = len(solution) - len(graded)
        if missing:
            problems.append(f"release: {missing} graded tests were not run on the release")
        infra = run_pytest(release, f"not ({GRADED}) and not needs_solution", shipped, timeout)
        problems += [f"release: infrastructure test {t} fails" for t, (ok, _) in infra.items() if not ok]
        print(f"[2] release: {sum(not ok for ok, _ in graded.values())}/{len(graded)} graded tests fail, "
              f"{sum(ok for ok, _ in infra.values())}/{len(infra)} infrastructure tests pass "
              f"({time.monotonic() - t0:.0f} s)", flush=True)

    marker_files = files_with_marker(ROOT)
    closures = {t: import_closure(ROOT, ROOT / t) for t in tests}
    for key in keys:
        t0 = time.monotonic()
        marker = KEYS[key].marker
        reach = {t for t, closure in closures.items() if closure & marker_files.get(marker, set())}
        may_fail = {key} | {k for k, spec in KEYS.items() if key in spec.depends_on}
        # Keys that depend on K may fail either way: only K's tests and the independent keys' run.
        expr = " or ".join([key] + [k for k in KEYS if k not in may_fail])
        with tempfile.TemporaryDirectory() as tmp:
            tree = Path(tmp) / "tree"
            make_release(ROOT, tree, only={marker})
            present = sorted(t for t in reach if (tree / t).is_file())  # instructor-only tests are left out
            got = run_pytest(tree, expr, present, timeout) if present else {}
        own = {t: ok for t, (ok, marks) in got.items() if key in marks}
        others = {t: (ok, marks) for t, (ok, marks) in got.items() if key not in marks}
        problems += [f"isolation {key}: its test {t} passes with {key} stubbed" for t, ok in own.items() if ok]
        own_total = sum(1 for ok, marks in solution.values() if key in marks)
        if len(own) != own_total:
            problems.append(f"isolation {key}: {own_total - len(own)} of its tests are not reached by its marker files")
        problems += [f"isolation {key}: test {t} of {sorted(marks)} fails when only {key} is stubbed"
                     for t, (ok, marks) in others.items() if not ok and not marks & may_fail]
        print(f"[3] isolation {key}: {sum(not ok for ok in own.values())}/{len(own)} own tests fail; "
              f"{sum(ok for ok, _ in others.values())}/{len(others)} other reached tests pass "
              f"({len(reach)} files, {time.monotonic() - t0:.0f} s)", flush=True)
    return problems


def check_grader(keys: list[str], timeout: float) -> list[str]:
    """4. The hardened grader (``instructor/grade.py``) gives the reference full marks and the
    student release zero on every key."""
    import json

    problems = []
    with tempfile.TemporaryDirectory() as tmp:
        release = Path(tmp) / "release"
        make_release(ROOT, release)
        for label, submission, want_full in (("reference", ROOT, True), ("release", release, False)):
            t0 = time.monotonic()
            out = Path(tmp) / f"{label}.json"
            done = subprocess.run([sys.executable, str(ROOT / "instructor" / "grade.py"), "--submission",
                                   str(submission), "--keys", *keys, "--json", str(out), "--timeout", str(timeout)],
                                  capture_output=True, text=True, timeout=timeout * len(keys) + 300)
            if done.returncode != 0 or not out.is_file():
                problems.append(f"grader on the {label}: exited {done.returncode}:\n{done.stdout[-2000:]}")
                continue
            for test in json.loads(out.read_text())["tests"]:
                expected = test["max_score"] if want_full else 0
                if test["score"] != expected:
                    problems.append(f"grader on the {label}: {test['name']} scored {test['score']}, expected "
                                    f"{expected}:\n{test['output'][:1500]}")
            total = next((line.split()[-1] for line in done.stdout.splitlines() if line.startswith("total")), "?")
            print(f"[4] grader on the {label}: {total} points ({time.monotonic() - t0:.0f} s)", flush=True)
    return problems


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description="Check that graded tests fail on stubs and pass on the solution.")
    parser.add_argument("--keys", nargs="+", default=list(KEYS), choices=list(KEYS), metavar="KEY")
    parser.add_argument("--timeout", type=float, default=1800.0, help="seconds allowed per pytest run")
    parser.add_argument("--skip_solution_run", action="store_true",
                        help="do not re-run the graded tests on the solution (CI's plain `pytest` just did)")
    parser.add_argument("--skip_grader", action="store_true",
                        help="do not grade the reference and the release with the hardened grader (check 4)")
    args = parser.parse_args(argv)
    start = time.monotonic()
    problems = check(args.keys, args.timeout, run_solution=not args.skip_solution_run)
    if not args.skip_grader:
        problems += check_grader(args.keys, min(args.timeout, 600.0))
    print(f"integrity check: {len(problems)} problem(s) in {time.monotonic() - start:.0f} s")
    for p in problems:
        print(f"  - {p}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
