"""Results files of a run (docs/architecture.md, "Results files").

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

from course.launch import in_torchrun

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


def print_epoch_table(workdir, prefix: str = "", n_epochs: int = 1, rank: int = 0) -> None:
    """Print rank ``rank``'s results per epoch: validation loss, BLEU, time, tokens/s.

    Under torchrun only the process of that rank prints (the others have no file to read yet).
    """
    if in_torchrun() and int(os.environ["RANK"]) != rank:
        return
    print(f"{'epoch':>5} {'val loss':>9} {'BLEU':>6} {'time (s)':>9} {'tokens/s':>10} {'all ranks tok/s':>16}")
    for epoch in range(n_epochs):
        path = Path(workdir) / results_name(rank, epoch, prefix)
        r = json.loads(path.read_text())
        total = r.get("global_tokens_per_sec", r["tokens_per_sec"])
        print(f"{epoch:>5} {r['validation_loss']:>9.3f} {r['bleu']:>6.2f} {r['training_time']:>9.1f} "
              f"{r['tokens_per_sec']:>10.0f} {total:>16.0f}")
    # the folder as it was given (relative to where the run started): no absolute path of the machine in a notebook
    print(f"results: {Path(workdir) / f'{prefix}rank*_results_epoch*.json'}")
