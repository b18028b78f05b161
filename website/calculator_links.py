"""Give each notebook a link to the calculator of its topic: one Markdown cell, inserted or brought up to date.

    python website/calculator_links.py            # every notebook of website.calculators.NOTEBOOK_TOPICS
    python website/calculator_links.py --check    # say which notebooks lack the cell or hold an old one (exit 1)

The cell sits right after the notebook's title cell and is known by its id (``course-calculator-link``; its
metadata ``course_calculator_link`` too, for notebooks older than nbformat 4.5): running the script again
changes nothing, and a changed text replaces the cell's source where it is. It links to ``website/calculators.md``
with the calculator's anchor; the site maps that file to its calculators page (``website/stage.py``), and in
Jupyter the link opens the page's source, which says what each calculator computes. The cell has no outputs:
the notebooks are executed after it is added (``project/tools/execute_notebooks.py``), not by this script.

Which notebook links to which calculator is :data:`website.calculators.NOTEBOOK_TOPICS`.
"""
from __future__ import annotations

import argparse
import posixpath
import sys
from pathlib import Path

if __name__ == "__main__":  # run as a file: import the packages of the tree this script sits in
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from website.calculators import ANCHORS, NOTEBOOK_TOPICS, SOURCE  # noqa: E402

CELL_ID = "course-calculator-link"
MARK = "course_calculator_link"
TITLES = {"memory": "memory per rank", "bubble": "pipeline bubble", "alpha_beta": "α–β cost of a collective",
          "mfu": "MFU"}


def link_text(notebook: str) -> str:
    """The Markdown of ``notebook``'s link cell (a repository path in :data:`NOTEBOOK_TOPICS`)."""
    topic, what = NOTEBOOK_TOPICS[notebook]
    target = posixpath.relpath(SOURCE, posixpath.dirname(notebook)) + "#" + ANCHORS[topic]
    return (f"**Calculator:** [{TITLES[topic]}]({target}) — {what}, computed in the browser with the planner's "
            "formulas (`project/planner/`) on the course's site (`python -m website`, the page "
            "`calculators.html`).")


def _title_index(nb) -> int:
    for index, cell in enumerate(nb.cells):
        if cell.cell_type == "markdown" and any(line.startswith("# ") for line in cell.source.split("\n")):
            return index
    raise ValueError("the notebook has no title cell (a Markdown cell with a '# ' heading)")


def with_link(nb, notebook: str):
    """``nb`` (an ``nbformat`` notebook) with its link cell present and current; returns ``nb``."""
    import nbformat

    text = link_text(notebook)
    found = [c for c in nb.cells if c.get("id") == CELL_ID or c.metadata.get(MARK)]
    if found:
        for extra in found[1:]:
            nb.cells.remove(extra)
        found[0].source = text
        return nb
    cell = nbformat.v4.new_markdown_cell(text, metadata={MARK: True})
    if (nb.nbformat, nb.nbformat_minor) >= (4, 5):
        cell["id"] = CELL_ID
    else:
        cell.pop("id", None)
    nb.cells.insert(_title_index(nb) + 1, cell)
    return nb


def update(root: Path, notebooks: list[str] | None = None, check: bool = False) -> list[str]:
    """Bring the link cell of each notebook (repository paths; default: every one of :data:`NOTEBOOK_TOPICS`
    that ``root`` has) up to date, or with ``check`` only find those that are not; returns the notebooks that
    changed (or would). Raises ``KeyError`` for a notebook without a topic."""
    import nbformat

    changed = []
    for notebook in notebooks or [n for n in NOTEBOOK_TOPICS if (root / n).is_file()]:
        if notebook not in NOTEBOOK_TOPICS:
            raise KeyError(f"{notebook} has no calculator topic: add it to website/calculators.py, NOTEBOOK_TOPICS")
        path = root / notebook
        before = path.read_text(encoding="utf-8")
        after = nbformat.writes(with_link(nbformat.reads(before, as_version=nbformat.NO_CONVERT), notebook)) + "\n"
        if after != before:
            changed.append(notebook)
            if not check:
                path.write_text(after, encoding="utf-8")
    return changed


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description="Insert or update each notebook's link to its calculator.")
    parser.add_argument("notebooks", nargs="*", help="repository paths (default: every notebook with a topic)")
    parser.add_argument("--check", action="store_true", help="change nothing; exit 1 if a notebook needs the update")
    args = parser.parse_args(argv)
    root = Path(__file__).resolve().parent.parent
    try:
        changed = update(root, args.notebooks, args.check)
    except KeyError as exc:
        print(f"error: {exc.args[0]}", file=sys.stderr)
        return 2
    for notebook in args.notebooks or [n for n in NOTEBOOK_TOPICS if (root / n).is_file()]:
        topic, _ = NOTEBOOK_TOPICS[notebook]
        state = ("needs its link cell" if args.check else "link cell written") if notebook in changed else "up to date"
        print(f"{notebook}: {TITLES[topic]} ({SOURCE}#{ANCHORS[topic]}): {state}")
    return 1 if args.check and changed else 0


if __name__ == "__main__":
    sys.exit(main())
