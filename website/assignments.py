"""What the site says about the assignments, derived from ``instructor/keys.py`` and the blocks.

Nothing here is typed in: a key's topic, points and notebook come from the one table of keys, and
where it is solved (file and function) from the reference blocks themselves
(:func:`instructor.blocks.reference_blocks`). Two kinds of Markdown are written:

* the box on each notebook's page: its keys, what to write, where, and the ``pytest -k`` command;
* one page per package that holds blocks: what the package is (its docstring), where each of
  its assignments is solved, and its files, each with the first line of its docstring.
  Source code is not published (it holds the reference solutions).
"""
from __future__ import annotations

import ast
import posixpath
from pathlib import Path

from instructor.blocks import FoundBlock, course_files
from instructor.keys import Key
from website.markdown import escape


def package_of(path: str) -> str:
    """The top-level folder of a repository path (``data_parallel`` for ``data_parallel/gradients.py``)."""
    return path.split("/")[0]


def solved_in(key: Key, blocks: list[FoundBlock]) -> list[FoundBlock]:
    """The blocks of ``key`` in the course's Python files, in file order."""
    return [b for b in blocks if b.marker == key.marker and b.cell is None]


def package_page(package: str) -> str:
    """Staged path of a package's page."""
    return f"packages/{package}.md"


def _where(key: Key, blocks: list[FoundBlock], staged_as: str | None = None) -> str:
    """Where ``key`` is solved: each file (a link to its package's page when ``staged_as`` is given)
    with the functions holding its blocks."""
    functions: dict[str, list[str]] = {}
    for block in solved_in(key, blocks):
        functions.setdefault(block.file, [])
        if block.function and block.function not in functions[block.file]:
            functions[block.file].append(block.function)
    places = []
    for file, names in functions.items():
        shown = f"`{file}`"
        if staged_as is not None:
            shown = f"[{shown}]({posixpath.relpath(package_page(package_of(file)), posixpath.dirname(staged_as))})"
        places.append(shown + (": " + ", ".join(f"`{n}`" for n in names) if names else ""))
    cells = sorted({b.cell for b in blocks if b.marker == key.marker and b.cell is not None})
    places += [f"cell {c + 1} of the notebook" for c in cells]
    return "; ".join(places) or "(no block found)"


def notebook_box(keys: list[Key], blocks: list[FoundBlock], staged_as: str, download: str) -> str:
    """The MyST admonition at the top of a notebook's page (``staged_as``: the page's staged path;
    ``download``: the student notebook's path relative to the page)."""
    lines = [":::{admonition} Assignments in this notebook", ":class: tip course-keys", ""]
    if keys:
        lines += ["| assignment, graded by | what you write, and where |", "| --- | --- |"]
        for key in keys:
            lines.append(f"| **{key.number}** `pytest -k {key.key}` | {escape(key.topic)} ({key.points} points), "
                         f"in {_where(key, blocks, staged_as)} |")
        index = posixpath.relpath("index.md", posixpath.dirname(staged_as))
        lines += ["", "Write each solution between the block's BEGIN and END comment lines, in the file named "
                  "above; `pytest -k` followed by the key runs exactly that assignment's tests "
                  f"([Grade yourself]({index}#grade-yourself))."]
    else:
        lines.append("This notebook has no graded assignment.")
    lines += ["", f"{{download}}`Download the notebook <{download}>` as students get it (solution blocks as "
              "stubs, outputs cleared); the download button at the top of the page gives this page with its outputs.",
              ":::", ""]
    return "\n".join(lines)


def _summary(root: Path, path: str) -> str:
    """The first paragraph of a Python file's docstring, as one line of escaped Markdown."""
    try:
        docstring = ast.get_docstring(ast.parse((root / path).read_text(encoding="utf-8"))) or ""
    except SyntaxError:
        docstring = ""
    return escape(docstring.split("\n\n")[0])


def package_markdown(root: Path, package: str, keys: list[Key], blocks: list[FoundBlock],
                     notebook_titles: dict[str, str], notebook_pages: dict[str, str]) -> str:
    """The page of ``package``: its docstring, where its assignments are solved, and its files."""
    staged_as = package_page(package)
    files = [n for n in course_files(root) if n.startswith(package + "/") and n.endswith(".py")]
    summary = _summary(root, f"{package}/__init__.py") if f"{package}/__init__.py" in files else ""
    mine = [k for k in keys if any(package_of(b.file) == package for b in solved_in(k, blocks))]
    lines = [f"# `{package}/`", "", summary, ""]
    notebooks = list(dict.fromkeys(k.notebook for k in mine if k.notebook in notebook_pages))
    if notebooks:
        links = ", ".join(f"[{escape(notebook_titles[n])}]"
                          f"({posixpath.relpath(notebook_pages[n], posixpath.dirname(staged_as))})"
                          for n in notebooks)
        lines += [f"Read with: {links}.", ""]
    lines += ["## Where the assignments are solved", "", ":::{container} course-keys", "",
              "| assignment, graded by | what you write, and where |", "| --- | --- |"]
    for key in mine:
        lines.append(f"| **{key.number}** `pytest -k {key.key}` | {escape(key.topic)}, in {_where(key, blocks)} |")
    lines += [":::", "", "## Files", "", "| file | what it holds |", "| --- | --- |"]
    lines += [f"| `{f}` | {_summary(root, f)} |" for f in files]
    lines += ["", "The source is in the repository; the site does not publish it, since it holds the "
              "reference solutions.", ""]
    return "\n".join(lines)
