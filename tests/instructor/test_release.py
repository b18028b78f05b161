"""The student-release generator and the grader (instructor tools; not shipped to students)."""
import ast
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from instructor.blocks import ReleaseError, find_blocks, stub_notebook, stub_source
from instructor.release import make_release

REPO = Path(__file__).resolve().parents[2]


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
    root = Path(__file__).resolve().parents[2]
    counts = make_release(root, tmp_path / "release")
    assert {"ASSIGN5_1_1", "ASSIGN5_1_2", "ASSIGN5_1_3"} <= set(counts)
    release = tmp_path / "release"
    for name in ("instructor/release.py", "instructor/integrity.py", "instructor/gradescope.py", "tests/instructor"):
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
    # The grader ships whole: its --help runs from the release alone (-S: no installed copy of the course
    # can fill in a module the release lacks) and says what it does there.
    done = subprocess.run([sys.executable, "-S", "instructor/grade.py", "--help"], cwd=release, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "block policy" in done.stdout and "in a student's copy, the student's own code" in " ".join(done.stdout.split())


def test_notebook_cells_that_need_an_assignment_get_its_guard_in_the_release():
    nb = {"cells": [{"cell_type": "code", "source": "x = 1", "metadata": {"needs": ["a5_1_2", "a5_1_1"]},
                     "outputs": [], "execution_count": None},
                    {"cell_type": "code", "source": "y = 2", "metadata": {}, "outputs": [], "execution_count": None}],
          "metadata": {}, "nbformat": 4, "nbformat_minor": 5}
    text, _ = stub_notebook(json.dumps(nb), "nb.ipynb")
    cells = json.loads(text)["cells"]
    assert cells[0]["source"].startswith("from course.assignments import require; require('a5_1_2', 'a5_1_1')")
    assert cells[0]["source"].endswith("x = 1")
    assert "raises-exception" in cells[0]["metadata"]["tags"]
    assert cells[1]["source"] == "y = 2" and "tags" not in cells[1]["metadata"]
    nb["cells"][0]["metadata"]["needs"] = ["a5_9_9"]
    with pytest.raises(ReleaseError, match="unknown keys"):
        stub_notebook(json.dumps(nb), "nb.ipynb")


def test_require_names_the_unfinished_assignment_and_passes_once_it_is_written(tmp_path):
    from course.assignments import AssignmentNotDone, require

    package = tmp_path / "part"
    package.mkdir()
    source = m('def f():\n    # @B ASSIGN5_1_2\n    raise NotImplementedError("Assignment 5.1.2: implement f")\n'
               '    # @E ASSIGN5_1_2\n')
    (package / "code.py").write_text(source)
    with pytest.raises(AssignmentNotDone, match=r"5\.1\.2 in part/code\.py: Assignment 5\.1\.2: implement f"):
        require("a5_1_2", tree=tmp_path)
    require("a5_1_1", tree=tmp_path)  # not a stub here: nothing to say
    (package / "code.py").write_text(source.replace('raise NotImplementedError("Assignment 5.1.2: implement f")',
                                                    "return 42"))
    require("a5_1_2", tree=tmp_path)  # written: the cell runs


@pytest.mark.timeout(600)
def test_the_release_notebooks_run_to_the_end_with_only_stub_dependent_cells_stopping(tmp_path, monkeypatch):
    """Executed top to bottom as a student would before solving anything: every cell that needs no
    assignment runs, every cell that needs one stops with that assignment's message, and the
    notebook goes on to the end."""
    import asyncio

    import nbformat
    from nbclient import NotebookClient

    from course.data import resolve_data_dir

    release = tmp_path / "release"
    make_release(REPO, release)
    monkeypatch.setenv("LLMSYS_DATA_DIR", str(resolve_data_dir(download=False)))  # the release has no ../shared
    async def execute(path, running):
        async with running:
            nb = nbformat.read(path, 4)
            await NotebookClient(nb, timeout=300, kernel_name="python3",
                                 resources={"metadata": {"path": str(path.parent)}}).async_execute()
            return path, nb

    async def execute_all(paths):  # two kernels at a time: much of a kernel's life is waiting, not computing
        running = asyncio.Semaphore(2)
        return await asyncio.gather(*(execute(path, running) for path in paths))

    problems = []
    for path, nb in asyncio.run(execute_all(sorted((release / "notebooks").glob("*.ipynb")))):
        for index, cell in enumerate(nb.cells):
            if cell.cell_type != "code":
                continue
            errors = [o for o in cell.get("outputs", []) if o.get("output_type") == "error"]
            if cell.metadata.get("needs"):
                if not any(e.get("ename") == "AssignmentNotDone" for e in errors):
                    problems.append(f"{path.name} cell {index} needs {cell.metadata['needs']} but did not stop with "
                                    f"AssignmentNotDone: {[e.get('ename') for e in errors]}")
            elif errors:
                problems.append(f"{path.name} cell {index} needs no assignment but failed: "
                                f"{errors[0].get('ename')}: {errors[0].get('evalue')}")
    assert not problems, "\n".join(problems)


def test_the_readme_student_section_names_every_part_folder():
    """A student learns where the blocks are from the README: every part package (course_parts) is listed."""
    from instructor.policy import course_parts

    readme = (REPO / "README.md").read_text()
    section = readme.split("## For students", 1)[1].split("\n## ", 1)[0]
    missing = sorted(part for part in course_parts(REPO) if f"`{part}/`" not in section)
    assert not missing, f"README.md's student section does not name {missing}"
