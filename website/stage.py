"""Stage the site's sources: the course's own files, laid out for Sphinx, with no reference solution.

The staged tree mirrors the repository, so that links between notebooks and docs keep working:

* ``index.md`` — the landing page (``website/landing.md``, with the parts table derived from the
  notebooks and ``instructor/keys.py``, and the README's set-up and grading sections);
* ``notebooks/NN_*.ipynb`` — every notebook of ``notebooks/``, in course order (its number), with
  its committed outputs, every reference block replaced by the release's stub, and a box naming its
  assignments (``website/assignments.py``); ``_student/notebooks/`` holds the student release of
  each for download;
* ``guides/*.md`` — every other section of the README, one page each (the GPU guidance among them);
* ``docs/*.md`` — every page of ``docs/``;
* ``packages/*.md`` — one page per package that holds reference blocks;
* ``calculators.md`` — the calculators (memory, bubble, alpha-beta, MFU), their tables emitted from the
  course's Python (``website/calculators.py``).
* ``leaderboard.md`` — the performance keys' leaderboard (``website/leaderboard.py``), when ``leaderboard/`` holds
  entries.

Errors (:class:`SiteError`): a notebook without a course number or title, a key whose notebook is
not in ``notebooks/``, a README without the sections the landing page shows.
"""
from __future__ import annotations

import json
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from instructor.blocks import scan, stub_notebook, stub_source
from instructor.keys import KEYS, Key
from website import assignments, calculators
from website.markdown import LinkMap, escape, split_sections

HERE = Path(__file__).resolve().parent
LANDING_SECTIONS = ("Set up", "For students")  # README sections shown on the landing page (heading prefixes)
_NUMBERED = re.compile(r"^(\d+)_\w+\.ipynb$")


class SiteError(RuntimeError):
    """The course's files cannot make the site; the message says what to change."""


@dataclass
class Staged:
    src: Path
    notebooks: list[str]                                   # repository paths, in course order
    titles: dict[str, str]                                 # repository path -> page title
    toc: dict[str, list[str]] = field(default_factory=dict)  # caption -> staged docnames


def course_notebooks(root: Path) -> list[str]:
    """The notebooks in ``root/notebooks`` in course order (their number), as repository paths."""
    names = [p.name for p in (root / "notebooks").glob("*.ipynb")]
    unnumbered = sorted(n for n in names if not _NUMBERED.match(n))
    if unnumbered:
        raise SiteError(f"notebooks/{unnumbered[0]} has no course number: name it NN_topic.ipynb "
                        "(its number places it in the course)")
    return [f"notebooks/{n}" for n in sorted(names, key=lambda n: (int(_NUMBERED.match(n).group(1)), n))]


def _source(cell: dict) -> str:
    return "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]


def _title(nb: dict, where: str) -> tuple[str, int]:
    """The notebook's title (its first level-1 heading) and the index of the cell holding it."""
    for index, cell in enumerate(nb.get("cells", [])):
        if cell["cell_type"] == "markdown":
            for line in _source(cell).split("\n"):
                if line.startswith("# "):
                    return line[2:].strip(), index
    raise SiteError(f"{where} has no title: start its first markdown cell with '# <title>'")


def _shift_headings(text: str) -> str:
    """A README section as a page: its '### ' sub-headings become '## ' (outside code blocks)."""
    out, fence = [], False
    for line in text.split("\n"):
        if line.lstrip().startswith(("```", "~~~")):
            fence = not fence
        out.append(line[1:] if not fence and line.startswith("### ") else line)
    return "\n".join(out)


def _stage_notebook(root: Path, src: Path, name: str, keys: list[Key], blocks, links: LinkMap) -> str:
    text = (root / name).read_text(encoding="utf-8")
    nb = json.loads(text)
    title, title_cell = _title(nb, name)
    for index, cell in enumerate(nb["cells"]):
        if cell["cell_type"] == "code":  # outputs stay; a reference block becomes the release's stub
            cell["source"] = stub_source(_source(cell), f"{name} cell {index}", python_file=False)[0]
        elif cell["cell_type"] == "markdown":
            cell["source"] = links.rewrite(_source(cell), name, name)
    student = f"_student/{name}"
    box = assignments.notebook_box(keys, blocks, name, "../" + student)
    cell = {"cell_type": "markdown", "metadata": {}, "source": box}
    if (nb.get("nbformat"), nb.get("nbformat_minor", 0)) >= (4, 5):
        cell["id"] = "course-site-assignments"
    nb["cells"].insert(title_cell + 1, cell)
    nb.setdefault("metadata", {}).setdefault("kernelspec", {"name": "python3", "display_name": "Python 3",
                                                            "language": "python"})
    (src / name).parent.mkdir(parents=True, exist_ok=True)
    (src / name).write_text(json.dumps(nb, indent=1, ensure_ascii=False), encoding="utf-8")
    (src / student).parent.mkdir(parents=True, exist_ok=True)
    (src / student).write_text(stub_notebook(text, name)[0], encoding="utf-8")
    return title


