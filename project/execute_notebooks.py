"""Execute the course notebooks and commit them with their outputs (issue: readable without running).

    python project/execute_notebooks.py                 # every notebook in notebooks/, in course order
    python project/execute_notebooks.py 02 06           # the notebooks whose names start with 02 and 06

Each notebook is run top to bottom by a Jupyter kernel (``nbclient``), in its own folder, as a learner
would run it; its outputs are written back into the file (to a temporary name, then renamed), with
``metadata.llmsys.source_sha256``: a hash of every cell's source at the time of the run. The test
``tests/instructor/test_notebook_outputs.py`` compares that hash with the cells now in the file, so
a notebook whose cells changed after its outputs were made is noticed, without asking its numbers
to repeat (instructor-only: the student release clears every output). The machine the outputs came from (cores, torch, when) is recorded beside the hash.

A cell that raises stops the run with the notebook's name and the cell, unless the cell is tagged
``raises-exception`` (it is meant to show an error).
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if __name__ == "__main__":  # run as a file: import the packages of the tree this script sits in
    sys.path.insert(0, str(REPO))
NOTEBOOKS = REPO / "notebooks"
CELL_TIMEOUT_S = 900


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


def execute(path: Path, timeout: float = CELL_TIMEOUT_S) -> float:
    """Run ``path`` in place with a Jupyter kernel; returns the seconds it took.

    Raises:
        nbclient.exceptions.CellExecutionError: a cell not tagged ``raises-exception`` raised.
    """
    import nbformat

    from course.notebook_run import QUICK_ENV, execute as run_notebook

    os.environ.pop(QUICK_ENV, None)  # the committed outputs are full runs (course/notebook_run.py)
    began = time.perf_counter()
    notebook = run_notebook(path, timeout)
    seconds = time.perf_counter() - began
    import torch

    notebook.metadata["llmsys"] = {
        "source_sha256": source_hash(notebook),
        "executed_by": "python project/execute_notebooks.py",
        "machine": {"cpu_count": os.cpu_count(), "platform": platform.platform(), "torch": torch.__version__,
                    "cuda_devices": torch.cuda.device_count()},
        "executed_at": time.strftime("%Y-%m-%d %H:%M %Z"),
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
    args = parser.parse_args(argv)
    paths = course_notebooks(args.prefixes)
    if not paths:
        parser.error(f"no notebook in {NOTEBOOKS} starts with {' or '.join(args.prefixes)}")
    for path in paths:
        print(f"{path.name} ...", flush=True)
        seconds = execute(path, args.timeout)
        print(f"{path.name}: {seconds:.0f} s", flush=True)
    print(json.dumps({p.name: json.loads(p.read_text())["metadata"]["llmsys"]["seconds"] for p in paths}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
