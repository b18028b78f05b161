"""The notebooks are committed with the outputs of a full run of their current cells.

``python project/execute_notebooks.py`` runs every notebook top to bottom and records a hash of its
cells (``metadata.llmsys.source_sha256``). A notebook whose cells were edited after its outputs were
made, or that was committed without running, fails here with the command that fixes it. The numbers
themselves are not asked to repeat (they are measurements). Instructor-only: the student release
clears every output (instructor/release.py, ``stub_notebook``).
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from project.execute_notebooks import course_notebooks, source_hash

NOTEBOOKS = course_notebooks()
FIX = "run `python project/execute_notebooks.py {prefix}` and commit the notebook"


def test_there_are_notebooks():
    assert len(NOTEBOOKS) >= 8, [p.name for p in NOTEBOOKS]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name[:2])
def test_committed_outputs_come_from_the_current_cells(path: Path):
    notebook = json.loads(path.read_text(encoding="utf-8"))
    fix = FIX.format(prefix=path.name[:2])
    recorded = notebook.get("metadata", {}).get("llmsys", {}).get("source_sha256")
    assert recorded is not None, f"{path.name} was committed without a recorded run: {fix}"
    assert recorded == source_hash(notebook), f"{path.name}'s cells changed after its outputs were made: {fix}"
    code = [c for c in notebook["cells"] if c["cell_type"] == "code"]
    unrun = [i for i, c in enumerate(notebook["cells"]) if c["cell_type"] == "code" and c.get("execution_count") is None]
    assert not unrun, f"{path.name}: code cells {unrun} have no outputs of a run: {fix}"
    assert any(c.get("outputs") for c in code), f"{path.name} has no output at all: {fix}"
    for i, cell in enumerate(notebook["cells"]):
        if "raises-exception" in cell.get("metadata", {}).get("tags", []):
            continue
        errors = [o for o in cell.get("outputs", []) if o.get("output_type") == "error"]
        assert not errors, f"{path.name} cell {i} raised {errors[0].get('ename')}: fix it, then {fix}"


def test_the_hash_sees_an_edited_cell():
    notebook = json.loads(NOTEBOOKS[0].read_text(encoding="utf-8"))
    before = source_hash(notebook)
    notebook["cells"][-1]["source"] = "".join(notebook["cells"][-1]["source"]) + "\n# edited"
    assert source_hash(notebook) != before