def _parts_table(staged: Staged, keys: dict[str, Key], blocks) -> str:
    lines = ["| part | notebook | package | assignments |", "| --- | --- | --- | --- |"]
    for name in staged.notebooks:
        mine = [k for k in keys.values() if k.notebook == name]
        part = mine[0].number.rsplit(".", 1)[0] if mine else _NUMBERED.match(Path(name).name).group(1).lstrip("0")
        packages = dict.fromkeys(assignments.package_of(b.file) for k in mine for b in assignments.solved_in(k, blocks))
        package_links = ", ".join(f"[`{p}/`]({assignments.package_page(p)})" for p in packages)
        key_text = ", ".join(f"`{k.key}`" for k in mine) or "—"
        lines.append(f"| {part} | [{escape(staged.titles[name])}]({name}) | {package_links or '—'} | {key_text} |")
    return "\n".join(lines)


def _toctrees(toc: dict[str, list[str]]) -> str:
    out = []
    for caption, docs in toc.items():
        if docs:
            out += ["```{toctree}", f":caption: {caption}", ":maxdepth: 1", ":hidden:", "", *docs, "```", ""]
    return "\n".join(out)


def stage(root: Path, src: Path, keys: dict[str, Key] = KEYS) -> Staged:
    """Write the site's Sphinx sources for the course tree ``root`` into ``src`` (emptied first)."""
    root, src = Path(root).resolve(), Path(src).resolve()
    shutil.rmtree(src, ignore_errors=True)
    src.mkdir(parents=True)
    blocks, _ = scan(root)
    staged = Staged(src, course_notebooks(root), {})
    lost = sorted({k.notebook for k in keys.values()} - set(staged.notebooks))
    if lost:
        raise SiteError(f"instructor/keys.py names {lost[0]}, which is not in notebooks/")

    readme = (root / "README.md").read_text(encoding="utf-8")
    _, sections = split_sections(readme)
    landing = {}
    for prefix in LANDING_SECTIONS:
        found = [s for s in sections if s.heading.startswith(prefix)]
        if not found:
            raise SiteError(f"README.md has no section whose heading starts with {prefix!r}; the landing page "
                            f"shows it (website/stage.py, LANDING_SECTIONS)")
        landing[prefix] = found[0]
    guides = [s for s in sections if s not in landing.values()]
    docs = sorted(p.relative_to(root).as_posix() for p in (root / "docs").glob("*.md"))

    pages = {"README.md": "index.md", **{d: d for d in docs}, **{n: n for n in staged.notebooks}}
    pages[calculators.SOURCE] = calculators.PAGE  # a notebook's link to its calculator leads to the page
    guide_pages: list[str] = []
    for section in guides:
        slug = section.slug
        while f"guides/{slug}.md" in guide_pages:
            slug += "-2"
        guide_pages.append(f"guides/{slug}.md")
    anchors = {("README.md", s.slug): page for s, page in reversed(list(zip(guides, guide_pages)))}
    links = LinkMap(root, pages, anchors)

    packages = sorted({assignments.package_of(b.file) for b in blocks if b.cell is None})
    for name in staged.notebooks:
        mine = [k for k in keys.values() if k.notebook == name]
        staged.titles[name] = _stage_notebook(root, src, name, mine, blocks, links)
    (src / "guides").mkdir()
    for section, page in zip(guides, guide_pages):
        body = links.rewrite(_shift_headings(section.body), "README.md", page)
        (src / page).write_text(f"# {section.heading}\n{body}", encoding="utf-8")
    for doc in docs:
        (src / doc).parent.mkdir(parents=True, exist_ok=True)
        (src / doc).write_text(links.rewrite((root / doc).read_text(encoding="utf-8"), doc, doc), encoding="utf-8")
    (src / "packages").mkdir()
    for package in packages:
        text = assignments.package_markdown(root, package, list(keys.values()), blocks, staged.titles,
                                            {n: n for n in staged.notebooks})
        (src / assignments.package_page(package)).write_text(text, encoding="utf-8")

    staged.toc = {"Course": [n.removesuffix(".ipynb") for n in staged.notebooks],
                  "Using the repository": [p.removesuffix(".md") for p in guide_pages],
                  "Guides": [d.removesuffix(".md") for d in docs],
                  "Packages": [assignments.package_page(p).removesuffix(".md") for p in packages]}
    try:
        staged.toc["Tools"] = [calculators.stage_page(root, src)]
    except calculators.CalculatorError as exc:
        raise SiteError(str(exc)) from None
    from instructor.leaderboard import EntryError
    from website.leaderboard import PAGE, page_markdown  # the leaderboard page, when leaderboard/ has entries

    try:
        board = page_markdown(root)
    except EntryError as exc:
        raise SiteError(f"leaderboard/: {exc}") from None
    if board is not None:
        (src / PAGE).write_text(links.rewrite(board, PAGE, PAGE), encoding="utf-8")
        staged.toc["Leaderboard"] = [PAGE.removesuffix(".md")]
    index = (HERE / "landing.md").read_text(encoding="utf-8")
    index = index.replace("{{parts}}", _parts_table(staged, keys, blocks)).replace("{{toctrees}}", _toctrees(staged.toc))
    for prefix, section in landing.items():
        index = index.replace("{{readme:" + prefix + "}}", links.rewrite(section.body.strip(), "README.md", "index.md"))
    (src / "index.md").write_text(index, encoding="utf-8")
    for image in links.images:
        (src / image).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(root / image, src / image)
    return staged
