"""Results files of a run (docs/architecture.md, "Results files").

Each script writes, per rank and epoch, ``{prefix}rank{r}_results_epoch{e}.json`` in its
work directory (data parallel: no prefix; pipeline: ``pipeline_<mode>_``; tensor
parallel: ``tensor_parallel_``). Every file holds at least ``validation_loss``, ``bleu``,
``training_time`` (seconds of the epoch's training), ``tokens_per_sec`` and ``config``
(world size, batch size, mode, preset, device, back-end, ...). Notebooks read them back
with :func:`load_results`.

**Results appear only when a run has succeeded.** While it runs, its ranks write into a folder of its own,
``<workdir>/.{prefix}results.incomplete/`` (:func:`staging_dir`); when every rank has finished, rank 0 moves the
files into ``<workdir>`` (:func:`publish_results`). So a run that fails — a rank that raises, a kill, a full disk
— leaves the previous results as they were, also with ``--overwrite``; results of a run with another number of
ranks are moved aside into a folder of their own (``{prefix}results_of_{W}_ranks_<time>/``) instead of being
mixed with the new ones. A resumed run keeps the files its interrupted predecessor staged (the epochs before the
checkpoint).
"""
from __future__ import annotations

import json
import os
import re
import shutil
import time
from pathlib import Path

from course.environment import in_torchrun

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


def staging_dir(workdir: str | os.PathLike, prefix: str = "") -> Path:
    """``<workdir>/.{prefix}results.incomplete``: where a run's ranks write its results until it has succeeded."""
    return Path(workdir) / f".{prefix}results.incomplete"


def run_files(folder: str | os.PathLike, prefix: str = "") -> list[Path]:
    """The files of one mode's run in ``folder``: every rank's results, the translations, the torch profiles."""
    patterns = (f"{prefix}rank*_results_epoch*.json", f"{prefix}translations_epoch*.json",
                f"{prefix}rank*_torch_profile.json")
    return sorted({p for pattern in patterns for p in Path(folder).glob(pattern) if p.is_file()})


def ranks_of(files: list[Path], prefix: str = "") -> int | None:
    """How many ranks wrote these results files (the largest ``rank{r}`` of their names, plus one); None if none."""
    ranks = [int(m.group(1)) for f in files for m in [re.match(rf"{re.escape(prefix)}rank(\d+)_", f.name)] if m]
    return max(ranks) + 1 if ranks else None


def move_aside(files: list[Path], workdir: str | os.PathLike, prefix: str, ranks: int) -> Path:
    """Move ``files`` (an earlier run's, written by ``ranks`` ranks) into a new folder
    ``<workdir>/{prefix}results_of_{ranks}_ranks_<YYYYmmdd-HHMMSS>/``; returns it."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    folder = Path(workdir) / f"{prefix}results_of_{ranks}_ranks_{stamp}"
    n = 1
    while folder.exists():
        n += 1
        folder = Path(workdir) / f"{prefix}results_of_{ranks}_ranks_{stamp}_{n}"
    folder.mkdir(parents=True)
    for f in files:
        os.replace(f, folder / f.name)
    return folder


def prepare_staging(workdir: str | os.PathLike, prefix: str, world_size: int, resuming: bool) -> Path:
    """Rank 0, before any rank writes a result: make the run's :func:`staging_dir` — empty for a fresh run; for a
    resumed run, holding what its predecessor staged (the earlier epochs), except files of another number of
    ranks, which are moved aside (:func:`move_aside`). Returns the folder."""
    staging = staging_dir(workdir, prefix)
    if not resuming:
        shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True, exist_ok=True)
    earlier = run_files(staging, prefix)
    ranks = ranks_of(earlier, prefix)
    if ranks is not None and ranks != world_size:
        folder = move_aside(earlier, workdir, prefix, ranks)
        print(f"moved the incomplete results of an earlier {ranks}-rank run aside to {folder}", flush=True)
    return staging


def publish_results(workdir: str | os.PathLike, prefix: str, world_size: int, resuming: bool) -> list[Path]:
    """Rank 0, once every rank of a run has written everything: move the staged files into ``workdir``.

    The results already there are replaced — by name; with ``resuming`` the files of earlier epochs that the run
    did not write again stay (they are the same run's) — and results of another number of ranks are moved aside
    first (:func:`move_aside`), so the folder never mixes two runs. The old files are moved out before the new
    ones move in, and removed only after.

    Returns:
        The published files.
    """
    workdir, staging = Path(workdir), staging_dir(workdir, prefix)
    new = run_files(staging, prefix)
    old = run_files(workdir, prefix)
    ranks = ranks_of(old, prefix)
    if old and ranks is not None and ranks != world_size:
        folder = move_aside(old, workdir, prefix, ranks)
        print(f"moved the results of an earlier {ranks}-rank run aside to {folder}", flush=True)
        old = []
    names = {f.name for f in new}
    replaced = [f for f in old if f.name in names or not resuming]
    trash = workdir / f".{prefix}results.replaced"
    shutil.rmtree(trash, ignore_errors=True)
    if replaced:
        trash.mkdir()
        for f in replaced:
            os.replace(f, trash / f.name)
    published = []
    for f in new:
        os.replace(f, workdir / f.name)
        published.append(workdir / f.name)
    shutil.rmtree(trash, ignore_errors=True)
    shutil.rmtree(staging, ignore_errors=True)
    return published


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
