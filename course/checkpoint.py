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
mid-save never leaves a broken checkpoint where a good one was. The two newest are kept.

Resuming (``--resume latest`` or ``--resume DIR``; automatically after a restart, see
:func:`restart_count`) loads the state in place, rebuilds the epoch's batches, skips the steps
already done and restores the random generators just before the next step — so a resumed run
repeats the uninterrupted run's per-step losses exactly on CPU.
"""
from __future__ import annotations

import os
import random
import shutil
from pathlib import Path

import torch
import torch.distributed as dist

LATEST = "latest"
KEEP = 2


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


def resolve_resume(resume: str | None, root: Path) -> Path | None:
    """Where to resume from: ``--resume latest`` / a folder; after a restart, the latest checkpoint
    if there is one; else None (a fresh start).

    Raises:
        FileNotFoundError: ``--resume`` names no complete checkpoint (with what to do).
    """
    if resume is None:
        return latest_checkpoint(root) if restart_count() > 0 else None
    if resume == LATEST:
        found = latest_checkpoint(root)
        if found is None:
            raise FileNotFoundError(f"--resume latest: no checkpoint in {root}; run with --checkpoint_every N first, "
                                    "or leave --resume out to start afresh")
        return found
    path = Path(resume)
    if not (path / ".metadata").is_file():
        raise FileNotFoundError(f"--resume {resume} is not a checkpoint folder (no .metadata in it); give a "
                                f"step... folder under {root}, or 'latest'")
    return path


def _barrier(group) -> None:
    if dist.is_initialized():
        dist.barrier(group=group)


def save_checkpoint(root: Path, step: int, state: dict, *, rank: int = 0, group=None) -> Path:
    """Write ``state`` as checkpoint ``step`` (collective over ``group``, the run's world).

    Returns:
        The checkpoint folder.
    """
    import torch.distributed.checkpoint as dcp

    root = Path(root)
    final, tmp = root / f"step{step:08d}", root / f"step{step:08d}.tmp"
    if rank == 0:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
    _barrier(group)
    dcp.save(state, checkpoint_id=str(tmp), process_group=group if dist.is_initialized() else None)
    _barrier(group)
    if rank == 0:
        shutil.rmtree(final, ignore_errors=True)
        os.replace(tmp, final)
        pointer = root / f"{LATEST}.tmp"
        pointer.write_text(final.name)
        os.replace(pointer, root / LATEST)
        done = sorted(p for p in root.glob("step*") if p.is_dir() and not p.name.endswith(".tmp"))
        for old in done[:-KEEP]:
            shutil.rmtree(old, ignore_errors=True)
    _barrier(group)
    return final


def load_checkpoint(path: Path, state: dict, *, group=None) -> dict:
    """Load checkpoint ``path`` into ``state`` in place (collective over ``group``); returns ``state``."""
    import torch.distributed.checkpoint as dcp

    dcp.load(state, checkpoint_id=str(path), process_group=group if dist.is_initialized() else None)
    return state


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


def check_free_space(workdir, n_parameters: int) -> None:
    """Refuse to start when ``workdir`` cannot hold the checkpoints the run keeps (two, plus one being written).

    Raises:
        ValueError: naming the space needed and free.
    """
    need = (KEEP + 1) * estimate_bytes(n_parameters)
    free = shutil.disk_usage(Path(workdir)).free
    if free < need:
        raise ValueError(f"--workdir {workdir} has {free / 1e9:.2f} GB free, but the checkpoints of this run need "
                         f"{need / 1e9:.2f} GB ({KEEP + 1} x {estimate_bytes(n_parameters) / 1e9:.2f} GB); free some "
                         "space, choose another --workdir, or checkpoint less (leave out --checkpoint_every)")
