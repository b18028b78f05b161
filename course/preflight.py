"""Checks a run makes of the file system before any process starts
(:meth:`course.config.RunConfig.check_environment`): the work directory can be written and no results are silently replaced, the trace and profile files, the folder of a
Hugging Face export. Each raises ``ValueError`` with what to change. Torch-free.
"""
from __future__ import annotations

import os
import tempfile
from pathlib import Path


def check_export_folder(folder, overwrite: bool) -> None:
    """``--export_hf DIR``: refuse, before any process starts, a ``DIR`` that already holds files (unless
    ``overwrite``: it is replaced at the end of the run) or whose parent cannot be written to.

    Raises:
        ValueError: naming what to change.
    """
    folder = Path(folder)
    if folder.exists() and (not folder.is_dir() or any(folder.iterdir())) and not overwrite:
        raise ValueError(f"--export_hf {folder} already exists and is not empty; pass --overwrite to replace it at the "
                         "end of the run, or choose another folder")
    try:
        folder.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=folder.parent, prefix=".write_check_"):
            pass
    except OSError as exc:
        raise ValueError(f"--export_hf {folder}: its folder cannot be written to ({exc.strerror or exc}); choose "
                         "another") from None


def check_measurement_files(config) -> None:
    """Before any process starts: ``--trace FILE`` can be written and replaces no file, and ``--profile`` replaces
    no profile of this mode in ``--workdir``, unless ``--overwrite`` (which deletes the old profiles).

    Raises:
        ValueError: naming the file and what to change.
    """
    if config.trace is not None:
        path = Path(config.trace)
        if path.is_dir():
            raise ValueError(f"--trace {path} is a folder; give a file name, e.g. --trace {path / 'trace.json'}")
        if path.exists() and not config.overwrite:
            raise ValueError(f"--trace {path} already exists; pass --overwrite to replace it, or choose another file")
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise ValueError(f"--trace {path}: its folder cannot be created ({exc.strerror or exc})") from None
        if not os.access(path.parent, os.W_OK):
            raise ValueError(f"--trace {path}: its folder {path.parent} cannot be written to; choose another file")
    if config.profile:
        existing = sorted(Path(config.workdir).glob(f"{config.results_prefix}rank*_torch_profile.json"))
        if existing and not config.overwrite:
            raise ValueError(f"--workdir {config.workdir} already holds profiles of this mode ({existing[0].name}); pass "
                             "--overwrite to replace them, or choose another --workdir")
        for old in existing:
            os.remove(old)


def check_workdir(workdir, results_prefix: str, overwrite: bool, resuming: bool = False) -> None:
    """Check, before any process starts, that results can be written to ``workdir`` and that
    none would be silently replaced.

    Raises:
        ValueError: the folder cannot be created or written to; or it already holds results
            files ``{results_prefix}rank*_results_epoch*.json`` and neither ``overwrite`` (they
            are deleted) nor ``resuming`` (they are kept: the run continues) is set.
    """
    folder = Path(workdir)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".write_check_"):
            pass
    except OSError as exc:
        raise ValueError(f"--workdir {folder} cannot be written to ({exc.strerror or exc}); choose a folder you can "
                         "write to, or fix its permissions") from None
    existing = sorted(p.name for p in folder.glob(f"{results_prefix}rank*_results_epoch*.json"))
    if resuming:
        return  # a resumed run continues in its own folder: its results are expected there
    if existing and not overwrite:
        raise ValueError(f"--workdir {folder} already holds results of this mode ({existing[0]}"
                         f"{f' and {len(existing) - 1} more' if len(existing) > 1 else ''}); pass --overwrite to replace "
                         "them, or choose another --workdir")
    if existing:
        for name in existing:
            os.remove(folder / name)
