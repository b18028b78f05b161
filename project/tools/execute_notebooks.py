"""Execute the course notebooks and commit them with their outputs (issue: readable without running).

    python project/tools/execute_notebooks.py                 # every notebook in notebooks/, in course order
    python project/tools/execute_notebooks.py 02 06           # the notebooks whose names start with 02 and 06
    python project/tools/execute_notebooks.py --wait 600      # wait up to 10 minutes for a quiet machine
    python project/tools/execute_notebooks.py --allow_loaded  # run on a loaded machine (the notebooks say so)

Each notebook is run top to bottom by a Jupyter kernel (``nbclient``), in its own folder, as a learner
would run it; its outputs are written back into the file (to a temporary name, then renamed), with
``metadata.llmsys.source_sha256``: a hash of every cell's source at the time of the run. The test
``tests/instructor/test_notebook_outputs.py`` compares that hash with the cells now in the file, so
a notebook whose cells changed after its outputs were made is noticed, without asking its numbers
to repeat (instructor-only: the student release clears every output).

**The machine** (docs/architecture.md, "The benchmark harness": committed outputs come from a quiet machine,
carry its description and hold no absolute path of it). Before each notebook the machine is checked
(:func:`course.notebook_run.machine_record`: the load of the other processes, classed ``quiet`` or
``loaded``); while it is loaded the script waits, polling, up to ``--wait`` seconds for it to become quiet,
then refuses with a message, unless ``--allow_loaded``. The record goes to the kernel, whose first code cell
prints it (:func:`course.notebook_run.print_machine`: the notebook's first output), and into
``metadata.llmsys.machine`` with the load average after the run.

**No absolute path**: after the run, :func:`strip_paths` rewrites every output's text so that the
repository's root becomes ``..`` (the notebooks' folder is its child), Python's library folders
``site-packages/`` and ``pythonX.Y/``, the home folder ``~`` and the temporary folder ``$TMPDIR``;
:func:`absolute_paths` lists any that remain, and the script then fails naming their cells.

A cell that raises stops the run with the notebook's name and the cell, unless the cell is tagged
``raises-exception`` (it is meant to show an error).
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import sys
import sysconfig
import tempfile
import time
from pathlib import Path
from typing import Callable

REPO = Path(__file__).resolve().parents[2]
if __name__ == "__main__":  # run as a file: import the packages of the tree this script sits in
    sys.path.insert(0, str(REPO))
NOTEBOOKS = REPO / "notebooks"
CELL_TIMEOUT_S = 900
WAIT_S = 120.0  # how long to wait for a quiet machine: a 1-minute load average falls by e^-2 in two minutes
POLL_S = 15.0
BINARY_MIME = ("image/png", "image/jpeg", "image/gif")  # base64: no text to rewrite
# An absolute POSIX path of at least two segments, starting where a path can start (not inside a URL, a
# fraction such as tokens/s, or an HTML closing tag).
ABSOLUTE_PATH = re.compile(r"(?:^|(?<=[\s'\"(\[=:,>]))/[\w.-]+/[\w.*-]+")


class LoadedMachine(RuntimeError):
    """The machine stayed loaded for the whole wait (the message says what to do)."""


def source_hash(notebook: dict) -> str:
    """sha256 of every cell's type and source, in order (outputs and metadata left out)."""
    digest = hashlib.sha256()
    for cell in notebook["cells"]:
        source = cell["source"] if isinstance(cell["source"], str) else "".join(cell["source"])
        digest.update(cell["cell_type"].encode() + b"\0" + source.encode("utf-8") + b"\0")
    return digest.hexdigest()


def course_notebooks(prefixes: list[str] | None = None) -> list[Path]:
    """The notebooks of ``notebooks/`` in course order (by name), or those whose names start with a prefix."""
    found = sorted(NOTEBOOKS.glob("[0-9][0-9]_*.ipynb"))
    if prefixes:
        found = [p for p in found if any(p.name.startswith(prefix) for prefix in prefixes)]
    return found


# ---- the machine ------------------------------------------------------------------------------------

