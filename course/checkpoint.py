"""Checkpoints of a run, in ``torch.distributed.checkpoint`` (DCP) format, and resuming from them.

Every ``--checkpoint_every N`` optimizer steps, every rank of the run writes its part of one
checkpoint, a folder ``<workdir>/{prefix}checkpoints/step{N:08d}/`` (DCP: one file per rank and
a metadata file). What goes in is the mode's :meth:`course.epoch_runner.TrainingMode.checkpoint_state`:

* the model and the optimizer, keyed by parameter name (``torch.distributed.checkpoint.state_dict``).
  A tensor held by several ranks under the same key (a data-parallel replica) is written once;
  what differs between ranks (a pipeline stage, a tensor-parallel shard) sits under the rank's
  own prefix (``stage1.``, ``tp0.``);
* every rank's random number generators (torch CPU, CUDA, Python), under ``rng.rank{r}``;
* the progress: epoch, steps done in it, the global step, and each rank's per-step losses,
  tokens and seconds of the epoch so far.

A checkpoint is written to ``step....tmp`` and renamed when every rank has finished, and the
``latest`` file (the name of the newest complete checkpoint) is replaced atomically, so a crash
mid-save never leaves a broken checkpoint where a good one was. Before the rename rank 0 writes the folder's
``manifest.json`` (every file's size and SHA-256, :mod:`course.checkpoint_manifest`), and every resume checks the
files against it first: a damaged checkpoint is named, never loaded. The ``--keep_checkpoints`` newest (default
:data:`KEEP`) are kept, so an intact step survives one damaged later.

**Asynchronous checkpoints** (``--async_checkpoint``, :func:`save_checkpoint_async`): every rank copies
its state to host memory (``torch.distributed.checkpoint.async_save``'s staging: the copy is what gets
written, so the next steps may change the weights at once) and a background thread writes the files
while training goes on; the ranks coordinate the write over a gloo group of their own
(:func:`checkpoint_group`), never over a group the training steps use from the main thread. The
checkpoint is committed — its manifest written (by a thread of rank 0's, not holding training up),
``step....tmp`` renamed, ``latest`` replaced — by rank 0 only once its write has completed, which is after every rank's files and the ``.metadata`` file are on disk (DCP's
coordinator gathers every rank's write results before it writes the metadata, then tells every rank).
So ``latest`` names a complete checkpoint at every moment: a run killed while a save is in flight
resumes from the one before. One save is in flight at a time (the next waits for it), and a run waits
for its last save before it ends.

Resuming (``--resume latest`` or ``--resume DIR``; automatically after a restart, see
:func:`restart_count`) loads the state in place, rebuilds the epoch's batches, skips the steps
already done and restores the random generators just before the next step — so a resumed run
repeats the uninterrupted run's per-step losses exactly on CPU. A checkpoint written on CPU resumes on
GPUs and one written on GPUs resumes on CPU (:func:`load_checkpoint`): a CPU checkpoint holds no CUDA
generator, so a GPU run resumed from one keeps its CUDA generator as seeded.
"""
from __future__ import annotations

import os
import random
import shutil
import threading
from concurrent.futures import Future
from pathlib import Path

import torch
import torch.distributed as dist

from course.checkpoint_manifest import (LATEST, MANIFEST, ResumePoint, check_intact, newest_intact_point, step_of,
                                        write_manifest)

KEEP = 2  # checkpoints kept by default (--keep_checkpoints)


def checkpoint_root(workdir, results_prefix: str = "") -> Path:
    """``<workdir>/{results_prefix}checkpoints``: each mode's checkpoints beside its results."""
    return Path(workdir) / f"{results_prefix}checkpoints"


def restart_count() -> int:
    """How many times this run was restarted: torchrun's ``TORCHELASTIC_RESTART_COUNT`` or the
    launcher's ``LLMSYS_RESTART_COUNT`` (0 on the first attempt)."""
    return int(os.environ.get("TORCHELASTIC_RESTART_COUNT") or os.environ.get("LLMSYS_RESTART_COUNT") or 0)


def rng_state(device: torch.device | None = None) -> dict:
    """This rank's random generators: torch CPU (dropout on CPU), CUDA (dropout on GPU), Python."""
    state = {"torch": torch.get_rng_state(), "python": random.getstate()}
    if device is not None and torch.device(device).type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)
    return state


def set_rng_state(state: dict, device: torch.device | None = None) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    if "cuda" in state and device is not None and torch.device(device).type == "cuda":
        torch.cuda.set_rng_state(state["cuda"], device)


def latest_checkpoint(root: Path) -> Path | None:
    """The newest complete checkpoint under ``root`` (None if there is none)."""
    pointer = Path(root) / LATEST
    if not pointer.is_file():
        return None
    path = Path(root) / pointer.read_text().strip()
    return path if (path / ".metadata").is_file() else None


