"""Grade a submission: run the graded tests key by key and print a table of points.

    python instructor/grade.py                      # every key
    python instructor/grade.py --keys a5_1_1 a5_1_2 # some keys
    python instructor/grade.py --json results.json  # also write the Gradescope autograder format

For each key (``instructor/keys.py`` declares topics and points) it runs
``pytest -m <key>`` in a subprocess with a time limit, reads the JUnit report, and gives
``points * passed / total``. A key whose tests hang past the limit, or whose pytest
crashes, scores zero with the reason, and grading goes on with the next key.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if __name__ == "__main__":  # run as a file: import the packages of the tree this script sits in
    sys.path.insert(0, str(ROOT))

from instructor.keys import KEYS  # noqa: E402


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


def _junit_counts(path: Path) -> tuple[int, int, list[str]]:
    """(passed, total, names of the tests that did not pass) from a JUnit XML report."""
    root = ET.parse(path).getroot()
    passed, total, failed = 0, 0, []
    for case in root.iter("testcase"):
        total += 1
        bad = [child for child in case if child.tag in ("failure", "error", "skipped")]
        if bad:
            failed.append(f"{case.get('name')}: {bad[0].tag} {(bad[0].get('message') or '')[:300]}")
        else:
            passed += 1
    return passed, total, failed


def grade_key(key: str, timeout: float, root: Path = ROOT, extra_args: tuple[str, ...] = ()) -> KeyResult:
    """Run the tests marked ``key`` under ``root`` and score them."""
    spec = KEYS[key]
    start = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.xml"
        cmd = [sys.executable, "-m", "pytest", "-m", key, "-p", "no:nbmake", "-o", "addopts=", "-q",
               "-p", "no:cacheprovider", f"--junitxml={report}", "tests", *extra_args]
        # A session of its own, so that on a time-out the whole tree (pytest and the ranks it
        # spawned) is killed, not just pytest.
        proc = subprocess.Popen(cmd, cwd=root, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                env=dict(os.environ, PYTHONDONTWRITEBYTECODE="1"), start_new_session=True)
        try:
            output, _ = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
            return KeyResult(key, spec.topic, 0, 0, 0.0, spec.points, time.monotonic() - start,
                             f"timed out after {timeout:.0f} s (a hung worker or an endless loop?); scored 0")
        finally:
            try:
                os.killpg(proc.pid, signal.SIGKILL)  # leftovers of a crashed run
            except ProcessLookupError:
                pass
        seconds = time.monotonic() - start
        if not report.is_file():
            tail = output[-1500:]
            return KeyResult(key, spec.topic, 0, 0, 0.0, spec.points, seconds, f"pytest crashed:\n{tail}")
        passed, total, failed = _junit_counts(report)
    if total == 0:
        return KeyResult(key, spec.topic, 0, 0, 0.0, spec.points, seconds, "no tests found for this key")
    output = "all tests passed" if not failed else "not passed:\n" + "\n".join(failed)
    return KeyResult(key, spec.topic, passed, total, round(spec.points * passed / total, 2), spec.points,
                     seconds, output)


def gradescope(results: list[KeyResult]) -> dict:
    """The Gradescope autograder ``results.json`` payload."""
    return {
        "score": round(sum(r.points for r in results), 2),
        "tests": [{"name": f"{r.key}: {r.topic}", "score": r.points, "max_score": r.max_points,
                   "output": f"{r.passed}/{r.total} tests passed in {r.seconds:.0f} s\n{r.output}"}
                  for r in results],
    }


def print_table(results: list[KeyResult]) -> None:
    print(f"{'key':<8} {'topic':<58} {'tests':>7} {'points':>9}")
    for r in results:
        print(f"{r.key:<8} {r.topic[:58]:<58} {f'{r.passed}/{r.total}':>7} {f'{r.points:g}/{r.max_points}':>9}")
    total, best = sum(r.points for r in results), sum(r.max_points for r in results)
    print(f"{'total':<8} {'':<58} {'':>7} {f'{total:g}/{best}':>9}")
    for r in results:
        if r.passed < r.total or r.total == 0:
            print(f"\n{r.key}: {r.output}")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description="Run the graded tests key by key and print the points.")
    parser.add_argument("--keys", nargs="+", default=list(KEYS), choices=list(KEYS), metavar="KEY",
                        help="keys to grade (default: all)")
    parser.add_argument("--json", default=None, help="write the Gradescope results.json here")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds allowed per key")
    args = parser.parse_args(argv)
    results = []
    for key in args.keys:
        print(f"grading {key} ...", flush=True)
        results.append(grade_key(key, args.timeout))
    print_table(results)
    if args.json:
        Path(args.json).write_text(json.dumps(gradescope(results), indent=2))
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
