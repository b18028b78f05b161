"""The reference blocks of a course tree, found with the student release's own parser.

:func:`reference_blocks` lists every block between a BEGIN and an END ASSIGN5_x_y comment line in the
course's Python files and notebook code cells (``instructor.blocks.find_blocks`` pairs and checks
the markers; this module writes no parser of its own), with the function each block sits in.
:func:`release_lines` is what the student release shows: every line of the course's files outside
the blocks. The site uses both to say where each assignment is solved (``website/assignments.py``)
and to check that no reference line is published (``website/leaks.py``).
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from instructor.blocks import _enclosing_functions, course_files, find_blocks, is_instructor_only


@dataclass(frozen=True)
class FoundBlock:
    marker: str               # e.g. "ASSIGN5_1_2"
    file: str                 # path relative to the tree, e.g. "data_parallel/gradients.py"
    cell: int | None          # notebook cell index, None in a Python file
    function: str | None      # qualified name of the enclosing function (Python files)
    body: tuple[str, ...]     # the lines strictly between BEGIN and END


def _cell_source(cell: dict) -> str:
    source = cell.get("source", "")
    return "".join(source) if isinstance(source, list) else source


def _chunks(root: Path):
    """(file, cell index or None, text, is code) for every text file of the release's course files."""
    for name in course_files(root):
        if is_instructor_only(name):
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


def _scan(root: Path):
    """(blocks, lines outside the blocks) of the tree."""
    blocks, outside = [], []
    for name, cell, text, code in _chunks(root):
        lines = text.split("\n")
        where = name if cell is None else f"{name} cell {cell}"
        found = find_blocks(lines, where) if code else []
        functions = _enclosing_functions(text) if found and cell is None else []
        inside = set()
        for block in found:
            body = tuple(lines[block.begin + 1:block.end])
            inside.update(range(block.begin, block.end + 1))
            around = [f for f in functions if f[0] < block.begin + 1 <= f[1]]
            function = max(around, key=lambda f: f[0])[2] if around else None
            blocks.append(FoundBlock(block.marker, name, cell, function, body))
        outside += [line for i, line in enumerate(lines) if i not in inside]
    return blocks, outside


def reference_blocks(root: Path) -> list[FoundBlock]:
    """Every reference block of the course tree at ``root``, in file order.

    Raises:
        instructor.blocks.ReleaseError: a marker problem, naming file and line.
    """
    return _scan(Path(root))[0]


def release_lines(root: Path) -> list[str]:
    """Every line of the tree's course files outside the reference blocks (what the release shows)."""
    return _scan(Path(root))[1]


def scan(root: Path) -> tuple[list[FoundBlock], list[str]]:
    """:func:`reference_blocks` and :func:`release_lines` in one pass over the tree."""
    return _scan(Path(root))
