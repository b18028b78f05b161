"""Assignment blocks: finding them, and replacing their code by the stub (shipped with the release).

A block is the code between a key's BEGIN and END marker lines (``ASSIGN5_x_y``; small, no
nesting, inside a function). :func:`find_blocks` finds and checks them; :func:`stub_source` and
:func:`stub_notebook` replace a block's code by one line, indented like the block,

    raise NotImplementedError("Assignment 5.1.2: implement average_gradients (...). See
        notebooks/01_data_parallel.ipynb; check with: pytest -k a5_1_2")

keeping the marker lines around it. The student release (``instructor/release.py``, instructor-only)
stubs every block; the grader (:mod:`instructor.submission`) stubs, in each key's grading copy,
the blocks of the keys that key does not depend on.

Errors (:class:`ReleaseError`, naming file and line): a BEGIN without END, an END without
BEGIN, nested blocks, a BEGIN and END of different keys, an unknown key, a block that is
not inside a function (its stub would break the import).
"""
from __future__ import annotations

import ast
import json
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

from instructor.keys import KEYS, key_of_marker

BEGIN = re.compile(r"^(\s*)# BEGIN (ASSIGN\w+)\s*$")
END = re.compile(r"^(\s*)# END (ASSIGN\w+)\s*$")
ANY_MARKER = re.compile(r"#\s*(BEGIN|END)\s+ASSIGN")
INSTRUCTOR_ONLY = {"instructor/release.py", "instructor/integrity.py", "instructor/gradescope.py"}
INSTRUCTOR_ONLY_DIRS = ("tests/instructor/", "tests/site/")  # the tests of the instructor tools (the site is
# built from the instructor's tree: website/ needs instructor/release.py to find the reference blocks)
SKIP_DIRS = {".git", "workdir", "__pycache__", ".ipynb_checkpoints", "data"}


class ReleaseError(ValueError):
    """A marker problem; the message names the file and line."""


@dataclass
class Block:
    marker: str
    begin: int  # 0-based line index of the BEGIN line
    end: int    # 0-based line index of the END line
    indent: str


def find_blocks(lines: list[str], where: str) -> list[Block]:
    """The marker blocks of ``lines`` (no trailing newlines), checked for pairing and keys."""
    blocks, open_block = [], None
    for i, line in enumerate(lines):
        b, e = BEGIN.match(line), END.match(line)
        if b:
            if open_block:
                raise ReleaseError(f"{where}:{i + 1}: BEGIN {b.group(2)} inside the block opened at line "
                                   f"{open_block.begin + 1} (blocks do not nest)")
            if key_of_marker(b.group(2)) is None:
                raise ReleaseError(f"{where}:{i + 1}: unknown assignment key {b.group(2)} "
                                   "(declare it in instructor/keys.py)")
            open_block = Block(b.group(2), i, -1, b.group(1))
        elif e:
            if not open_block:
                raise ReleaseError(f"{where}:{i + 1}: END {e.group(2)} without a BEGIN")
            if e.group(2) != open_block.marker:
                raise ReleaseError(f"{where}:{i + 1}: END {e.group(2)} closes BEGIN {open_block.marker} "
                                   f"of line {open_block.begin + 1}")
            open_block.end = i
            blocks.append(open_block)
            open_block = None
        elif ANY_MARKER.search(line):
            raise ReleaseError(f"{where}:{i + 1}: malformed marker line {line.strip()!r} "
                               "(a marker line holds '#', BEGIN or END, and the key such as ASSIGN5_1_2, and nothing else)")
    if open_block:
        raise ReleaseError(f"{where}:{open_block.begin + 1}: BEGIN {open_block.marker} has no END")
    return blocks


