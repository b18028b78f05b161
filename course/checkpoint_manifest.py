"""Checkpoints that prove they are intact: a manifest of every file's size and SHA-256, checked before resuming.

When a checkpoint is committed (:func:`course.checkpoint.save_checkpoint`, and the background saves of
:func:`course.checkpoint.save_checkpoint_async` once their write has completed), rank 0 reads back every file of
its ``step....tmp`` folder — the ranks' DCP shards (``__<rank>_<n>.distcp``) and DCP's ``.metadata`` — and writes
``manifest.json``: the step and, per file, its size in bytes and its SHA-256. The manifest is written last (after
every file it lists), to a temporary name and renamed, and only then is the folder renamed to ``step....`` and
``latest`` replaced; so a committed checkpoint without a manifest, or whose files disagree with it, was damaged
after it was written (a disk, a copy, a hand).

Before a run resumes, :func:`verify_checkpoint` reads every file again and compares it with the manifest — in the
launching process before any rank starts (:meth:`course.config.RunConfig.check_environment`), and on rank 0 before
any rank loads (after a restart, :mod:`course.epoch_runner`). A mismatch stops the run with the file, the step and
the newest intact step to resume from (:class:`CheckpointDamaged`); ``--resume latest`` and a restart skip
damaged steps and say so (:func:`choose_checkpoint`).

Hashing reads each file once, at the disk's speed (SHA-256 runs at about 0.5-2 GB/s on one core: about a second
for a GPT-2 124M checkpoint with its Adam state, 1.5 GB); a folder verified once in a process is not read again
while none of its files' sizes and modification times change.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path

MANIFEST = "manifest.json"
LATEST = "latest"
_STEP = re.compile(r"^step(\d+)$")
_VERIFIED: dict[str, tuple] = {}  # folder -> the stat signature it had when verified in this process


class CheckpointDamaged(ValueError):
    """A committed checkpoint whose files do not match its manifest (or that has none).

    Attributes:
        path: the checkpoint folder.
        step: its optimizer step (from its name).
        file: the file at fault (``manifest.json`` when the manifest itself is missing or unreadable).
        problem: what is wrong with it.
        intact: the newest intact checkpoint beside it (None: none), named in the message as the one to resume.
    """

    def __init__(self, path: Path, step: int | None, file: str, problem: str, intact: Path | None = None,
                 searched: Path | None = None):
        self.path, self.step, self.file, self.problem, self.intact = Path(path), step, file, problem, intact
        self.searched = searched
        super().__init__(self._message())

    def _message(self) -> str:
        text = (f"checkpoint {self.path} (step {self.step}) is damaged: {self.file} {self.problem}; it cannot be "
                "resumed")
        if self.searched is None:
            return text
        if self.intact is not None:
            return (f"{text}. The newest intact checkpoint is {self.intact} (step {step_of(self.intact)}): resume "
                    f"from it with --resume {self.intact} (or --resume latest, which skips damaged steps)")
        return f"{text}. No intact checkpoint is left in {self.searched}: start afresh (leave --resume out)"

    def with_intact(self, searched: Path, intact: Path | None) -> "CheckpointDamaged":
        """The same damage, naming the newest intact checkpoint of ``searched`` (None: there is none)."""
        return CheckpointDamaged(self.path, self.step, self.file, self.problem, intact, searched)

    def short(self) -> str:
        """``step00000006: __1_0.distcp has 1024 bytes, the manifest says 4096``."""
        return f"{self.path.name}: {self.file} {self.problem}"


def step_of(path: Path) -> int | None:
    """The step of a folder named ``step{N:08d}`` (None for any other name)."""
    match = _STEP.match(Path(path).name)
    return int(match.group(1)) if match else None


def file_digest(path: Path, chunk: int = 1 << 20) -> str:
    """The SHA-256 of a file's bytes, as 64 hex digits (read ``chunk`` bytes at a time)."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            digest.update(block)
    return digest.hexdigest()


def _files(folder: Path) -> list[Path]:
    return sorted(p for p in Path(folder).rglob("*") if p.is_file() and p.name != MANIFEST
                  and not p.name.startswith(f"{MANIFEST}."))


def write_manifest(folder: Path, step: int) -> Path:
    """Write ``folder/manifest.json``: ``step`` and every other file's size and SHA-256 (paths relative to
    ``folder``). Call it once every file of the checkpoint is written, before the folder is committed; it is
    written to a temporary name and renamed, so a reader finds the whole manifest or none.

    Returns:
        The manifest's path.
    """
    folder = Path(folder)
    files = {p.relative_to(folder).as_posix(): {"bytes": p.stat().st_size, "sha256": file_digest(p)}
             for p in _files(folder)}
    tmp = folder / f"{MANIFEST}.tmp"
    with open(tmp, "w") as f:
        json.dump({"step": step, "files": files}, f, indent=1, sort_keys=True)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, folder / MANIFEST)
    return folder / MANIFEST


