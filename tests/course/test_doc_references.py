"""What the notebooks and docs point a reader to exists: every repository path they name (``pipeline/p2p.py``,
``tests/course/``) is a file or folder of this checkout, and every dotted name of the course's code they
quote in backquotes (``pipeline.metrics.communication_plan``, ``course.config.RunConfig``) imports."""
from __future__ import annotations

import importlib
import json
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
TOP = sorted(p.name for p in REPO.iterdir() if p.is_dir() and not p.name.startswith(".") and p.name not in
             ("build", "workdir", "data", "__pycache__"))
PACKAGES = sorted(p.parent.name for p in REPO.glob("*/__init__.py") if p.parent.name != "tests")
# a path: a top-level folder, then /name segments (a trailing / names a folder)
PATH = re.compile(r"(?<![\w./-])((?:" + "|".join(map(re.escape, TOP)) + r")/[\w./-]*[\w/])")
DOTTED = re.compile(r"`((?:" + "|".join(map(re.escape, PACKAGES)) + r")(?:\.\w+)+)")
# run artefacts, written by runs into folders the reader makes (not files of the repository)
WRITTEN = re.compile(r"workdir|results/.*\{|\{|\*|<|build/")


def documents() -> list[Path]:
    docs = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md")), *sorted((REPO / "notebooks").glob("*.ipynb"))]
    return [d for d in docs if d.is_file()]


def text_of(path: Path) -> str:
    if path.suffix != ".ipynb":
        return path.read_text(encoding="utf-8")
    cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
    return "\n".join("".join(c["source"]) if isinstance(c["source"], list) else c["source"] for c in cells)


def left_out_of_the_release(path: str) -> bool:
    """A file the student release leaves out (instructor/blocks.py, INSTRUCTOR_ONLY): the docs name it for the
    instructor; in the release it is rightly missing. In the instructor's tree every path must exist."""
    from instructor.blocks import INSTRUCTOR_ONLY, INSTRUCTOR_ONLY_DIRS

    in_release = not (REPO / "instructor" / "release.py").exists()
    return in_release and (path.rstrip("/") in INSTRUCTOR_ONLY or (path.rstrip("/") + "/").startswith(INSTRUCTOR_ONLY_DIRS))


@pytest.mark.parametrize("document", documents(), ids=lambda p: p.name)
def test_every_repository_path_named_exists(document):
    missing, text = [], text_of(document)
    for match in PATH.finditer(text):
        path = match.group(1).rstrip(".")
        if WRITTEN.search(path) or text[match.end():match.end() + 1] in ("<", "{", "*"):
            continue  # a pattern (run_<topic>.py, rank{r}_...), not a file
        if not (REPO / path).exists() and not left_out_of_the_release(path):
            missing.append(path)
    assert not missing, f"{document.name} names files or folders that do not exist: {sorted(set(missing))}"


@pytest.mark.parametrize("document", documents(), ids=lambda p: p.name)
def test_every_dotted_name_of_the_course_imports(document):
    missing = []
    for match in DOTTED.finditer(text_of(document)):
        name = match.group(1)
        parts = name.split(".")
        obj, i = None, len(parts)
        while i > 0:  # the longest importable module prefix, then attributes
            try:
                obj = importlib.import_module(".".join(parts[:i]))
                break
            except ModuleNotFoundError:
                i -= 1
        for attr in parts[i:]:
            if obj is None or not hasattr(obj, attr):
                missing.append(name)
                break
            obj = getattr(obj, attr)
    assert not missing, f"{document.name} names code that does not exist: {sorted(set(missing))}"