def saved_world_size(path: Path) -> int:
    """How many ranks wrote checkpoint ``path`` (each wrote its random generators under ``rng_rank{r}``), read
    from its ``.metadata`` alone — in any process, no process group needed.

    Raises:
        ValueError: ``path`` holds no random-generator entries (not a checkpoint of a course run).
    """
    import re

    from torch.distributed.checkpoint import FileSystemReader

    keys = FileSystemReader(str(path)).read_metadata().state_dict_metadata
    ranks = {int(m.group(1)) for k in keys for m in [re.match(r"rng_rank(\d+)\.", k)] if m}
    if not ranks:
        raise ValueError(f"{path} is not a checkpoint of a course run (no rng_rank entries in its metadata)")
    return max(ranks) + 1


def resolve_resume(resume: str | None, root: Path) -> Path | None:
    """Where to resume from: ``--resume latest`` / a folder; after a restart, the latest checkpoint
    if there is one; else None (a fresh start). Every checkpoint is verified against its manifest first
    (:func:`choose_checkpoint`, which also says which damaged ones were skipped).

    Raises:
        FileNotFoundError: ``--resume`` names no complete checkpoint (with what to do).
        course.checkpoint_manifest.CheckpointDamaged: ``--resume DIR`` names a damaged checkpoint, or every
            checkpoint ``--resume latest`` could take is damaged (naming the file, the step, the newest intact one).
    """
    return choose_checkpoint(resume, root).path


def choose_checkpoint(resume: str | None, root: Path) -> ResumePoint:
    """:func:`resolve_resume`, with the damaged checkpoints that ``--resume latest`` or a restart skipped (newest
    first), for the run to say so.

    Raises:
        FileNotFoundError, course.checkpoint_manifest.CheckpointDamaged: as :func:`resolve_resume`.
    """
    if resume is None:
        return newest_intact_point(root) if restart_count() > 0 else ResumePoint(None, [])
    if resume == LATEST:
        point = newest_intact_point(root)
        if point.path is None and point.skipped:
            raise point.skipped[0].with_intact(Path(root), None)
        if point.path is None:
            raise FileNotFoundError(f"--resume latest: no checkpoint in {root}; run with --checkpoint_every N first, "
                                    "or leave --resume out to start afresh")
        return point
    path = Path(resume)
    if not (path / ".metadata").is_file() and not (path / MANIFEST).is_file():
        raise FileNotFoundError(f"--resume {resume} is not a checkpoint folder (no .metadata in it); give a "
                                f"step... folder under {root}, or 'latest'")
    return ResumePoint(check_intact(path), [])


def _barrier(group) -> None:
    if dist.is_initialized():
        dist.barrier(group=group)


WRITE_DELAY = "LLMSYS_CHECKPOINT_WRITE_DELAY"  # test hook: seconds each rank's write waits (a slow file system)


def _storage_writer(folder: Path):
    """DCP's ``FileSystemWriter`` for ``folder``; with ``$LLMSYS_CHECKPOINT_WRITE_DELAY`` set, one whose
    ``write_data`` first waits that many seconds — how the tests hold a save in flight to kill a run
    during it (tests/course/test_fail_safe.py)."""
    from torch.distributed.checkpoint import FileSystemWriter

    delay = float(os.environ.get(WRITE_DELAY) or 0)
    if not delay:
        return FileSystemWriter(str(folder))

    class SlowWriter(FileSystemWriter):
        def write_data(self, plan, planner):
            import time

            time.sleep(delay)
            return super().write_data(plan, planner)

    return SlowWriter(str(folder))


def _begin(root: Path, step: int, rank: int, group) -> tuple[Path, Path]:
    """Rank 0 makes an empty ``step....tmp`` (removing one a killed run left), every rank waits for it."""
    root = Path(root)
    final, tmp = root / f"step{step:08d}", root / f"step{step:08d}.tmp"
    if rank == 0:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
    _barrier(group)
    return final, tmp


def _commit(root: Path, tmp: Path, final: Path, keep: int = KEEP) -> None:
    """Rank 0, once every rank's files, the metadata and the manifest are written: ``tmp`` -> ``final``, ``latest``
    -> ``final`` (each an atomic rename), and all but the ``keep`` newest complete checkpoints up to ``final``
    removed (:func:`prune`)."""
    shutil.rmtree(final, ignore_errors=True)
    os.replace(tmp, final)
    pointer = Path(root) / f"{LATEST}.tmp"
    pointer.write_text(final.name)
    os.replace(pointer, Path(root) / LATEST)
    prune(root, final, keep)


