"""Checks a run makes of the file system before any process starts
(:meth:`course.config.RunConfig.check_environment`): the work directory can be written and no results are silently
replaced, the trace and profile files, the folder of a Hugging Face export. Nothing is created or removed here. Each
raises ``ValueError`` with what to change. Torch-free.
"""
from __future__ import annotations

import os
from pathlib import Path

from course.output_paths import check_folder_writable


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
    check_folder_writable(folder.parent, f"--export_hf {folder}: its folder")


def check_measurement_files(config) -> None:
    """Before any process starts: ``--trace FILE`` can be written and replaces no file, and ``--profile`` replaces
    no profile of this mode in ``--workdir``, unless ``--overwrite`` (the old profiles are replaced when the run
    has succeeded, :func:`course.results.publish_results`).

    Raises:
        ValueError: naming the file and what to change.
    """
    if config.trace is not None:
        path = Path(config.trace)
        if path.is_dir():
            raise ValueError(f"--trace {path} is a folder; give a file name, e.g. --trace {path / 'trace.json'}")
        if path.exists() and not config.overwrite:
            raise ValueError(f"--trace {path} already exists; pass --overwrite to replace it, or choose another file")
        check_folder_writable(path.parent, f"--trace {path}: its folder")
    if config.profile:
        existing = sorted(Path(config.workdir).glob(f"{config.results_prefix}rank*_torch_profile.json"))
        if existing and not config.overwrite:
            raise ValueError(f"--workdir {config.workdir} already holds profiles of this mode ({existing[0].name}); pass "
                             "--overwrite to replace them, or choose another --workdir")


def check_workdir(workdir, results_prefix: str, overwrite: bool, resuming: bool = False) -> None:
    """Check, before any process starts, that results can be written to ``workdir`` and that
    none would be silently replaced. Nothing is created or removed here: the old results stay until the new run
    has succeeded (:func:`course.results.publish_results` then replaces them).

    Raises:
        ValueError: the folder cannot be created or written to; or it already holds results
            files ``{results_prefix}rank*_results_epoch*.json`` and neither ``overwrite`` (they
            are replaced when the run succeeds) nor ``resuming`` (they are kept: the run continues) is set.
    """
    folder = Path(workdir)
    check_folder_writable(folder, "--workdir")
    existing = sorted(p.name for p in folder.glob(f"{results_prefix}rank*_results_epoch*.json"))
    if existing and not overwrite and not resuming:
        raise ValueError(f"--workdir {folder} already holds results of this mode ({existing[0]}"
                         f"{f' and {len(existing) - 1} more' if len(existing) > 1 else ''}); pass --overwrite to replace "
                         "them once this run has succeeded, or choose another --workdir")


def check_run_files(config) -> None:
    """What a run will read and write, checked before any rank starts
    (:meth:`course.config.RunConfig.check_environment`): the data folder and a cached tokenizer; then, by one process
    (under torchrun, rank 0), the work directory, ``--trace`` and ``--profile``, the
    checkpoint to resume (written by as many ranks, unless the script resumes at another world size),
    ``--export_hf``, and room and write access for ``--checkpoint_every``'s checkpoints.

    Raises:
        ValueError, FileNotFoundError: naming what to change.
    """
    from course.data import resolve_data_dir, verify_multi30k
    from course.environment import in_torchrun
    from course.tokenizer import tokenizer_path, verify_cached_tokenizer

    if config.dataset == "multi30k" and not in_torchrun():
        verify_multi30k(resolve_data_dir(config.data_dir))
    verify_cached_tokenizer(tokenizer_path(config.workdir, config.dataset, config.vocab_size, config.src_lang,
                                           config.tgt_lang, config.max_train_examples), config.src_lang,
                            config.tgt_lang)
    if in_torchrun() and os.environ.get("RANK") != "0":
        return  # under torchrun, one process checks the files
    check_workdir(config.workdir, config.results_prefix, config.overwrite, resuming=config.resume is not None)
    check_measurement_files(config)
    from course.checkpoint import checkpoint_root

    if config.resume is not None:
        from course.checkpoint import resolve_resume, saved_world_size

        found = resolve_resume(config.resume, checkpoint_root(config.workdir, config.results_prefix))
        try:
            saved = saved_world_size(found)
        except ValueError:  # not a run's checkpoint: the script's own checks, or loading, say more
            saved = config.world_size
        if saved != config.world_size and not config.resumes_at_another_world_size:
            raise ValueError(f"--resume {config.resume}: the checkpoint was written by {saved} ranks and this run has "
                             f"{config.world_size}; this script resumes at the same number of ranks only "
                             "(project/run_data_parallel.py resumes at another --dp)")
    if config.export_hf is not None:
        check_export_folder(config.export_hf, config.overwrite)
    if config.checkpoint_every:
        from course.checkpoint import check_free_space
        from course.model import estimate_parameters

        check_free_space(config.workdir, estimate_parameters(config.preset, config.vocab_size,
                                                             config.model_max_length), config.keep_checkpoints)
        check_folder_writable(checkpoint_root(config.workdir, config.results_prefix),
                              f"--workdir {config.workdir}: its checkpoints folder")