def settled(info: dict) -> bool:
    """Whether a notebook may start on ``info``'s machine: ``quiet`` (the notebook's busy ranks and the other
    processes' runnable threads fit the cores now, :func:`course.benchmarking.conditions`) and its 1-minute load
    average at most half the cores, so that the
    work of the last minute — the previous notebook's ranks included — has drained and every figure the
    notebook prints starts from an idle machine."""
    cores = max(1, int(info.get("usable_cores") or info.get("cores") or 1))
    load = info.get("load_average")
    return info["conditions"] == "quiet" and (not load or load[0] <= cores / 2)


def wait_for_quiet(wait_s: float = WAIT_S, allow_loaded: bool = False, poll_s: float = POLL_S,
                   measure: Callable[[], dict] | None = None, clock: Callable[[], float] = time.monotonic,
                   sleep: Callable[[float], None] = time.sleep) -> dict:
    """The machine's record (:func:`course.notebook_run.machine_record`) once it has :func:`settled`: measured
    now, then every ``poll_s`` seconds for up to ``wait_s`` seconds while it has not.

    Returns:
        the last record (``conditions`` ``loaded`` only with ``allow_loaded``).
    Raises:
        LoadedMachine: still not quiet after ``wait_s`` seconds (and not ``allow_loaded``); the message gives
            the load, the cores and the options that change the outcome.
    """
    if measure is None:
        from course.notebook_run import machine_record

        import torch

        def measure():
            return machine_record("cuda" if torch.cuda.is_available() else None)

    deadline = clock() + wait_s
    info = measure()
    while not settled(info) and clock() < deadline:
        sleep(max(0.0, min(poll_s, deadline - clock())))
        info = measure()
    if not settled(info) and not allow_loaded:
        from course.benchmarking import describe

        cores = info.get("usable_cores") or info.get("cores")
        raise LoadedMachine(
            f"the machine is {info['conditions']} ({describe(info)}): the other processes' runnable threads leave its "
            f"{cores} cores no room for the notebook's busy ranks, or its 1-minute load average is above {cores / 2:g}, "
            f"and it stayed so for the {wait_s:.0f} s waited. Committed outputs come from a quiet machine (docs/architecture.md, 'The benchmark harness'). "
            f"Stop the other work and run again, wait longer (--wait SECONDS), or run anyway with --allow_loaded: "
            f"the notebooks then print and record 'conditions: {info['conditions']}'.")
    return info


# ---- absolute paths ---------------------------------------------------------------------------------

def machine_prefixes(notebook_dir: Path) -> list[tuple[str, str]]:
    """``(absolute prefix, what replaces it)`` of this machine's folders, the most specific first: the
    repository (relative to ``notebook_dir``), Python's library folders, the home and the temporary folder."""
    def both(path) -> list[str]:  # as written and with links resolved
        return list(dict.fromkeys(p.rstrip("/") for p in (os.path.abspath(path), os.path.realpath(path)) if p != "/"))

    pairs = []
    for prefix in both(REPO):
        pairs.append((prefix, os.path.relpath(REPO, notebook_dir)))
    for key in ("purelib", "platlib"):
        pairs += [(prefix, "site-packages") for prefix in both(sysconfig.get_paths()[key])]
    stdlib = sysconfig.get_paths()["stdlib"]
    pairs += [(prefix, Path(stdlib).name) for prefix in both(stdlib)]
    pairs += [(prefix, "~") for prefix in both(Path.home())]
    pairs += [(prefix, "$TMPDIR") for prefix in both(tempfile.gettempdir())]
    return sorted(dict(pairs).items(), key=lambda pair: -len(pair[0]))  # /home/u/course before /home/u


def _rewrite(value, replace: Callable[[str], str]):
    """``value`` with ``replace`` applied to every string in it; lists and dicts are changed in place (a
    notebook's nodes keep their type), base64 images left alone."""
    if isinstance(value, str):
        return replace(value)
    if isinstance(value, list):
        for i, item in enumerate(value):
            value[i] = _rewrite(item, replace)
    elif isinstance(value, dict):
        for key, item in value.items():
            if key not in BINARY_MIME:
                value[key] = _rewrite(item, replace)
    return value


