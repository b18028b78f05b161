"""One entry point for every training mode of the course (the registry :data:`project.modes.MODES`).

    python project/train.py --mode dp --dp 2                         # = python project/run_data_parallel.py --dp 2
    python project/train.py --mode pipeline --schedule 1f1b --pp 2 --micro_batches 4
    python project/train.py --mode tp --tp 2 --sequence_parallel
    python project/train.py --mode 3d --dp 1 --pp 4 --tp 2
    python project/train.py --mode cp --cp 2 --attention ulysses
    python project/train.py --mode moe --dp 2 --ep 2
    python -m project.train --mode tp --help                         # that mode's options
    torchrun --standalone --nproc_per_node=4 project/train.py --mode 3d --dp 1 --pp 2 --tp 2

``--mode`` picks the mode; every other option is that mode's configuration's (``project/options``, the same as
its documented command ``project/run_*.py``). The configuration is checked before any process starts (a
missing or unknown mode, a bad option: a message and exit code 2). Then one worker
(:func:`project.modes.train_worker`) runs on every rank — spawned here (gloo on the CPU, NCCL with one GPU each),
or the rank torchrun started — builds the run's mesh from the configuration (``config.dims``), the data and the
mode's training (``Mode.build``), and trains the epochs (:func:`course.epoch_runner.run_epochs`); a
configuration that runs in this process (the one-process pipelines) runs here. The results files are the
mode's (``<workdir>/{prefix}rank{r}_results_epoch{e}.json``), summarised in a table at the end.
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

if __name__ == "__main__":  # run as a file: import the packages of the tree this script sits in
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from course.environment import in_torchrun
    from course.rank_watch import die_with_parent

    if in_torchrun():  # a rank of torchrun's dies with its agent from the start, also while it imports torch
        die_with_parent(os.getppid())

from course.cli import OptionParser, closest_option  # noqa: E402
from course.launch import RankFailure, launch  # noqa: E402
from course.results import print_epoch_table  # noqa: E402
from project.modes import MODES, mode_named, mode_of, train_worker  # noqa: E402

PROG = "train.py"


def run(config) -> int:
    """The one tail of every mode: run a checked configuration of a registered mode (:func:`project.modes.mode_of`):
    print what runs, start its ranks with :func:`course.launch.launch` (looked up in this module at the call, so
    that a test can replace ``project.train.launch``) or run it in this process, and print the table of its results.

    Returns:
        0, or 1 when a rank failed (its error on stderr).
    """
    mode = mode_of(config)
    print(mode.describe(config), flush=True)
    if mode.runs_in_process(config):
        mode.run_in_process(config)
    else:
        timeout = {} if mode.collective_timeout is None else {"collective_timeout": mode.collective_timeout}
        try:
            launch(train_worker, config.world_size, mode.name, config, device=config.device, backend=config.backend,
                   timeout=config.timeout, max_restarts=config.max_restarts, **timeout)
        except RankFailure as exc:
            print(f"run failed: {exc}", file=sys.stderr)
            return 1
    print_epoch_table(config.workdir, prefix=config.results_prefix, n_epochs=config.n_epochs)
    return 0


def _front_parser() -> argparse.ArgumentParser:
    listing = "\n".join(f"  {m.name:<9} {m.config.description} (= {m.script_path})" for m in MODES.values())
    parser = OptionParser(
        prog=PROG, add_help=False, allow_abbrev=False, formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Train GPT-2 on Multi30k with one of the course's parallel modes.",
        epilog=f"modes:\n{listing}\n\n{PROG} --mode MODE --help lists that mode's options.")
    parser.add_argument("--mode", choices=tuple(MODES), help="the training mode")
    parser.add_argument("-h", "--help", action="store_true", help="this message, or with --mode that mode's options")
    return parser


def parse_args(argv: list[str] | None = None):
    """The checked configuration of ``--mode NAME`` and that mode's options (``argv``; default ``sys.argv[1:]``).

    Exits with code 2 and a message — a missing or unknown ``--mode`` (listing the modes), any option the mode's
    configuration refuses (:meth:`course.config.RunConfig.from_command_line`) — before any process starts;
    ``--help`` without a mode lists the modes, with one that mode's options (exit code 0).
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    front = _front_parser()
    known, rest = front.parse_known_args(argv)
    if known.mode is None:
        if known.help:
            front.print_help()
            sys.exit(0)
        typo = next((w for w in rest if w.startswith("--") and closest_option(w, ["--mode"])), None)
        hint = f" ({typo.split('=', 1)[0]}: did you mean --mode?)" if typo else ""
        front.error(f"choose a training mode: --mode {{{','.join(MODES)}}} (then --help for its options){hint}")
    if known.help:
        rest.append("--help")
    return MODES[known.mode].config.from_command_line(rest, prog=f"{PROG} --mode {known.mode}")


def main(argv: list[str] | None = None) -> int:
    return run(parse_args(argv))


def mode_command(name: str):
    """``parse_args, main`` of mode ``name``'s documented command ``project/run_*.py`` (:attr:`Mode.script`), which
    is ``train.py --mode NAME`` without ``--mode``: ``parse_args(argv=None)`` returns the checked configuration
    (:meth:`course.config.RunConfig.from_command_line`: exits with code 2 and a message on bad input, before any
    process starts); ``main(argv=None)`` runs it through :func:`run` and returns its exit code.

    Raises:
        ValueError: no mode is called ``name``.
    """
    config = mode_named(name).config

    def parse_args(argv: list[str] | None = None):
        return config.from_command_line(argv)

    def main(argv: list[str] | None = None) -> int:
        return run(parse_args(argv))

    parse_args.__annotations__["return"] = config.__name__  # as ``-> ThreeDConfig`` would read
    parse_args.__doc__ = f"The run's :class:`{config.__name__}` from the command line (exit 2 on bad input)."
    return parse_args, main


if __name__ == "__main__":
    # Under torchrun, a rank's error goes into its error file too: torchrun's summary (and project/elastic.py's
    # explanation of a failed run) then quote it.
    from torch.distributed.elastic.multiprocessing.errors import record

    sys.exit(record(main)())