def prune(root: Path, newest: Path, keep: int = KEEP) -> list[Path]:
    """Remove the committed checkpoints of ``root`` older than the ``keep`` newest up to ``newest`` (the one just
    committed); a later step's folder (left by an earlier run in the same folder) is left alone. Returns what was
    removed."""
    from course.checkpoint_manifest import committed_checkpoints

    mine = [p for p in committed_checkpoints(root) if step_of(p) <= step_of(newest)]
    for old in mine[keep:]:
        shutil.rmtree(old, ignore_errors=True)
    return mine[keep:]


def save_checkpoint(root: Path, step: int, state: dict, *, rank: int = 0, group=None, keep: int = KEEP) -> Path:
    """Write ``state`` as checkpoint ``step`` (collective over ``group``, the run's world); rank 0 writes its
    manifest and commits it, keeping the ``keep`` newest.

    Returns:
        The checkpoint folder.
    """
    import torch.distributed.checkpoint as dcp

    final, tmp = _begin(root, step, rank, group)
    dcp.save(state, storage_writer=_storage_writer(tmp), process_group=group if dist.is_initialized() else None,
             no_dist=not dist.is_initialized())
    _barrier(group)
    if rank == 0:
        write_manifest(tmp, step)
        _commit(root, tmp, final, keep)
    _barrier(group)
    return final


def checkpoint_group(group=None):
    """A gloo group of the ranks of ``group`` (None: the world) for asynchronous saves. Collective over the
    whole world: every rank calls it, member of ``group`` or not (``new_group``'s rule), at the same point of
    its sequence of group creations. DCP's background thread plans and finishes a save with collectives
    (gathers, broadcasts); in a group of their own they never interleave with the main thread's training
    collectives, and gloo serves the staged host copies on every device. None without a process group.

    The group is made like every other group of a run (``use_local_synchronization`` left off): its name
    then comes from torch's count of the groups made so far, the same on every rank. With
    ``use_local_synchronization=True`` the name would come from the count of groups this rank *holds*,
    which differs between ranks as soon as some were left out of a group (the middle stages of a pipeline
    of pp >= 3 are in no embedding group): the members would wait for each other under different names
    forever."""
    if not dist.is_initialized():
        return None
    ranks = dist.get_process_group_ranks(group if group is not None else dist.group.WORLD)
    return dist.new_group(ranks, backend="gloo", group_desc="checkpoint")


class PendingCheckpoint:
    """A checkpoint being written in the background (:func:`save_checkpoint_async`).

    :meth:`poll` (never blocks, no communication) and :meth:`wait` (blocks; collective over the run's
    ``group``) commit it on rank 0 once its write has completed; until then ``latest`` names the previous
    checkpoint and the files sit under ``step....tmp``.

    Attributes:
        final: the folder the checkpoint will have once committed.
    """

    def __init__(self, root: Path, tmp: Path, final: Path, future, rank: int, group=None, keep: int = KEEP):
        self.root, self.tmp, self.final, self.future, self.rank = Path(root), tmp, final, future, rank
        self.group, self.keep = group, keep
        self.committed = False
        if rank == 0:  # the manifest: written by a thread once the files are, so that training goes on meanwhile
            self.future = _then_manifest(future, tmp, step_of(final))

    def _finish(self) -> Path:
        self.future.result()  # raises what the background write (or the manifest) raised
        if not self.committed:
            self.committed = True
            if self.rank == 0:
                _commit(self.root, self.tmp, self.final, self.keep)
        return self.final

    def poll(self) -> bool:
        """Commit if the write has completed; True once committed (this rank's view; no communication)."""
        if not self.committed and self.future.done():
            self._finish()
        return self.committed

    def wait(self) -> Path:
        """Block until the write has completed and rank 0 has committed it (collective over ``group``:
        every rank sees the committed folder afterwards); returns the checkpoint folder.

        Raises:
            Exception: whatever the background write raised (e.g. a full disk).
        """
        self._finish()
        _barrier(self.group)
        return self.final


def _then_manifest(written: Future, folder: Path, step: int) -> Future:
    """A future that completes once ``written`` has and a thread has then written ``folder``'s manifest
    (:func:`course.checkpoint_manifest.write_manifest`); it raises what either raised."""
    sealed: Future = Future()

    def seal():
        try:
            written.result()
            write_manifest(folder, step)
        except BaseException as exc:  # noqa: BLE001 - handed to whoever waits for the save
            sealed.set_exception(exc)
        else:
            sealed.set_result(None)
    threading.Thread(target=seal, daemon=True, name="checkpoint-manifest").start()
    return sealed


