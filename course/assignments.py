"""Which assignments of this checkout are still stubs, and a guard for notebook cells that need one.

In the student release every solution block — the code between an assignment's BEGIN and END
marker comments (docs/architecture.md, "Assignment keys") — is one line,
``raise NotImplementedError('Assignment 5.x.y: ...')``.
A notebook cell that needs an assignment starts, in the release, with
``require("a5_x_y")``: while that block is still the stub, the cell stops at once with the
assignment's own message (not with an error from deep inside the code, or a ``NameError``
from a variable an earlier cell could not make), and — the release tags such cells
``raises-exception`` — the notebook goes on to the next cell. In the reference tree, and
once the student has written the block, ``require`` does nothing.
"""
from __future__ import annotations

import ast
import re
from pathlib import Path

from course.blocks import may_have_blocks, marked_spans

TREE = Path(__file__).resolve().parent.parent


class AssignmentNotDone(RuntimeError):
    """A notebook cell needs an assignment whose code is still the release's stub."""


def marker(key: str) -> str:
    """``ASSIGN5_1_2`` for ``a5_1_2``."""
    if not re.fullmatch(r"a\d+_\d+_\d+", key):
        raise ValueError(f"not an assignment key: {key!r} (expected e.g. 'a5_1_2')")
    return "ASSIGN" + key[1:]


def stubs(tree: Path = TREE) -> dict[str, tuple[str, str]]:
    """``{marker: (file, stub message)}`` for every solution block of ``tree``'s Python files that is still a stub."""
    found: dict[str, tuple[str, str]] = {}
    for path in sorted(tree.rglob("*.py")):
        if any(part.startswith(".") or part in ("workdir", "__pycache__") for part in path.relative_to(tree).parts):
            continue
        text = path.read_text(encoding="utf-8", errors="replace")
        if not may_have_blocks(text):
            continue
        lines = text.split("\n")
        for block in marked_spans(lines):
            body = "\n".join(lines[block.begin + 1:block.end]).strip()
            if body.startswith("raise NotImplementedError(") and "\n" not in body:
                try:
                    message = ast.literal_eval(body[len("raise NotImplementedError("):-1])
                except (ValueError, SyntaxError):
                    message = body
                found.setdefault(block.marker, (str(path.relative_to(tree)), str(message)))
    return found


def require(*keys: str, tree: Path = TREE) -> None:
    """Stop the calling cell if any of ``keys`` is still a stub in ``tree``.

    Raises:
        AssignmentNotDone: naming each unfinished assignment, its file and its own message.
    """
    left = stubs(tree)
    missing = [(key, *left[marker(key)]) for key in keys if marker(key) in left]
    if missing:
        lines = [f"  - {key[1:].replace('_', '.')} in {file}: {message}" for key, file, message in missing]
        raise AssignmentNotDone("this cell needs work that is not done yet, so it stops here (the notebook "
                                "goes on with the next cell):\n" + "\n".join(lines))
