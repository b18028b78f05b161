"""Assignment blocks: finding them, and replacing their code by the stub (shipped with the release).

A block is the code between a key's BEGIN and END marker lines (``ASSIGN5_x_y``; small, no
nesting, inside a function). The marker lines are read by one scanner, :mod:`course.blocks` (its
names are this module's too); :func:`scan` lists the reference blocks of a whole tree for the
grader's leak check, the block policy and the site. :func:`find_blocks` finds and checks them
against ``instructor/keys.py``; :func:`stub_source` and
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
import subprocess
from dataclasses import dataclass
from pathlib import Path

import course.blocks as course_blocks
from course.blocks import BEGIN, END, Block, ReleaseError, marked_spans  # noqa: F401 - this module's names too
from instructor.keys import KEYS, key_of_marker

INSTRUCTOR_ONLY = {"instructor/release.py", "instructor/integrity.py", "instructor/gradescope.py"}
INSTRUCTOR_ONLY_DIRS = ("tests/instructor/", "tests/site/")  # the tests of the instructor tools (the site is
# built from the instructor's tree: website/ needs instructor/release.py to find the reference blocks)
SKIP_DIRS = {".git", "workdir", "__pycache__", ".ipynb_checkpoints", "data"}


def find_blocks(lines: list[str], where: str) -> list[Block]:
    """The marker blocks of ``lines`` (no trailing newlines), checked for pairing and keys
    (:func:`course.blocks.find_blocks` with the keys of ``instructor/keys.py``)."""
    return course_blocks.find_blocks(lines, where, known=lambda marker: key_of_marker(marker) is not None)


def enclosing_functions(source: str) -> list[tuple[int, int, str]]:
    """(first line, last line, qualified name) of every function, 1-based."""
    found = []

    def visit(node, prefix):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                found.append((child.lineno, child.end_lineno, prefix + child.name))
                visit(child, prefix + child.name + ".")
            elif isinstance(child, ast.ClassDef):
                visit(child, prefix + child.name + ".")
            elif isinstance(child, (ast.stmt, ast.excepthandler, ast.match_case)):  # a def sits in no expression
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
    functions = enclosing_functions(source) if python_file else []
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


# ---- the reference blocks of a whole tree (the grader's leak check, the block policy and the site) ----

@dataclass(frozen=True)
class FoundBlock:
    marker: str               # e.g. "ASSIGN5_1_2"
    file: str                 # path relative to the tree, e.g. "data_parallel/gradients.py"
    cell: int | None          # notebook cell index, None in a Python file
    function: str | None      # qualified name of the enclosing function (Python files)
    body: tuple[str, ...]     # the lines strictly between BEGIN and END
    line: int = 0             # 1-based line of the BEGIN marker (in the file, or in the cell)


def _cell_source(cell: dict) -> str:
    source = cell.get("source", "")
    return "".join(source) if isinstance(source, list) else source


def _chunks(root: Path, python_only: bool):
    """(file, cell index or None, text, is code) for every text file of the release's course files."""
    for name in course_files(root):
        if is_instructor_only(name) or (python_only and not name.endswith(".py")):
            continue  # left out of the release, never published
        try:
            text = (root / name).read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue  # binary files hold no block
        if name.endswith(".ipynb"):
            for index, cell in enumerate(json.loads(text).get("cells", [])):
                yield name, index, _cell_source(cell), cell.get("cell_type") == "code"
        else:
            yield name, None, text, name.endswith(".py")


def scan(root: Path, python_only: bool = False) -> tuple[list[FoundBlock], list[str]]:
    """Every reference block of the course tree at ``root`` (Python files and notebook code cells, in
    file order; instructor-only files left out), and every line of its course files outside the
    blocks (what the student release shows). With ``python_only``, only the ``.py`` files are read.

    Raises:
        ReleaseError: a marker problem, naming file and line.
    """
    blocks, outside = [], []
    for name, cell, text, code in _chunks(Path(root), python_only):
        lines = text.split("\n")
        where = name if cell is None else f"{name} cell {cell}"
        found = find_blocks(lines, where) if code else []
        functions = enclosing_functions(text) if found and cell is None else []
        inside = set()
        for block in found:
            body = tuple(lines[block.begin + 1:block.end])
            inside.update(range(block.begin, block.end + 1))
            around = [f for f in functions if f[0] < block.begin + 1 <= f[1]]
            function = max(around, key=lambda f: f[0])[2] if around else None
            blocks.append(FoundBlock(block.marker, name, cell, function, body, block.begin + 1))
        outside += [line for i, line in enumerate(lines) if i not in inside] if inside else lines
    return blocks, outside


def reference_blocks(root: Path) -> list[FoundBlock]:
    """Every reference block of the course tree at ``root``, in file order (see :func:`scan`).

    Raises:
        ReleaseError: a marker problem, naming file and line.
    """
    return scan(root)[0]


def release_lines(root: Path) -> list[str]:
    """Every line of the tree's course files outside the reference blocks (what the release shows)."""
    return scan(root)[1]
