"""How big a notebook's runs are: full (what the committed outputs show) or quick (the test suite).

The notebooks are executed twice over their lives: once with their full sizes by
``python project/tools/execute_notebooks.py``, whose outputs are committed (what a reader sees on the
repository's page and the course's site), and on every test run (``pytest`` executes each notebook
top to bottom with :func:`execute`, ``conftest.py``) to prove that its cells still run. The second
only has to show that the code runs, and the whole suite has a time budget, so the test suite sets
``LLMSYS_NOTEBOOK_QUICK=1`` (``conftest.py``) and a notebook asks for its sizes with :func:`sized`::

    STEPS = sized(full=60, quick=8)      # training steps of section 3

The prose of a notebook is written so that it stays true for any outcome (it prints its comparisons
from the numbers), so a quick run's smaller, noisier numbers never contradict it. A learner running
a notebook by hand gets the full sizes (the variable is unset).

Every notebook's first code cell ends with :func:`print_machine`: the first output of a notebook says which
machine its numbers come from and how loaded it was (``course.benchmarking``'s measurement protocol;
``project/tools/execute_notebooks.py`` checks the machine before the run and hands its record to the kernel).
"""
from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import TypeVar

QUICK_ENV = "LLMSYS_NOTEBOOK_QUICK"
# The machine record project/tools/execute_notebooks.py made before the run (JSON of machine_record()), read by
# print_machine() in the notebook's kernel.
MACHINE_ENV = "LLMSYS_NOTEBOOK_MACHINE"

T = TypeVar("T")


def quick() -> bool:
    """Whether this process runs the notebooks' quick sizes (``LLMSYS_NOTEBOOK_QUICK=1``)."""
    return os.environ.get(QUICK_ENV, "") == "1"


def sized(full: T, quick: T) -> T:
    """``quick`` in the test suite's quick runs, else ``full`` (see the module docstring)."""
    return quick if globals()["quick"]() else full


def describe() -> str:
    """One line a notebook prints at its top: which sizes this run uses."""
    if quick():
        return ("quick run (LLMSYS_NOTEBOOK_QUICK=1, as the test suite runs it): sizes reduced, numbers noisier than "
                "the committed outputs'")
    return "full run: the sizes of the committed outputs"


def machine_record(device=None, busy_ranks: int | None = None) -> dict:
    """The machine a notebook runs on, taken before it starts any rank: :func:`course.benchmarking.machine`
    (cores, CPU, device, torch, the load average and the other processes' runnable threads), its ``conditions``
    (:func:`course.benchmarking.conditions`) for ``busy_ranks`` — the most ranks the notebook's wall-clock
    timings keep busy at once, by default every usable core: ``quiet`` only when they and the other processes'
    runnable threads fit the cores — and ``date`` (UTC, to the minute). ``device``: ``None`` for the CPU,
    ``"cuda"`` to name the GPUs too."""
    from course.benchmarking import conditions, machine

    info = machine(device)
    if busy_ranks is None:
        busy_ranks = info["usable_cores"] if str(info["device"]).startswith("cpu") else 0
    info["busy_ranks"] = int(busy_ranks)
    info["ranks_per_core"] = round(int(busy_ranks) / max(1, info["usable_cores"]), 3)
    info["conditions"] = conditions(info)
    info["date"] = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    return info


def machine_line(info: dict, checked_by: str | None = None) -> str:
    """One line for the top of a notebook: :func:`course.benchmarking.describe` of ``info`` (a
    :func:`machine_record`), its date, and who took it (``checked_by``, or "when this cell ran")."""
    from course.benchmarking import describe as describe_machine

    taken = f"checked by {checked_by} before the run" if checked_by else "measured when this cell ran"
    return f"machine: {describe_machine(info)}; {info['date']} ({taken})"


def print_machine(busy_ranks: int | None = None) -> None:
    """Print the machine this notebook runs on (:func:`machine_line`): the record ``project/tools/execute_notebooks.py``
    made before the run (environment variable ``LLMSYS_NOTEBOOK_MACHINE``), else one measured now, for
    ``busy_ranks`` (:func:`machine_record`). Called at the end of every notebook's first code cell, so that it is
    the notebook's first output."""
    given = os.environ.get(MACHINE_ENV)
    if given:
        info = json.loads(given)
        if busy_ranks is not None and info.get("busy_ranks") != busy_ranks:
            from course.benchmarking import conditions

            info["busy_ranks"] = int(busy_ranks)
            info["ranks_per_core"] = round(int(busy_ranks) / max(1, info.get("usable_cores") or 1), 3)
            info["conditions"] = conditions(info)
        print(machine_line(info, checked_by="project/tools/execute_notebooks.py"))
        return
    import torch

    print(machine_line(machine_record("cuda" if torch.cuda.is_available() else None, busy_ranks)))


def execute(path: str | os.PathLike, timeout: float = 900.0):
    """Run the notebook ``path`` top to bottom in a Jupyter kernel (``nbclient``), in the notebook's own folder
    as a learner would; returns the executed notebook (an ``nbformat`` node; the file is not written).

    ``timeout`` is the seconds one cell may take. A cell tagged ``raises-exception`` may raise.

    Raises:
        nbclient.exceptions.CellExecutionError: a cell raised (its traceback is in the message).
        nbclient.exceptions.CellTimeoutError: a cell ran longer than ``timeout``.
    """
    import nbformat
    from nbclient import NotebookClient

    path = Path(path)
    notebook = nbformat.read(path, as_version=4)
    NotebookClient(notebook, timeout=timeout, kernel_name="python3",
                   resources={"metadata": {"path": str(path.parent)}}).execute()
    return notebook