def _enclosing_functions(source: str) -> list[tuple[int, int, str]]:
    """(first line, last line, qualified name) of every function, 1-based."""
    found = []

    def visit(node, prefix):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                found.append((child.lineno, child.end_lineno, prefix + child.name))
                visit(child, prefix + child.name + ".")
            elif isinstance(child, ast.ClassDef):
                visit(child, prefix + child.name + ".")
            else:
                visit(child, prefix)

    visit(ast.parse(source), "")
    return found


def stub_message(marker: str, where: str | None) -> str:
    key = key_of_marker(marker)
    what = f"implement {where}" if where else "implement this cell"
    return (f"Assignment {key.number}: {what} ({key.topic}). See {key.notebook}; "
            f"check with: pytest -k {key.key}")


def stub_source(source: str, where: str, python_file: bool = True,
                only: set[str] | None = None) -> tuple[str, list[str]]:
    """``source`` with every block replaced by its stub; also the markers stubbed.

    The marker lines stay around each stub: the student writes the solution between them,
    and the grader takes exactly that code from a submission (``instructor/submission.py``).
    With ``only``, just the blocks of those markers are stubbed; the others keep their
    solution code.
    """
    lines = source.split("\n")
    blocks = find_blocks(lines, where)
    if not blocks:
        return source, []
    functions = _enclosing_functions(source) if python_file else []
    stubbed = []
    for block in reversed(blocks):
        if only is not None and block.marker not in only:
            continue
        stubbed.append(block.marker)
        name = None
        if python_file:
            inside = [f for f in functions if f[0] < block.begin + 1 <= f[1]]
            if not inside:
                raise ReleaseError(f"{where}:{block.begin + 1}: block {block.marker} is not inside a function; "
                                   "its stub would break the import")
            name = max(inside, key=lambda f: f[0])[2]
        stub = f"{block.indent}raise NotImplementedError({stub_message(block.marker, name)!r})"
        lines[block.begin + 1:block.end] = [stub]
    return "\n".join(lines), stubbed


def stub_notebook(text: str, where: str, only: set[str] | None = None) -> tuple[str, list[str]]:
    """A notebook (JSON text) with solution cells stubbed and every output cleared."""
    nb = json.loads(text)
    markers = []
    for index, cell in enumerate(nb.get("cells", [])):
        source = "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]
        if cell["cell_type"] == "code":
            source, found = stub_source(source, f"{where} cell {index}", python_file=False, only=only)
            markers += found
            cell["outputs"], cell["execution_count"] = [], None
            needs = cell.get("metadata", {}).get("needs", [])
            unknown = [k for k in needs if k not in KEYS]
            if unknown:
                raise ReleaseError(f"{where} cell {index}: metadata 'needs' names unknown keys {unknown}")
            if needs:
                # The cell stops with the assignment's message while its code is a stub, and the
                # notebook goes on (Jupyter and nbclient continue after a cell tagged raises-exception).
                args = ", ".join(repr(k) for k in needs)
                source = f"from course.assignments import require; require({args})  # this cell needs them\n" + source
                tags = cell["metadata"].setdefault("tags", [])
                if "raises-exception" not in tags:
                    tags.append("raises-exception")
            cell["source"] = source
    return json.dumps(nb, indent=1, ensure_ascii=False) + "\n", markers


def course_files(root: Path) -> list[str]:
    """The files of the course: git's tracked and untracked-but-not-ignored files, else a walk."""
    try:
        out = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"], cwd=root,
                             capture_output=True, check=True)
        names = [n for n in out.stdout.decode().split("\0") if n and (root / n).is_file()]
    except (OSError, subprocess.CalledProcessError):
        names = [str(p.relative_to(root)) for p in root.rglob("*") if p.is_file()
                 and not SKIP_DIRS.intersection(p.relative_to(root).parts)]
    return sorted(names)


def is_instructor_only(name: str) -> bool:
    """Whether the course file ``name`` (relative path) stays out of the student release."""
    return name in INSTRUCTOR_ONLY or name.startswith(INSTRUCTOR_ONLY_DIRS)
