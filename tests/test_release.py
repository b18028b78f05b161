"""The student-release generator and the grader (instructor tools; not shipped to students)."""
import ast
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from instructor.release import ReleaseError, find_blocks, make_release, stub_notebook, stub_source


def m(text: str) -> str:
    """Marker lines written as @B/@E here, so this file's own text holds no unpaired markers."""
    return text.replace("@B", "BEGIN").replace("@E", "END")


GOOD = m(textwrap.dedent('''
    def average_gradients(model):
        """Docstring kept."""
        world_size = 2
        # @B ASSIGN5_1_2
        for p in model.parameters():
            p.grad /= world_size
        # @E ASSIGN5_1_2
        return None
'''))


def test_a_block_becomes_a_stub_that_names_key_function_notebook_and_command():
    out, markers = stub_source(GOOD, "x.py")
    assert markers == ["ASSIGN5_1_2"]
    assert "p.grad /= world_size" not in out
    lines = out.split("\n")  # the marker lines stay around the stub: the student writes between them
    begin = lines.index(m("    # @B ASSIGN5_1_2"))
    assert lines[begin + 1].strip().startswith("raise NotImplementedError(") and lines[begin + 2] == m("    # @E ASSIGN5_1_2")
    assert '"""Docstring kept."""' in out and "world_size = 2" in out and "return None" in out
    ast.parse(out)
    namespace = {}
    exec(out, namespace)
    with pytest.raises(NotImplementedError) as info:
        namespace["average_gradients"](None)
    message = str(info.value)
    for part in ("Assignment 5.1.2", "average_gradients", "notebooks/01_data_parallel.ipynb", "pytest -k a5_1_2"):
        assert part in message


def test_only_stubs_the_chosen_keys():
    out, markers = stub_source(GOOD, "x.py", only={"ASSIGN5_1_1"})
    assert markers == [] and out == GOOD


@pytest.mark.parametrize("source,message", [
    (m("def f():\n    # @B ASSIGN5_1_2\n    pass\n"), m("x.py:2: @B ASSIGN5_1_2 has no END")),
    (m("def f():\n    pass\n    # @E ASSIGN5_1_2\n"), m("x.py:3: @E ASSIGN5_1_2 without a BEGIN")),
    (m("def f():\n    # @B ASSIGN5_1_2\n    # @B ASSIGN5_1_2\n    pass\n    # @E ASSIGN5_1_2\n    # @E ASSIGN5_1_2\n"), m("x.py:3: @B ASSIGN5_1_2 inside the block opened at line 2")),
    (m("def f():\n    # @B ASSIGN9_9_9\n    pass\n    # @E ASSIGN9_9_9\n"), m("x.py:2: unknown assignment key ASSIGN9_9_9")),
    (m("def f():\n    # @B ASSIGN5_1_2\n    pass\n    # @E ASSIGN5_1_1\n"), m("x.py:4: @E ASSIGN5_1_1 closes @B ASSIGN5_1_2")),
    (m("# @B ASSIGN5_1_2\nx = 1\n# @E ASSIGN5_1_2\n"), m("x.py:1: block ASSIGN5_1_2 is not inside a function")),
    (m("def f():\n    # BEGIN  ASSIGN5_1_2 extra\n    pass\n"), m("x.py:2: malformed marker line")),
])
def test_marker_errors_name_file_and_line(source, message):
    with pytest.raises(ReleaseError, match=message.replace("(", r"\(").replace(")", r"\)")):
        stub_source(source, "x.py")


def test_notebook_cells_are_stubbed_and_outputs_cleared():
    nb = {"cells": [{"cell_type": "code", "execution_count": 3, "metadata": {}, "outputs": [{"output_type": "stream"}],
                     "source": ["x = 1\n", m("# @B ASSIGN5_2_1\n"), "y = x + 1\n", m("# @E ASSIGN5_2_1\n")]},
                    {"cell_type": "markdown", "metadata": {}, "source": "text"}],
          "metadata": {}, "nbformat": 4, "nbformat_minor": 5}
    out, markers = stub_notebook(json.dumps(nb), "n.ipynb")
    cell = json.loads(out)["cells"][0]
    assert markers == ["ASSIGN5_2_1"] and cell["outputs"] == [] and cell["execution_count"] is None
    assert "raise NotImplementedError" in cell["source"] and "y = x + 1" not in cell["source"]


def test_release_of_this_repository_parses_has_only_stubs_and_keeps_instructor_files_out(tmp_path):
    root = Path(__file__).resolve().parent.parent
    counts = make_release(root, tmp_path / "release")
    assert {"ASSIGN5_1_1", "ASSIGN5_1_2", "ASSIGN5_1_3"} <= set(counts)
    release = tmp_path / "release"
    for name in ("instructor/release.py", "instructor/integrity.py", "instructor/gradescope.py", "tests/test_release.py",
                 "tests/test_grading.py"):
        assert not (release / name).exists(), f"{name} is instructor-only"
    for name in ("instructor/keys.py", "instructor/grade.py", "conftest.py"):
        assert (release / name).is_file(), f"{name} is needed by students"
    for path in list(release.rglob("*.py")) + list(release.rglob("*.ipynb")):
        text = path.read_text()
        for block in find_blocks(text.split("\n"), str(path)) if path.suffix == ".py" else []:
            body = [line for line in text.split("\n")[block.begin + 1:block.end] if line.strip()]
            assert len(body) == 1 and body[0].strip().startswith("raise NotImplementedError("), (path, block)
        if path.suffix == ".py":
            ast.parse(text)
    # The stubbed packages still import.
    code = "import data_parallel, data_parallel.training, course.launch"
    subprocess.run([sys.executable, "-c", code], cwd=release, check=True, timeout=120)