def strip_paths(notebook: dict, prefixes: list[tuple[str, str]]) -> dict:
    """Rewrite every output of ``notebook`` (stream text, every text-like MIME type, error tracebacks; base64
    images left alone) so that each absolute ``prefix`` of ``prefixes`` (:func:`machine_prefixes`) becomes its
    relative form: ``/work/course/workdir/x`` -> ``../workdir/x``. A prefix counts only as a whole path
    (``/tmp`` is not rewritten in ``/var/tmp`` or ``/tmpfiles``). Changes ``notebook`` in place and returns it."""
    if not prefixes:
        return notebook
    replacement = dict(prefixes)
    pattern = re.compile(r"(?<![\w./-])(" + "|".join(re.escape(p) for p, _ in prefixes) + r")(?![\w.-])")
    for cell in notebook["cells"]:
        _rewrite(cell.get("outputs", []), lambda text: pattern.sub(lambda m: replacement[m.group(1)], text))
    return notebook


def absolute_paths(notebook: dict) -> list[tuple[int, str]]:
    """``(cell index, path)`` of every absolute path left in the outputs' text (base64 images left out)."""
    found: list[tuple[int, str]] = []
    for i, cell in enumerate(notebook["cells"]):
        def note(text: str, i=i) -> str:
            found.extend((i, m.group(0)) for m in ABSOLUTE_PATH.finditer(text))
            return text

        _rewrite(cell.get("outputs", []), note)
    return found


# ---- the run ----------------------------------------------------------------------------------------

def execute(path: Path, timeout: float = CELL_TIMEOUT_S, info: dict | None = None) -> float:
    """Run ``path`` in place with a Jupyter kernel; returns the seconds it took. ``info``: the machine's record
    (:func:`wait_for_quiet`), printed by the notebook's first code cell and kept in its metadata.

    Raises:
        nbclient.exceptions.CellExecutionError: a cell not tagged ``raises-exception`` raised.
    """
    import nbformat

    from course.notebook_run import MACHINE_ENV, QUICK_ENV, execute as run_notebook

    os.environ.pop(QUICK_ENV, None)  # the committed outputs are full runs (course/notebook_run.py)
    if info is not None:
        os.environ[MACHINE_ENV] = json.dumps(info)  # the kernel inherits it: print_machine() prints this record
    began = time.perf_counter()
    try:
        notebook = run_notebook(path, timeout)
    finally:
        os.environ.pop(MACHINE_ENV, None)
    seconds = time.perf_counter() - began
    strip_paths(notebook, machine_prefixes(path.parent))
    machine = dict(info or {})
    # the load at the end, the notebook's own ranks included (so not a verdict on the others' load)
    machine["load_average_after"] = list(os.getloadavg()) if hasattr(os, "getloadavg") else None
    notebook.metadata["llmsys"] = {
        "source_sha256": source_hash(notebook),
        "executed_by": "python project/tools/execute_notebooks.py",
        "machine": machine,
        "executed_at": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "seconds": round(seconds, 1),
    }
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    nbformat.write(notebook, tmp)
    os.replace(tmp, path)
    return seconds


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("prefixes", nargs="*", help="notebook name prefixes (e.g. 02 06); default: all")
    parser.add_argument("--timeout", type=float, default=CELL_TIMEOUT_S, help="seconds a cell may take")
    parser.add_argument("--wait", type=float, default=WAIT_S,
                        help="seconds to wait, before each notebook, for a loaded machine to become quiet")
    parser.add_argument("--allow_loaded", action="store_true",
                        help="run on a loaded machine anyway (the notebooks print and record 'conditions: loaded')")
    args = parser.parse_args(argv)
    if args.wait < 0:
        parser.error(f"--wait is seconds to wait (>= 0), not {args.wait}")
    paths = course_notebooks(args.prefixes)
    if not paths:
        parser.error(f"no notebook in {NOTEBOOKS} starts with {' or '.join(args.prefixes)}")
    left = {}
    for path in paths:
        try:
            info = wait_for_quiet(args.wait, args.allow_loaded)
        except LoadedMachine as exc:
            print(f"{path.name} not run: {exc}", file=sys.stderr)
            return 2
        print(f"{path.name} ... (conditions: {info['conditions']})", flush=True)
        seconds = execute(path, args.timeout, info)
        print(f"{path.name}: {seconds:.0f} s", flush=True)
        left.update({f"{path.name} cell {i}": p for i, p in absolute_paths(json.loads(path.read_text()))})
    print(json.dumps({p.name: json.loads(p.read_text())["metadata"]["llmsys"]["seconds"] for p in paths}))
    if left:
        print("absolute paths left in the outputs (print paths relative to the working folder where they are made):\n"
              + "\n".join(f"  {where}: {p}" for where, p in left.items()), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
