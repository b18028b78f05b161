"""Grading integrity: do the graded tests really tell a solution from a stub? (instructor-only)

    python instructor/integrity.py                      # every check, every key
    python instructor/integrity.py --keys a5_1_1 a5_1_2
    python instructor/integrity.py --skip_solution_run  # CI: its plain `pytest` has just run the suite

1. **solution**: on this repository every graded test passes (``--skip_solution_run``: only
   collect them, when the plain ``pytest`` has just run them). Every key has tests.
2. **release infrastructure**: on the student release, every infrastructure test (neither
   graded nor ``needs_solution``) that can reach a block's code still passes — so no ungraded
   test secretly needs a solution. A test file can reach a block when its static import closure
   (``import`` statements anywhere in it and in the course modules it imports) holds a file with
   blocks, or when it starts processes (``subprocess``, ``sys.executable``: it runs scripts); the
   others run exactly the code check 1 ran and are not repeated.
3. **the grader, key by key** (``instructor/grade.py``, the grading copies students get):

   * on this tree every key scores full marks. A key's copy holds the reference of only the keys
     it depends on (``depends_on`` in ``instructor/keys.py``, followed to the end) and stubs for
     every other key, so this is the strongest form of "a stub fails only its own key's tests":
     key K passes with *every* key it does not depend on stubbed at once. A ``depends_on`` list
     that misses a key shows up here;
   * on the student release every key scores zero: K's copy holds K's stub and the reference of
     its dependencies, so every one of K's tests fails because of K alone.

   This replaces the earlier per-key isolation runs (each key stubbed alone, the tests of every
   file that reaches it run), which took about 100-600 s per key on a loaded 2-core machine,
   over an hour for the 24 keys; the grader runs each key's own tests twice.

Exits 1 and lists every problem if a check fails.
"""
from __future__ import annotations

import argparse
import ast
import json
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
from course.tree import tree_packages  # noqa: E402
from instructor.blocks import course_files, marked_spans  # noqa: E402
from instructor.keys import KEYS  # noqa: E402
from instructor.release import make_release  # noqa: E402

GRADED = " or ".join(KEYS)


def run_pytest(root: Path, marker_expr: str, files: list[str], timeout: float,
               collect_only: bool = False) -> dict[str, bool]:
    """Run ``pytest -m marker_expr files`` in ``root``; ``{test id: passed}`` (collected: True)."""
    env = dict(os.environ, LLMSYS_DATA_DIR=str(resolve_data_dir()), PYTHONDONTWRITEBYTECODE="1")
    base = [sys.executable, "-m", "pytest", "-q", "-m", marker_expr, "-p", "no:nbmake", "-p", "no:hypothesispytest",
            "-o", "addopts=", "-p", "no:cacheprovider"]
    if collect_only:
        proc = subprocess.run(base + ["--collect-only", *files], cwd=root, capture_output=True, text=True,
                              timeout=timeout, env=env)
        return {line.strip(): True for line in proc.stdout.splitlines() if "::" in line and line.startswith("tests/")}
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.xml"
        cmd = base + [f"--junitxml={report}", "-o", "junit_family=xunit1", *files]
        proc = subprocess.run(cmd, cwd=root, capture_output=True, text=True, timeout=timeout, env=env)
        if proc.returncode not in (0, 1, 5):  # 2-4: interrupted (e.g. collection errors), internal or usage error
            raise RuntimeError(f"pytest exited {proc.returncode} in {root}:\n{(proc.stdout + proc.stderr)[-3000:]}")
        if not report.is_file():
            raise RuntimeError(f"pytest crashed in {root}:\n{(proc.stdout + proc.stderr)[-3000:]}")
        return {f"{case.get('classname')}::{case.get('name')}":
                not any(child.tag in ("failure", "error", "skipped") for child in case)
                for case in ET.parse(report).getroot().iter("testcase")}


def module_file(root: Path, dotted: str, packages: set[str]) -> Path | None:
    parts = dotted.split(".")
    if parts[0] not in packages:
        return None
    for candidate in (root.joinpath(*parts).with_suffix(".py"), root.joinpath(*parts, "__init__.py")):
        if candidate.is_file():
            return candidate
    return None


def import_closure(root: Path, start: Path, packages: set[str]) -> set[Path]:
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
                    found = module_file(root, ".".join(parts[:i]), packages)
                    if found and found not in seen:
                        todo.append(found)
    return seen


