"""course.notebook_run: the notebooks' full and quick sizes."""
import os

from course.notebook_run import QUICK_ENV, describe, quick, sized


def test_the_suite_runs_the_quick_sizes():
    # conftest.py sets the variable for every process the tests start (the notebooks' kernels included)
    assert os.environ.get(QUICK_ENV) == "1" and quick()
    assert sized(full=60, quick=8) == 8
    assert describe().startswith("quick run")


def test_unset_is_full(monkeypatch):
    monkeypatch.delenv(QUICK_ENV)
    assert not quick() and sized(full=60, quick=8) == 60
    assert describe().startswith("full run")
    monkeypatch.setenv(QUICK_ENV, "0")
    assert sized(full=[1, 2], quick=[1]) == [1, 2]


def test_the_first_output_describes_the_machine(monkeypatch, capsys):
    import json

    from course.notebook_run import MACHINE_ENV, machine_record, print_machine

    monkeypatch.delenv(MACHINE_ENV, raising=False)
    print_machine()  # by hand: measured when the cell runs
    line = capsys.readouterr().out
    assert line.startswith("machine: ") and "cores" in line and "when this cell ran" in line
    assert any(f"conditions: {c}" in line for c in ("quiet", "loaded")), line
    record = machine_record()
    record.update(load_average=[7.0, 6.0, 5.0], conditions="loaded", date="2030-01-02 03:04 UTC")
    monkeypatch.setenv(MACHINE_ENV, json.dumps(record))  # what project/tools/execute_notebooks.py hands the kernel
    print_machine()
    line = capsys.readouterr().out
    assert "load average 7.0" in line and "conditions: loaded" in line and "2030-01-02 03:04 UTC" in line
    assert "execute_notebooks.py" in line
