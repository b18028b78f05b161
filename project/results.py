"""Results files of a run (COURSE_DESIGN.md §7).

Each script writes, per rank and epoch, ``{prefix}rank{r}_results_epoch{e}.json`` in its
work directory (data parallel: no prefix; pipeline: ``pipeline_<mode>_``; tensor
parallel: ``tensor_parallel_``). Every file holds at least ``validation_loss``, ``bleu``,
``training_time`` (seconds of the epoch's training), ``tokens_per_sec`` and ``config``
(world size, batch size, mode, preset, device, back-end, ...). Notebooks read them back
with :func:`load_results`.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

REQUIRED_KEYS = ("validation_loss", "bleu", "training_time", "tokens_per_sec", "config")


def results_name(rank: int, epoch: int, prefix: str = "") -> str:
    """``{prefix}rank{rank}_results_epoch{epoch}.json``."""
    return f"{prefix}rank{rank}_results_epoch{epoch}.json"


def write_json(path: str | os.PathLike, payload) -> Path:
    """Write ``payload`` as indented JSON, atomically (no half-written file is ever read)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(payload, indent=2, sort_keys=True))
    os.replace(tmp, path)
    return path


def write_results(workdir: str | os.PathLike, rank: int, epoch: int, payload: dict, prefix: str = "") -> Path:
    """Write one rank's results of one epoch.

    Raises:
        ValueError: a key of ``REQUIRED_KEYS`` is missing from ``payload``.
    """
    missing = [k for k in REQUIRED_KEYS if k not in payload]
    if missing:
        raise ValueError(f"results lack {missing}")
    return write_json(Path(workdir) / results_name(rank, epoch, prefix), dict(payload, rank=rank, epoch=epoch))


def load_results(workdir: str | os.PathLike, pattern: str = "*rank*_results_epoch*.json"):
    """Every results file under ``workdir`` matching ``pattern`` as a ``pandas.DataFrame``.

    One row per file; the ``config`` entries become ``config.<key>`` columns, and the
    file name is in ``file``.

    Raises:
        FileNotFoundError: no file matches.
    """
    import pandas as pd

    files = sorted(Path(workdir).glob(pattern))
    if not files:
        raise FileNotFoundError(f"no results files {pattern} in {workdir}; run a script first")
    rows = []
    for f in files:
        data = json.loads(f.read_text())
        data["file"] = f.name
        rows.append(data)
    return pd.json_normalize(rows, sep=".")
