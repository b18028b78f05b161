"""Build the Gradescope autograder bundle of the course.

    python instructor/gradescope.py --out autograder.zip

Upload the zip as a "programming assignment" autograder (Ubuntu base image). It holds:

* ``setup.sh`` — run once when Gradescope builds the image: installs the CPU build of
  ``torch==2.13.0`` and the pinned requirements (without the editable install);
* ``run_autograder`` — run for each submission: grades ``/autograder/submission`` with this
  tree's grader (``instructor/grade.py``, which takes only the code between the markers from
  the submission) and writes ``/autograder/results/results.json`` plus the full tracebacks in
  ``/autograder/results/logs``;
* ``source/`` — this (the instructor's) tree: packages, tests, configuration, grader, and the
  Multi30k files, so grading needs no network.

Students upload their copy of the course (or just the part packages, at their usual paths).
The performance keys (:mod:`instructor.performance`) are measured after the correctness keys and reported as
separate tests entries (tag ``performance``, their own ``max_score``); ``GRADE_PERFORMANCE=0`` leaves them out.
``AUTOGRADER_ROOT`` (default ``/autograder``), ``GRADE_KEYS`` (a space-separated subset of
keys) and ``PYTHON`` override the defaults, e.g. to try the bundle locally. The grader's threat
model is in ``instructor/grade.py``: run it only inside the container Gradescope provides.
"""
from __future__ import annotations

import argparse
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if __name__ == "__main__":  # run as a file: import the packages of the tree this script sits in
    sys.path.insert(0, str(ROOT))

from course.data import multi30k_files, resolve_data_dir  # noqa: E402
from instructor.blocks import course_files  # noqa: E402

SETUP_SH = """#!/usr/bin/env bash
# Gradescope runs this once, as root, when it builds the autograder image.
set -euo pipefail
cd /autograder/source
apt-get update -qq && apt-get install -y -qq python3 python3-pip python3-venv > /dev/null
python3 -m pip install -q torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu
grep -v -e '^-e' -e '^torch==' -e '^#' requirements.txt > /tmp/requirements-autograder.txt
python3 -m pip install -q -r /tmp/requirements-autograder.txt
"""

RUN_AUTOGRADER = """#!/usr/bin/env bash
# Gradescope runs this for every submission; the results go to results/results.json.
set -uo pipefail
ROOT="${AUTOGRADER_ROOT:-/autograder}"
PYTHON="${PYTHON:-python3}"
cd "$ROOT/source"
export LLMSYS_DATA_DIR="$ROOT/source/data/multi30k"
mkdir -p "$ROOT/results"
KEYS=()
if [ -n "${GRADE_KEYS:-}" ]; then KEYS=(--keys $GRADE_KEYS); fi
PERF=(--performance)
if [ "${GRADE_PERFORMANCE:-1}" = "0" ]; then PERF=(); fi
"$PYTHON" instructor/grade.py --submission "$ROOT/submission" "${KEYS[@]}" "${PERF[@]}" \\
    --json "$ROOT/results/results.json" --log_dir "$ROOT/results/logs"
"""


def build_bundle(out: str | Path, root: Path = ROOT) -> Path:
    """Write the autograder zip to ``out``; returns its path.

    Raises:
        course.data.DataNotFoundError: the Multi30k files are nowhere to be found.
    """
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    data = resolve_data_dir()
    tmp = out.with_name(out.name + ".part")
    with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as z:
        for name, text in (("setup.sh", SETUP_SH), ("run_autograder", RUN_AUTOGRADER)):
            info = zipfile.ZipInfo(name)
            info.external_attr = 0o755 << 16
            z.writestr(info, text)
        for name in course_files(root):
            z.write(root / name, f"source/{name}")
        for name in multi30k_files():
            z.write(data / name, f"source/data/multi30k/{name}")
    tmp.replace(out)
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description="Build the Gradescope autograder bundle (zip).")
    parser.add_argument("--out", default="autograder.zip", help="where to write the zip")
    args = parser.parse_args(argv)
    from course.output_paths import require_writable_output

    require_writable_output(parser, args.out, "--out")  # before the bundle is built
    path = build_bundle(args.out)
    print(f"wrote {path} ({path.stat().st_size / 1e6:.1f} MB): upload it as the assignment's autograder")
    return 0


if __name__ == "__main__":
    sys.exit(main())
