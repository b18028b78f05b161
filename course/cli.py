"""Command-line options shared by every run script, and their checks.

Every check runs in the parent process, before any worker is started, and ends the
script with a message that says what to change (``parser.error``, exit code 2).
"""
from __future__ import annotations

import argparse
import os
import re

from course.launch import in_torchrun, resolve_device_backend
from course.model import PRESETS, default_preset


def add_common_args(parser: argparse.ArgumentParser, *, batch_size: int = 64, n_epochs: int = 1,
                    learning_rate: float = 1e-3) -> argparse.ArgumentParser:
    """Add the data, model, training and device options (snake_case, as in the course anchor)."""
    data = parser.add_argument_group("data")
    data.add_argument("--dataset", default="multi30k",
                      help="'multi30k' (local files) or a Hugging Face dataset with a 'translation' column")
    data.add_argument("--data_dir", default=None, help="folder holding the Multi30k *.gz files")
    data.add_argument("--src_lang", default="de")
    data.add_argument("--tgt_lang", default="en")
    data.add_argument("--vocab_size", type=int, default=5000, help="BPE vocabulary size (tokens)")
    data.add_argument("--model_max_length", type=int, default=128, help="longest sequence (tokens)")

    model = parser.add_argument_group("model and training")
    model.add_argument("--preset", default="auto", choices=["auto", *PRESETS],
                       help="GPT-2 size; auto: tiny on CPU, gpt2 on GPU")
    model.add_argument("--batch_size", type=int, default=batch_size, help="global batch size (sequences per step)")
    model.add_argument("--n_epochs", type=int, default=n_epochs)
    model.add_argument("--learning_rate", type=float, default=learning_rate, help="AdamW learning rate")
    model.add_argument("--max_batches", type=int, default=None,
                       help="stop each epoch after this many batches (quick runs)")
    model.add_argument("--n_bleu", type=int, default=100, help="test sentences translated for BLEU (0: skip)")
    model.add_argument("--max_val_batches", type=int, default=None,
                       help="validation batches (of 64 sentences) scored after each epoch (default: all)")
    model.add_argument("--dropout", type=float, default=0.1, help="GPT-2 dropout probability (0 for exact comparisons)")
    model.add_argument("--seed", type=int, default=11)

    run = parser.add_argument_group("run")
    run.add_argument("--workdir", default="workdir", help="where results, translations and the tokenizer go")
    run.add_argument("--overwrite", action="store_true",
                     help="replace this mode's results already in --workdir (without it, the run refuses to start)")
    run.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    run.add_argument("--backend", default="auto", choices=["auto", "gloo", "nccl"])
    run.add_argument("--timeout", type=float, default=3600.0, help="wall-clock limit of the whole run (seconds)")
    run.add_argument("--quiet", action="store_true", help="no progress bar")

    ckpt = parser.add_argument_group("checkpoints and restarts")
    ckpt.add_argument("--checkpoint_every", type=int, default=None, metavar="N",
                      help="write a checkpoint (torch.distributed.checkpoint) every N optimizer steps")
    ckpt.add_argument("--resume", default=None, metavar="DIR|latest",
                      help="continue from a checkpoint folder, or from this mode's latest one in --workdir")
    ckpt.add_argument("--max_restarts", type=int, default=0,
                      help="when a rank dies, start every rank again from the latest checkpoint, up to this many "
                           "times (under torchrun use torchrun's own --max_restarts)")
    # "-1e-3" looks like an option to argparse; read numbers in scientific notation as numbers, so that
    # a negative value gets the clear "must be positive" message below instead of "expected one argument".
    parser._negative_number_matcher = re.compile(r"^-\d+$|^-\d*\.\d+$|^-\d*\.?\d+[eE][-+]?\d+$")
    return parser


def check_workdir(workdir, results_prefix: str, overwrite: bool, resuming: bool = False) -> None:
    """Check, before any process starts, that results can be written to ``workdir`` and that
    none would be silently replaced.

    Raises:
        ValueError: the folder cannot be created or written to; or it already holds results
            files ``{results_prefix}rank*_results_epoch*.json`` and neither ``overwrite`` (they
            are deleted) nor ``resuming`` (they are kept: the run continues) is set.
    """
    import os
    import tempfile
    from pathlib import Path

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