def _signature(folder: Path) -> tuple:
    try:
        return tuple((p.name, p.stat().st_size, p.stat().st_mtime_ns) for p in sorted(Path(folder).rglob("*"))
                     if p.is_file())
    except OSError:
        return ()


def verify_checkpoint(folder: Path) -> int:
    """Check every file of checkpoint ``folder`` against its manifest: present, of the recorded size, with the
    recorded SHA-256. Files that the manifest does not list are ignored (DCP reads only the files its
    ``.metadata`` names, and those are all listed).

    Returns:
        The checkpoint's step.

    Raises:
        CheckpointDamaged: no manifest, an unreadable one, or one that names another step; a listed file missing,
            of another size, or with other contents (the first such file, in name order, is named).
    """
    folder = Path(folder)
    step = step_of(folder)
    signature = _signature(folder)
    if signature and _VERIFIED.get(str(folder.resolve())) == signature:
        return step
    manifest = folder / MANIFEST
    if not manifest.is_file():
        raise CheckpointDamaged(folder, step, MANIFEST, "is missing (the checkpoint was not committed by this course's "
                                "save, or the file was removed)")
    try:
        recorded = json.loads(manifest.read_text())
        files, saved_step = recorded["files"], recorded["step"]
        if not isinstance(files, dict) or not files:
            raise ValueError("it lists no file")
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise CheckpointDamaged(folder, step, MANIFEST, f"cannot be read ({type(exc).__name__}: {exc})") from None
    if step is not None and saved_step != step:
        raise CheckpointDamaged(folder, step, MANIFEST, f"says step {saved_step}, the folder's name step {step}")
    for name, entry in sorted(files.items()):
        path = folder / name
        if not path.is_file():
            raise CheckpointDamaged(folder, step, name, "is missing")
        size = path.stat().st_size
        if size != entry["bytes"]:
            raise CheckpointDamaged(folder, step, name, f"has {size} bytes, the manifest says {entry['bytes']} "
                                    f"({'truncated' if size < entry['bytes'] else 'grown'})")
        if file_digest(path) != entry["sha256"]:
            raise CheckpointDamaged(folder, step, name, f"has other contents than were written (SHA-256 "
                                    f"{file_digest(path)[:12]}..., the manifest says {entry['sha256'][:12]}...)")
    _VERIFIED[str(folder.resolve())] = signature
    return step


def committed_checkpoints(root: Path) -> list[Path]:
    """The committed checkpoint folders ``root/step{N:08d}`` (not ``....tmp``), newest step first."""
    root = Path(root)
    if not root.is_dir():
        return []
    found = [p for p in root.iterdir() if p.is_dir() and step_of(p) is not None]
    return sorted(found, key=step_of, reverse=True)


def _pointer_step(root: Path) -> int | None:
    """The step ``root/latest`` names (None: no pointer, or an unreadable one)."""
    try:
        return step_of(Path(root) / (Path(root) / LATEST).read_text().strip())
    except (OSError, UnicodeDecodeError):
        return None


def run_checkpoints(root: Path) -> list[Path]:
    """The committed checkpoints of the run that ``root/latest`` belongs to, newest first: those of a step up to the
    one ``latest`` names (a folder of a later step was left by an earlier run in the same folder, or written after
    the checkpoint a run resumed from: it is not this run's); every committed one when there is no pointer."""
    upper = _pointer_step(root)
    return [p for p in committed_checkpoints(root) if upper is None or step_of(p) <= upper]


def newest_intact(root: Path) -> Path | None:
    """The newest of :func:`run_checkpoints` that :func:`verify_checkpoint` accepts; None if there is none."""
    return newest_intact_point(root).path


@dataclass
class ResumePoint:
    """Where a run resumes: ``path`` (None: nowhere, a fresh start) and the damaged checkpoints skipped to get
    there, newest first."""

    path: Path | None
    skipped: list[CheckpointDamaged]

    def describe_skipped(self) -> str:
        """``skipped the damaged step00000006 (__1_0.distcp has ...)``, or "" when nothing was skipped."""
        if not self.skipped:
            return ""
        return "skipped " + "; ".join(f"the damaged {d.short()}" for d in self.skipped)


def newest_intact_point(root: Path) -> ResumePoint:
    """The newest intact checkpoint of :func:`run_checkpoints` and the damaged newer ones skipped to reach it
    (``--resume latest``, a restart)."""
    skipped = []
    for path in run_checkpoints(root):
        try:
            verify_checkpoint(path)
        except CheckpointDamaged as exc:
            skipped.append(exc)
            continue
        return ResumePoint(path, skipped)
    return ResumePoint(None, skipped)


def check_intact(path: Path) -> Path:
    """``path`` if it is an intact checkpoint (an explicit ``--resume DIR``).

    Raises:
        CheckpointDamaged: naming the file, the step and the newest intact checkpoint beside it.
    """
    path = Path(path)
    try:
        verify_checkpoint(path)
    except CheckpointDamaged as exc:
        raise exc.with_intact(path.parent, newest_intact(path.parent)) from None
    return path
