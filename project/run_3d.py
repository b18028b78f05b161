"""3D-parallel GPT-2 training (data x pipeline x tensor parallel) on Multi30k German→English (assignment 5.6).

    python project/run_3d.py                                       # dp 1 x pp 4 x tp 2, 1F1B, 8 micro-batches
    python project/run_3d.py --dp 2 --pp 2 --tp 2 --schedule gpipe --micro_batches 4 --trace trace.json
    torchrun --standalone --nproc_per_node=8 project/run_3d.py --dp 1 --pp 4 --tp 2

Starts ``dp * pp * tp`` processes (gloo on the CPU, NCCL with one GPU each) or joins the
group torchrun made. Writes ``<workdir>/three_d_rank{r}_results_epoch{e}.json`` (timeline of
the last batch, communication per group, peak activation memory, coordinates) and
``<workdir>/three_d_translations_epoch{e}.json``; ``--trace FILE`` writes a Chrome/Perfetto
trace of every rank's forwards and backwards of the last batch and, on a second row, its
communication (tp all-reduces, pp sends/receives, dp and tied all-reduces, with bytes).

Checkpoints (``--checkpoint_every N``) load at another layout with the same tp and number of
ranks: ``python project/run_3d.py --dp 1 --pp 4 --tp 2 --checkpoint_every 100`` then
``python project/run_3d.py --dp 2 --pp 2 --tp 2 --resume <workdir>/three_d_checkpoints/step00000100``
(``torch.distributed.checkpoint`` reads each stage's layers from wherever they were written;
see :mod:`three_d.training`). A different ``--tp`` is refused before any process starts.
"""
from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

if __name__ == "__main__":  # run as a file: import the packages of the tree this script sits in
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from course.config import ConfigError, RunConfig, option  # noqa: E402
from course.launch import RankFailure, in_torchrun, launch  # noqa: E402
from course.results import print_epoch_table  # noqa: E402
from three_d.step import SCHEDULES  # noqa: E402

RESULTS_PREFIX = "three_d_"
THREE_D = "3D parallelism"


@dataclass
class ThreeDConfig(RunConfig):
    """``project/run_3d.py``: ``dp x pp x tp`` ranks on one device mesh."""

    description = "3D-parallel (dp x pp x tp) GPT-2 training on Multi30k German→English (assignment 5.6)."
    results_prefix = RESULTS_PREFIX
    mesh_options = ("dp", "pp", "tp", "micro_batches")
    world_option = None

    dp: int | None = option(1, "data-parallel replicas", group="mesh")
    pp: int | None = option(4, "pipeline stages", group="mesh")
    tp: int | None = option(2, "tensor-parallel ranks per stage", group="mesh")
    micro_batches: int = option(8, "micro-batches per dp rank's share of a batch", group="mesh", old=("n_chunk",))
    schedule: str = option("1f1b", "pipeline schedule (one model chunk per rank)", group=THREE_D, choices=SCHEDULES)
    scatter_gather: bool = option(False, "send 1/tp of each activation between stages and all-gather it in the tp "
                                         "group", group=THREE_D)
    max_grad_norm: float = option(1.0, "clip the global gradient norm to this", group=THREE_D)
    trace: str | None = option(None, "write a Chrome/Perfetto trace (chrome://tracing JSON) of the last batch of the "
                                     "last epoch", group=THREE_D, metavar="FILE")

    def check(self) -> None:
        super().check()
        if self.batch_size % (self.dp * self.micro_batches):
            raise ConfigError(f"--batch_size {self.batch_size} is not divisible by --dp {self.dp} x --micro_batches "
                              f"{self.micro_batches}: every dp rank gets batch_size / dp rows cut into micro_batches "
                              f"equal micro-batches; try --batch_size "
                              f"{max(1, self.batch_size // (self.dp * self.micro_batches)) * self.dp * self.micro_batches}")
        if not self.max_grad_norm > 0:
            raise ConfigError(f"--max_grad_norm must be positive, not {self.max_grad_norm}")

    def check_environment(self) -> None:
        super().check_environment()
        if self.resume is not None:
            check_resume_layout(self)


def parse_args(argv=None) -> ThreeDConfig:
    """The run's :class:`ThreeDConfig` from the command line (exits with a message on bad input)."""
    return ThreeDConfig.from_command_line(argv)


def check_resume_layout(config: ThreeDConfig) -> None:
    """A checkpoint reshards across --dp and --pp, not across --tp or the number of ranks: refuse here if it would.

    Raises:
        ConfigError: naming what to change.
    """
    from course.checkpoint import checkpoint_root, resolve_resume
    from three_d.training import checkpoint_layout, tp_mismatch_message

    path = resolve_resume(config.resume, checkpoint_root(config.workdir, RESULTS_PREFIX))
    try:
        saved = checkpoint_layout(path)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    if saved["tp"] != config.tp:
        raise ConfigError(tp_mismatch_message(saved, config.tp))
    ranks = saved["dp"] * saved["pp"] * saved["tp"]
    if ranks != config.world_size:
        raise ConfigError(f"--resume: the checkpoint was written by dp={saved['dp']} x pp={saved['pp']} x "
                          f"tp={saved['tp']} = {ranks} ranks, this run has {config.world_size}; the progress and "
                          f"random generators are kept per rank: choose --dp and --pp with dp x pp = "
                          f"{ranks // saved['tp']}")


def main(argv=None) -> int:
    args = parse_args(argv)
    from three_d.trace import write_chrome_trace
    from three_d.training import run_3d

    world_size = args.world_size
    print(f"3d: dp={args.dp} pp={args.pp} tp={args.tp} schedule={args.schedule} micro_batches={args.micro_batches} "
          f"batch={args.batch_size} device={args.device} preset={args.preset} max_batches={args.max_batches}",
          flush=True)
    try:
        launch(run_3d, world_size, args, device=args.device, backend=args.backend, timeout=args.timeout,
               collective_timeout=600, max_restarts=args.max_restarts)
    except RankFailure as exc:
        print(f"run failed: {exc}", file=sys.stderr)
        return 1
    print_epoch_table(args.workdir, prefix=RESULTS_PREFIX, n_epochs=args.n_epochs)
    if args.trace and not in_torchrun():
        print(f"trace: {write_chrome_trace(args.workdir, args.n_epochs - 1, world_size, args.trace)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