def reaching_tests(root: Path, tests: list[str]) -> list[str]:
    """The test files that can run a block's code: by import, or by starting processes (scripts)."""
    packages = set(tree_packages(root)) | {"tests"}
    with_blocks = {root / name for name in course_files(root) if name.endswith(".py")
                   and marked_spans((root / name).read_text().split("\n"))}
    found = []
    for test in tests:
        text = (root / test).read_text()
        if "subprocess" in text or "sys.executable" in text or import_closure(root, root / test, packages) & with_blocks:
            found.append(test)
    return found


def check_release_infrastructure(timeout: float) -> list[str]:
    """2. The infrastructure tests that can reach a block pass on the student release."""
    tests = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "tests").rglob("test_*.py"))
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp:
        release = Path(tmp) / "release"
        make_release(ROOT, release)
        files = reaching_tests(ROOT, [t for t in tests if (release / t).is_file()])
        infra = run_pytest(release, f"not ({GRADED}) and not needs_solution", files, timeout)
    print(f"[2] release: {sum(infra.values())}/{len(infra)} infrastructure tests pass in {len(files)} files that "
          f"can reach a block ({time.monotonic() - t0:.0f} s)", flush=True)
    return [f"release: infrastructure test {t} fails on the stubs" for t, ok in infra.items() if not ok]


def check_grader(keys: list[str], timeout: float) -> list[str]:
    """3. The grader gives this tree full marks and the student release zero on every key."""
    problems = []
    with tempfile.TemporaryDirectory() as tmp:
        release = Path(tmp) / "release"
        make_release(ROOT, release)
        for label, submission, want_full in (("reference", ROOT, True), ("release", release, False)):
            t0 = time.monotonic()
            out = Path(tmp) / f"{label}.json"
            done = subprocess.run([sys.executable, str(ROOT / "instructor" / "grade.py"), "--submission",
                                   str(submission), "--keys", *keys, "--json", str(out), "--timeout", str(timeout)],
                                  capture_output=True, text=True, timeout=timeout * len(keys) + 600)
            if done.returncode != 0 or not out.is_file():
                problems.append(f"grader on the {label}: exited {done.returncode}:\n{done.stdout[-2000:]}"
                                f"{done.stderr[-2000:]}")
                continue
            for test in json.loads(out.read_text())["tests"]:
                expected = test["max_score"] if want_full else 0
                if test["score"] != expected:
                    problems.append(f"grader on the {label}: {test['name']} scored {test['score']}, expected "
                                    f"{expected}:\n{test['output'][:1500]}")
            times = [line for line in done.stdout.splitlines() if line[:3] == "a5_" and line.rstrip().endswith("s")]
            total = next((line.split()[-1] for line in done.stdout.splitlines() if line.startswith("total")), "?")
            print(f"[3] grader on the {label}: {total} points ({time.monotonic() - t0:.0f} s)\n    "
                  + "\n    ".join(times), flush=True)
    return problems


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description="Check that graded tests fail on stubs and pass on the solution.")
    parser.add_argument("--keys", nargs="+", default=list(KEYS), choices=list(KEYS), metavar="KEY")
    parser.add_argument("--timeout", type=float, default=1800.0, help="seconds allowed per pytest run")
    parser.add_argument("--key_timeout", type=float, default=300.0, help="seconds the grader allows per key")
    parser.add_argument("--skip_solution_run", action="store_true",
                        help="do not re-run the graded tests on the solution (CI's plain `pytest` just did)")
    parser.add_argument("--skip_grader", action="store_true", help="leave out check 3 (the grader, key by key)")
    args = parser.parse_args(argv)
    start, problems = time.monotonic(), []
    tests = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "tests").rglob("test_*.py"))
    wanted = " or ".join(args.keys)
    t0 = time.monotonic()
    solution = run_pytest(ROOT, wanted, tests, args.timeout, collect_only=args.skip_solution_run)
    problems += [f"solution: {t} fails" for t, ok in solution.items() if not ok]
    print(f"[1] solution: {sum(solution.values())}/{len(solution)} graded tests "
          f"{'collected' if args.skip_solution_run else 'pass'} ({time.monotonic() - t0:.0f} s)", flush=True)
    if not solution:
        problems.append("solution: no graded test was collected")
    problems += check_release_infrastructure(args.timeout)
    if not args.skip_grader:
        problems += check_grader(args.keys, args.key_timeout)
    print(f"integrity check: {len(problems)} problem(s) in {time.monotonic() - start:.0f} s")
    for p in problems:
        print(f"  - {p}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
