"""The notebooks are committed with the outputs of a full run of their current cells.

``python project/tools/execute_notebooks.py`` runs every notebook top to bottom and records a hash of its
cells (``metadata.llmsys.source_sha256``). A notebook whose cells were edited after its outputs were
made, or that was committed without running, fails here with the command that fixes it. The numbers
themselves are not asked to repeat (they are measurements), but the run follows the measurement protocol
(docs/architecture.md, "The benchmark harness"): the first output describes the machine and its load, the
script waits for or refuses a loaded machine, and no output holds an absolute path of it. Instructor-only:
the student release clears every output (instructor/release.py, ``stub_notebook``).
"""
from __future__ import annotations

import json
import sysconfig
import tempfile
from pathlib import Path

import pytest

from course.benchmarking import conditions
from project.tools.execute_notebooks import (REPO, LoadedMachine, absolute_paths, course_notebooks, machine_prefixes,
                                       source_hash, strip_paths, wait_for_quiet)

NOTEBOOKS = course_notebooks()
FIX = "run `python project/tools/execute_notebooks.py {prefix}` and commit the notebook"


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


# ---- the measurement protocol: the machine recorded, no absolute path (docs/architecture.md) ----------------------

@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name[:2])
def test_committed_outputs_hold_no_absolute_path(path: Path):
    # Fails for a notebook whose outputs were made before execute_notebooks stripped the machine's paths:
    # regenerating it (the command below) fixes that.
    left = absolute_paths(json.loads(path.read_text(encoding="utf-8")))
    assert not left, f"{path.name}: absolute paths in the outputs {left[:5]}: {FIX.format(prefix=path.name[:2])}"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name[:2])
def test_committed_outputs_start_with_the_machine_they_come_from(path: Path):
    notebook = json.loads(path.read_text(encoding="utf-8"))
    fix = FIX.format(prefix=path.name[:2])
    first = next(c for c in notebook["cells"] if c["cell_type"] == "code")
    assert "".join(first["source"]).rstrip().endswith("print_machine()"), \
        f"{path.name}: the first code cell should end with print_machine() (course/notebook_run.py)"
    recorded = notebook.get("metadata", {}).get("llmsys", {}).get("machine", {})
    assert recorded.get("conditions") in ("quiet", "loaded"), f"{path.name}: no machine record of the run: {fix}"
    printed = "".join("".join(o.get("text", "")) for o in first.get("outputs", []))
    assert printed.startswith("machine: ") and f"conditions: {recorded['conditions']}" in printed, \
        f"{path.name}: the first output does not describe the machine: {fix}"


def _machine(load: float, cores: int = 2) -> dict:
    info = {"cores": cores, "usable_cores": cores, "cpu_model": "a CPU", "device": "cpu", "torch": "2.x",
            "timer": "host-clock", "load_average": [load, load, load], "date": "2030-01-01 00:00 UTC"}
    info["conditions"] = conditions(info)
    return info


class _Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self) -> float:
        return self.t

    def sleep(self, seconds: float) -> None:
        self.t += seconds


def test_the_run_waits_for_a_quiet_machine():
    clock, loads = _Clock(), iter([3.0, 2.5, 0.5])  # loaded, loaded, then quiet on 2 cores
    info = wait_for_quiet(120, poll_s=15, measure=lambda: _machine(next(loads)), clock=clock, sleep=clock.sleep)
    assert info["conditions"] == "quiet" and info["load_average"][0] == 0.5 and clock.t == 30



def test_the_run_waits_for_the_last_minute_to_drain_though_no_other_work_runs_now():
    """Nothing else runnable (quiet by the sampled threads), but the load average still holds the previous
    notebook's ranks: the next notebook waits until it has drained below half the cores."""
    clock, loads = _Clock(), iter([2.0, 1.4, 0.9])
    info = wait_for_quiet(120, poll_s=15, measure=lambda: {**_machine(next(loads)), "conditions": "quiet"},
                          clock=clock, sleep=clock.sleep)
    assert info["load_average"][0] == 0.9 and clock.t == 30

def test_the_run_refuses_a_machine_that_stays_loaded_unless_allowed():
    clock = _Clock()
    with pytest.raises(LoadedMachine, match=r"(?s)loaded.*2 cores.*--wait.*--allow_loaded"):
        wait_for_quiet(60, poll_s=15, measure=lambda: _machine(3.0), clock=clock, sleep=clock.sleep)
    assert clock.t == 60, "it polls until the wait is over, no longer"
    info = wait_for_quiet(0, allow_loaded=True, measure=lambda: _machine(3.0), clock=clock, sleep=clock.sleep)
    assert info["conditions"] == "loaded", "with --allow_loaded it runs, and the record says loaded"


def test_a_loaded_machine_runs_no_notebook(monkeypatch, capsys):
    import course.notebook_run
    import project.tools.execute_notebooks as script

    monkeypatch.setattr(course.notebook_run, "machine_record", lambda device=None: _machine(9.0))
    monkeypatch.setattr(script, "execute", lambda *a, **k: pytest.fail("a notebook ran on a loaded machine"))
    assert script.main(["01", "--wait", "0"]) == 2
    assert "--allow_loaded" in capsys.readouterr().err


def test_the_post_processing_leaves_no_absolute_path_of_the_machine(tmp_path):
    home, repo = str(Path.home()), str(REPO)
    site = sysconfig.get_paths()["purelib"]
    temp = tempfile.gettempdir()
    png = "iVBORw0KGgo" + repo  # base64 data is not text: left alone
    notebook = {"cells": [
        {"cell_type": "markdown", "source": f"written by hand: {repo}"},
        {"cell_type": "code", "source": "", "outputs": [
            {"output_type": "stream", "name": "stdout",
             "text": [f"results: {repo}/workdir/notebook01/ws1/rank*_results_epoch*.json\n",
                      f"cache: {home}/.cache/x\n"]},
            {"output_type": "stream", "name": "stderr",
             "text": f"{site}/torch/nn/modules/module.py:12: UserWarning: w\n"},
            {"output_type": "display_data", "data": {"text/html": f"<td>{temp}/llmsys_pool_1/a.json</td>",
                                                     "text/plain": f"'{repo}'", "image/png": png}},
            {"output_type": "error", "ename": "E", "evalue": f"{repo}/x.py",
             "traceback": [f"File {repo}/course/launch.py:3", "/var/tmp/kept? no: /var/tmp is not the temp folder"]},
        ]}]}
    assert len(absolute_paths(notebook)) >= 6
    strip_paths(notebook, machine_prefixes(REPO / "notebooks"))
    outputs = notebook["cells"][1]["outputs"]
    assert outputs[0]["text"] == ["results: ../workdir/notebook01/ws1/rank*_results_epoch*.json\n",
                                  "cache: ~/.cache/x\n"]
    assert outputs[1]["text"].startswith("site-packages/torch/nn/modules/module.py:12")
    assert outputs[2]["data"]["text/html"] == "<td>$TMPDIR/llmsys_pool_1/a.json</td>"
    assert outputs[2]["data"]["text/plain"] == "'..'" and outputs[2]["data"]["image/png"] == png
    assert outputs[3]["evalue"] == "../x.py" and outputs[3]["traceback"][0] == "File ../course/launch.py:3"
    assert notebook["cells"][0]["source"] == f"written by hand: {repo}", "only outputs are rewritten"
    # what is not one of the machine's folders is left as it was, and still found
    assert absolute_paths(notebook) == [(1, "/var/tmp"), (1, "/var/tmp")]