def save_checkpoint_async(root: Path, step: int, state: dict, *, rank: int = 0, group=None,
                          save_group=None, keep: int = KEEP) -> PendingCheckpoint:
    """Start writing ``state`` as checkpoint ``step`` and return once it is staged (copied to host memory):
    the files are written by a background thread while the caller goes on training
    (``torch.distributed.checkpoint.async_save``). Collective over ``group`` (the run's world; a barrier
    before the save) and ``save_group`` (:func:`checkpoint_group` of the same ranks: DCP's own
    collectives, in the background). The caller must :meth:`PendingCheckpoint.wait` (or see
    :meth:`PendingCheckpoint.poll` succeed) before the next save and before it exits.

    Returns:
        The :class:`PendingCheckpoint`.
    """
    import torch.distributed.checkpoint as dcp

    final, tmp = _begin(root, step, rank, group)
    future = dcp.async_save(state, storage_writer=_storage_writer(tmp), process_group=save_group,
                            no_dist=not dist.is_initialized())
    return PendingCheckpoint(root, tmp, final, future, rank, group, keep)


def load_checkpoint(path: Path, state: dict, *, group=None) -> dict:
    """Load checkpoint ``path`` into ``state`` in place (collective over ``group``); returns ``state``.

    A checkpoint written on another kind of device loads: the CUDA random generator of a rank
    (``rng_rank{r}["cuda"]``, :func:`rng_state`) is asked for only where the checkpoint holds one — a run on
    GPUs resumed from a CPU checkpoint restores the CPU and Python generators and keeps its CUDA generator as
    seeded (dropout on the GPU then draws other masks than an uninterrupted GPU run would; the losses are
    not repeated exactly) — and a GPU checkpoint's CUDA generator is left unread by a CPU run.

    Raises:
        torch.distributed.checkpoint.api.CheckpointException: DCP's (a ``BaseException``), for any other entry
            of ``state`` that the checkpoint lacks.
    """
    import torch.distributed.checkpoint as dcp

    for key in _cuda_rng_missing(path, state):
        del state[key]["cuda"]
    dcp.load(state, checkpoint_id=str(path), process_group=group if dist.is_initialized() else None)
    return state


def _cuda_rng_missing(path: Path, state: dict) -> list[str]:
    """The ``rng_rank{r}`` entries of ``state`` that ask for a CUDA generator checkpoint ``path`` does not hold
    (it was written on CPU)."""
    from torch.distributed.checkpoint import FileSystemReader

    wanted = [k for k, v in state.items() if k.startswith("rng_rank") and isinstance(v, dict) and "cuda" in v]
    if not wanted:
        return []
    saved = FileSystemReader(str(path)).read_metadata().state_dict_metadata
    return [k for k in wanted if f"{k}.cuda" not in saved]


def save_final_weights(state: dict, path: Path, *, rank: int = 0, group=None) -> Path:
    """Write ``state`` (e.g. a model's ``state_dict()``, full weights on every rank) as one ``torch.save``
    file at ``path``, made from a ``torch.distributed.checkpoint`` folder — the course's one checkpoint
    format: DCP writes the state (each tensor once), then rank 0 converts the folder with
    ``torch.distributed.checkpoint.format_utils.dcp_to_torch_save`` and renames the file into place.
    Collective over ``group``. Returns ``path``."""
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    path = Path(path)
    folder = path.with_name(f"{path.name}.dcp.tmp")
    if rank == 0:
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(parents=True)
    _barrier(group)
    import torch.distributed.checkpoint as dcp

    dcp.save(state, checkpoint_id=str(folder), process_group=group if dist.is_initialized() else None)
    _barrier(group)
    if rank == 0:
        tmp = path.with_name(f"{path.name}.tmp")
        dcp_to_torch_save(str(folder), str(tmp))
        os.replace(tmp, path)
        shutil.rmtree(folder, ignore_errors=True)
    _barrier(group)
    return path


def estimate_bytes(n_parameters: int, bytes_per_parameter: int = 4 + 8) -> int:
    """Bytes of one checkpoint of a model trained with Adam in fp32: weights (4) + two moments (8)."""
    return n_parameters * bytes_per_parameter


def check_free_space(workdir, n_parameters: int, keep: int = KEEP) -> None:
    """Refuse to start when ``workdir`` cannot hold the checkpoints the run keeps (``keep``, plus one being
    written).

    Raises:
        ValueError: naming the space needed and free.
    """
    need = (keep + 1) * estimate_bytes(n_parameters)
    folder = Path(workdir)
    while not folder.exists() and folder != folder.parent:  # the folder is made when the run starts
        folder = folder.parent
    free = shutil.disk_usage(folder).free
    if free < need:
        raise ValueError(f"--workdir {workdir} has {free / 1e9:.2f} GB free, but the checkpoints of this run need "
                         f"{need / 1e9:.2f} GB ({keep + 1} x {estimate_bytes(n_parameters) / 1e9:.2f} GB); free some "
                         "space, choose another --workdir, keep fewer (--keep_checkpoints), or checkpoint less "
                         "(leave out --checkpoint_every)")
