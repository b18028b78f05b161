"""Where a command will write, checked before it starts: without creating anything, so that a refused command
leaves the file system as it found it (no empty work directory, trace folder or results folder behind).

Used by the run configuration (:meth:`course.config.RunConfig.check_environment`: the work directory, its
checkpoints folder, ``--trace``, ``--export_hf``), the benchmark harness (``--out``,
:func:`course.benchmarking.check`) and the grader (``--json``).
"""
from __future__ import annotations

import tempfile
from pathlib import Path


def check_folder_writable(folder, label: str) -> None:
    """Refuse, before any process starts, a ``folder`` the run could not write into — without creating it (a
    refused run leaves no folder behind): an existing folder must take a file, a missing one must have a nearest
    existing parent that is a folder and takes one (the run makes the folders it needs when it starts).

    Raises:
        ValueError: ``{label} {folder} cannot be written to (why); ...``.
    """
    folder = Path(folder)
    probe = folder
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    reason = None
    if not probe.is_dir():
        reason = f"{probe} is a file, not a folder"
    else:
        try:
            with tempfile.NamedTemporaryFile(dir=probe, prefix=".write_check_"):
                pass
        except OSError as exc:
            reason = f"{probe}: {exc.strerror or exc}"
    if reason is not None:
        raise ValueError(f"{label} {folder} cannot be written to ({reason}); choose a folder you can write to, or fix "
                         "its permissions")


def check_output_file(path, option: str) -> None:
    """Refuse, before a command starts, an output file ``path`` (its ``option``, e.g. ``--out``) that names a folder
    or whose folder could not be written into (:func:`check_folder_writable`; nothing is created).

    Raises:
        ValueError: ``{option} {path}: ...`` with what to change.
    """
    path = Path(path)
    if path.is_dir():
        raise ValueError(f"{option} {path} is a folder; give a file name, e.g. {option} {path / 'results.json'}")
    check_folder_writable(path.parent, f"{option} {path}: its folder")


def require_writable_output(parser, path, option: str, *, folder: bool = False) -> None:
    """A command's check of its output option, right after parsing: ``parser.error`` (exit code 2, before anything
    runs) unless ``path`` — a file (:func:`check_output_file`) or, with ``folder``, a folder
    (:func:`check_folder_writable`) — can be written; nothing to check when ``path`` is None."""
    if path is None:
        return
    try:
        if folder:
            check_folder_writable(path, option)
        else:
            check_output_file(path, option)
    except ValueError as exc:
        parser.error(str(exc))