def check_common_args(parser: argparse.ArgumentParser, args: argparse.Namespace, world_size: int,
                      results_prefix: str = "") -> argparse.Namespace:
    """Validate the shared options; fill in ``device``, ``backend``, ``preset``; check the work
    directory (:func:`check_workdir`, for the results files named ``{results_prefix}rank*...``).

    Exits through ``parser.error`` (code 2) with a message that says what to change.
    """
    from course.data import DataNotFoundError, resolve_data_dir, verify_multi30k
    from course.tokenizer import tokenizer_path, verify_cached_tokenizer

    positive = {"batch_size": args.batch_size, "n_epochs": args.n_epochs, "learning_rate": args.learning_rate}
    for name, value in positive.items():
        if not value > 0:  # also refuses nan
            parser.error(f"--{name} must be positive, not {value}")
    if args.max_batches is not None and args.max_batches < 1:
        default = parser.get_default("max_batches")
        hint = "or left out for whole epochs" if default is None else \
            f"it is {default} by default here; give a larger number for longer epochs"
        parser.error(f"--max_batches must be >= 1 batches per epoch ({hint}), not {args.max_batches}")
    if not 0 <= args.dropout < 1:
        parser.error(f"--dropout must be in [0, 1), not {args.dropout}")
    if args.n_bleu < 0:
        parser.error(f"--n_bleu must be >= 0, not {args.n_bleu}")
    if args.model_max_length < 4:
        parser.error(f"--model_max_length must be >= 4, not {args.model_max_length}")
    if args.vocab_size < 300:
        parser.error(f"--vocab_size must be >= 300 for a byte-level BPE, not {args.vocab_size}")
    if args.max_val_batches is not None and args.max_val_batches < 1:
        parser.error(f"--max_val_batches must be >= 1, not {args.max_val_batches}")
    if args.checkpoint_every is not None and args.checkpoint_every < 1:
        parser.error(f"--checkpoint_every must be >= 1 (optimizer steps), not {args.checkpoint_every}")
    if args.max_restarts < 0:
        parser.error(f"--max_restarts must be >= 0, not {args.max_restarts}")
    if args.max_restarts and in_torchrun():
        parser.error("--max_restarts is the launcher's; under torchrun pass --max_restarts to torchrun instead")
    if args.max_restarts and not args.checkpoint_every:
        parser.error("--max_restarts restarts from the latest checkpoint: also give --checkpoint_every N")
    try:
        args.device, args.backend = resolve_device_backend(args.device, args.backend, world_size)
    except ValueError as exc:
        parser.error(str(exc))
    if args.preset == "auto":
        args.preset = default_preset(args.device)
    if args.dataset == "multi30k" and not in_torchrun():
        try:
            verify_multi30k(resolve_data_dir(args.data_dir))
        except (DataNotFoundError, ValueError) as exc:
            parser.error(str(exc))
    try:
        verify_cached_tokenizer(tokenizer_path(args.workdir, args.dataset, args.vocab_size, args.src_lang,
                                               args.tgt_lang), args.src_lang, args.tgt_lang)
    except ValueError as exc:
        parser.error(str(exc))
    if not in_torchrun() or os.environ.get("RANK") == "0":  # under torchrun, one process checks
        try:  # resuming continues the run in its folder: its results are expected there
            check_workdir(args.workdir, results_prefix, args.overwrite, resuming=args.resume is not None)
            if args.resume is not None:
                from course.checkpoint import checkpoint_root, resolve_resume

                resolve_resume(args.resume, checkpoint_root(args.workdir, results_prefix))
            if args.checkpoint_every:
                from course.checkpoint import check_free_space
                from course.model import estimate_parameters

                check_free_space(args.workdir, estimate_parameters(args.preset, args.vocab_size, args.model_max_length))
        except (ValueError, FileNotFoundError) as exc:
            parser.error(str(exc))
    return args


def run_config(args: argparse.Namespace, **extra) -> dict:
    """The configuration recorded in every results file."""
    keys = ("dataset", "preset", "dropout", "batch_size", "n_epochs", "learning_rate", "model_max_length", "vocab_size",
            "max_batches", "device", "backend", "seed")
    return dict({k: getattr(args, k) for k in keys}, **extra)
