"""Data-parallel GPT-2 training on Multi30k German→English (assignment 5.1).

    python project/run_data_parallel.py --dp 2
    torchrun --standalone --nproc_per_node=2 project/run_data_parallel.py

Spawns ``--dp`` processes (gloo on CPU, NCCL with one GPU each), or joins the
group torchrun made. Writes ``<workdir>/rank{r}_results_epoch{e}.json`` and the scored
translations ``<workdir>/translations_epoch{e}.json``.
"""
from __future__ import annotations

import sys
from pathlib import Path

if __name__ == "__main__":  # run as a file: import the packages of the tree this script sits in
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from course.launch import RankFailure, launch  # noqa: E402
from course.results import print_epoch_table  # noqa: E402
from project.options.run_data_parallel import COMM, DataParallelConfig, MEMORY, check_resume_layout  # noqa: E402,F401


def parse_args(argv=None) -> DataParallelConfig:
    """The run's :class:`DataParallelConfig` from the command line (exits with a message on bad input)."""
    return DataParallelConfig.from_command_line(argv)


def grad_sync_factory(args):
    """None (average_gradients) unless a gradient-communication option is set; else the factory
    ``run_dp`` calls in every rank to build it."""
    if args.bucket_mb is None and not args.overlap and args.compression == "none":
        return None
    from communication.compression import build_grad_sync

    return build_grad_sync


def main(argv=None) -> int:
    args = parse_args(argv)
    from data_parallel.training import run_dp

    make_sharding = None
    if args.zero or args.activation_checkpointing or args.precision != "fp32":  # (--hsdp needs --zero 3)
        from memory.training import build_sharding as make_sharding
    factory = grad_sync_factory(args)
    sync = ("average_gradients" if factory is None else f"compression={args.compression}" if args.compression != "none"
            else f"buckets of {args.bucket_mb or 25.0} MB, overlap={args.overlap}")
    print(f"data parallel: dp={args.dp} device={args.device} backend={args.backend} "
          f"preset={args.preset} global batch={args.batch_size} ({args.batch_size // args.dp} per rank), "
          f"gradients: {sync if not args.zero else f'ZeRO-{args.zero}'}"
          f"{f' (HSDP: {args.hsdp} replicas x {args.dp // args.hsdp})' if args.hsdp > 1 else ''}"
          f"{f' (ZeRO++: {args.zeropp})' if args.zeropp else ''}, precision={args.precision}, "
          f"activation_checkpointing={args.activation_checkpointing}", flush=True)
    try:
        launch(run_dp, args.dp, args, make_sharding, factory, device=args.device, backend=args.backend,
               timeout=args.timeout, max_restarts=args.max_restarts)
    except RankFailure as exc:
        print(f"run failed: {exc}", file=sys.stderr)
        return 1
    print_epoch_table(args.workdir, prefix="", n_epochs=args.n_epochs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
