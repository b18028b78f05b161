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
