"""Write the student release of the course: every solution block replaced by a stub.

    python instructor/release.py --out ../student-release

The body of every ``# BEGIN ASSIGN5_x_y`` ... ``# END ASSIGN5_x_y`` block in the packages,
scripts and notebooks becomes one line, indented like the block (:mod:`instructor.blocks`),

    raise NotImplementedError("Assignment 5.1.2: implement average_gradients (...). See
        notebooks/01_data_parallel.ipynb; check with: pytest -k a5_1_2")

Signatures, docstrings and the code around the blocks are kept, the markers stay around each stub
(students write their solution between them; the grader takes exactly that code),
notebook outputs are cleared, and every Python file of the release is checked to parse.
A notebook code cell whose metadata says ``"needs": ["a5_1_2", ...]`` (the assignments it runs,
directly or through an earlier cell's results) starts, in the release, with
``require("a5_1_2", ...)`` (:mod:`course.assignments`) and is tagged ``raises-exception``:
while those assignments are stubs the cell stops with their message and the notebook goes on,
so a student can run a notebook to the end before solving everything above a cell.
Instructor-only files (this script, the grading-integrity check, the Gradescope bundle, the
instructor tools' tests) are left out. Marker errors raise :class:`ReleaseError` naming file and line.
"""
from __future__ import annotations

import argparse
import ast
import shutil
import sys
from pathlib import Path

if __name__ == "__main__":  # run as a file: import the packages of the tree this script sits in
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from instructor.blocks import ReleaseError, course_files, is_instructor_only, stub_notebook, stub_source  # noqa: E402


def make_release(src: Path, out: Path, only: set[str] | None = None) -> dict[str, int]:
    """Write the student release of ``src`` into ``out``; returns the stub count per marker.

    ``only``: stub just these markers (e.g. ``{"ASSIGN5_1_2"}``) and keep the other solutions.
    """
    counts: dict[str, int] = {}
    for name in course_files(src):
        if is_instructor_only(name):
            continue
        target = out / name
        target.parent.mkdir(parents=True, exist_ok=True)
        if name.endswith(".py") or name.endswith(".ipynb"):
            text = (src / name).read_text(encoding="utf-8")
            text, markers = (stub_notebook(text, name, only) if name.endswith(".ipynb")
                             else stub_source(text, name, only=only))
            for m in markers:
                counts[m] = counts.get(m, 0) + 1
            target.write_text(text, encoding="utf-8")
            if name.endswith(".py"):
                ast.parse(text, filename=str(target))  # the release must still parse
        else:
            shutil.copy2(src / name, target)
    return counts


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description="Write the student release (solutions replaced by stubs).")
    parser.add_argument("--out", required=True, help="folder to write the release into (must be empty or absent)")
    parser.add_argument("--src", default=str(Path(__file__).resolve().parent.parent), help="the solution repository")
    parser.add_argument("--force", action="store_true", help="overwrite a non-empty --out folder")
    args = parser.parse_args(argv)
    src, out = Path(args.src).resolve(), Path(args.out).resolve()
    if out == src or src in out.parents and not args.force:
        parser.error(f"--out {out} is inside the solution repository; choose a folder outside it")
    if out.exists() and any(out.iterdir()):
        if not args.force:
            parser.error(f"--out {out} is not empty; pass --force to overwrite it")
        shutil.rmtree(out)
    try:
        counts = make_release(src, out)
    except ReleaseError as exc:
        print(f"release failed: {exc}", file=sys.stderr)
        return 1
    for marker in sorted(counts):
        print(f"{marker}: {counts[marker]} block(s) stubbed")
    print(f"student release written to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
