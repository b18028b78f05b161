"""Data-parallel GPT-2 training on Multi30k German→English (assignment 5.1).

    python project/run_data_parallel.py --world_size 2
    torchrun --standalone --nproc_per_node=2 project/run_data_parallel.py

Spawns ``--world_size`` processes (gloo on CPU, NCCL with one GPU each), or joins the
group torchrun made. Writes ``<workdir>/rank{r}_results_epoch{e}.json`` and the scored
translations ``<workdir>/translations_epoch{e}.json``.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

if __name__ == "__main__":  # run as a file: import the packages of the tree this script sits in
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from course.cli import add_common_args, check_common_args  # noqa: E402
from course.launch import RankFailure, default_world_size, launch  # noqa: E402
from course.results import print_epoch_table  # noqa: E402


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--world_size", type=int, default=None,
                        help="number of data-parallel processes (default: torchrun's WORLD_SIZE, else 2)")
    parser.add_argument("--save_checkpoint", action="store_true",
                        help="rank 0 saves the final weights to <workdir>/checkpoint_data_parallel.pt")
    comm = parser.add_argument_group("gradient communication (notebooks/04_communication.ipynb)")
    comm.add_argument("--bucket_mb", type=float, default=None,
                      help="average gradients in buckets of this many MB (communication.BucketedReducer) instead of "
                           "one all-reduce per parameter after the backward pass (default with --overlap: 25)")
    comm.add_argument("--overlap", action="store_true",
                      help="start each bucket's all-reduce during the backward pass, as soon as it is full")
    comm.add_argument("--compression", default="none", choices=["none", "topk", "powersgd"],
                      help="topk: top-k sparsification with error feedback; powersgd: rank --powersgd_rank PowerSGD")
    comm.add_argument("--topk_ratio", type=float, default=0.01, help="--compression topk: fraction of entries sent")
    comm.add_argument("--powersgd_rank", type=int, default=1, help="--compression powersgd: matrix rank")
    memory = parser.add_argument_group("memory (notebooks/05_memory.ipynb)")
    memory.add_argument("--zero", type=int, default=0, choices=[0, 1, 2, 3],
                        help="ZeRO stage: 0 plain data parallelism, 1 optimizer state sharded over the ranks, "
                             "2 also gradients, 3 also parameters (FSDP, each GPT-2 block a unit)")
    memory.add_argument("--activation_checkpointing", action="store_true",
                        help="recompute each GPT-2 block's activations in the backward pass")
    memory.add_argument("--precision", default="fp32", choices=["fp32", "bf16"],
                        help="bf16: autocast the forward/backward to bfloat16; weights, gradient reductions "
                             "and Adam stay fp32")
    add_common_args(parser)
    args = parser.parse_args(argv)
    args.world_size = args.world_size if args.world_size is not None else default_world_size(2)
    if args.world_size < 1:
        parser.error(f"--world_size must be >= 1, not {args.world_size}")
    if args.batch_size % args.world_size:
        parser.error(f"--batch_size {args.batch_size} is not divisible by --world_size {args.world_size}: "
                     f"each rank takes batch_size // world_size examples; try --batch_size "
                     f"{max(args.world_size, args.batch_size // args.world_size * args.world_size)}")
    if args.zero and (getattr(args, "checkpoint_every", None) or getattr(args, "resume", None)):
        parser.error(f"--zero {args.zero} cannot write or resume checkpoints yet (the optimizer state is "
                     "sharded); drop --checkpoint_every/--resume, or use --zero 0")
    if args.bucket_mb is not None and args.bucket_mb <= 0:
        parser.error(f"--bucket_mb must be > 0 (MB per bucket), not {args.bucket_mb}; try --bucket_mb 25")
    if not 0 < args.topk_ratio <= 1:
        parser.error(f"--topk_ratio must be in (0, 1] (fraction of gradient entries sent), not {args.topk_ratio}")
    if args.powersgd_rank < 1:
        parser.error(f"--powersgd_rank must be >= 1, not {args.powersgd_rank}")
    if args.compression != "none" and (args.bucket_mb is not None or args.overlap):
        parser.error(f"--compression {args.compression} sends its own compressed messages per tensor: "
                     "drop --bucket_mb/--overlap, or use --compression none")
    memory_options = [o for o, on in (("--zero", args.zero), ("--activation_checkpointing", args.activation_checkpointing),
                                      ("--precision bf16", args.precision != "fp32")) if on]
    comm_options = [o for o, on in (("--bucket_mb", args.bucket_mb is not None), ("--overlap", args.overlap),
                                    ("--compression", args.compression != "none")) if on]
    if memory_options and comm_options:
        parser.error(f"{', '.join(memory_options)} run the memory part's training step, which does its own gradient "
                     f"communication; drop {', '.join(comm_options)} (notebook 04's options), or the memory options")
    return check_common_args(parser, args, args.world_size, results_prefix="")


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
    if args.zero or args.activation_checkpointing or args.precision != "fp32":
        from memory.training import build_sharding as make_sharding
    factory = grad_sync_factory(args)
    sync = ("average_gradients" if factory is None else f"compression={args.compression}" if args.compression != "none"
            else f"buckets of {args.bucket_mb or 25.0} MB, overlap={args.overlap}")
    print(f"data parallel: world_size={args.world_size} device={args.device} backend={args.backend} "
          f"preset={args.preset} global batch={args.batch_size} ({args.batch_size // args.world_size} per rank), "
          f"gradients: {sync if not args.zero else f'ZeRO-{args.zero}'}, precision={args.precision}, "
          f"activation_checkpointing={args.activation_checkpointing}", flush=True)
    try:
        launch(run_dp, args.world_size, args, make_sharding, factory, device=args.device, backend=args.backend,
               timeout=args.timeout, max_restarts=args.max_restarts)
    except RankFailure as exc:
        print(f"run failed: {exc}", file=sys.stderr)
        return 1
    print_epoch_table(args.workdir, prefix="", n_epochs=args.n_epochs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
