"""Context-parallel GPT-2 training on packed Multi30k sequences (assignment 5.7).

    python project/run_context_parallel.py --cp 2                        # ring attention, zig-zag layout
    python project/run_context_parallel.py --cp 2 --attention ulysses    # DeepSpeed-Ulysses
    python project/run_context_parallel.py --dp 2 --cp 2 --seq_len 2048  # 4 ranks: dp x cp
    torchrun --standalone --nproc_per_node=4 project/run_context_parallel.py --dp 2 --cp 2

Spawns ``--dp x --cp`` processes (gloo on CPU, NCCL with one GPU each), or joins the group
torchrun made. Translation pairs are packed into sequences of ``--seq_len`` tokens (several pairs
per sequence, attention causal across them: ``context_parallel/packing.py``); every sequence is
cut over the cp group — ``--layout zigzag`` (default) or ``contiguous`` for the ring, contiguous
for Ulysses — and attention runs across it with ``--attention ring`` (Liu et al. 2023) or
``ulysses`` (Jacobs et al. 2023). Gradients are averaged over dp x cp. ``--batch_size`` counts
packed sequences: the default, 2 of 1024 tokens, is about the 64 pairs per step of the other
scripts' default batch, so an epoch takes as many optimizer steps. Validation loss and BLEU
are measured on single pairs, as in the other modes. Writes
``<workdir>/context_parallel_rank{r}_results_epoch{e}.json`` (with the communication per step and
group) and ``context_parallel_translations_epoch{e}.json``.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

if __name__ == "__main__":  # run as a file: import the packages of the tree this script sits in
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from course.cli import add_common_args, check_common_args  # noqa: E402
from course.launch import RankFailure, default_world_size, in_torchrun, launch  # noqa: E402
from course.mesh import ParallelDims  # noqa: E402
from course.model import PRESETS  # noqa: E402
from course.results import print_epoch_table  # noqa: E402

RESULTS_PREFIX = "context_parallel_"


def parse_args(argv=None):
    """The script's options, checked before any process starts (exits with a message on bad input)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    cp = parser.add_argument_group("context parallelism")
    cp.add_argument("--cp", type=int, default=None,
                    help="ranks each sequence is cut over (default: torchrun's WORLD_SIZE / dp, else 2)")
    cp.add_argument("--dp", type=int, default=1, help="data-parallel replicas (each of cp ranks)")
    cp.add_argument("--attention", default="ring", choices=["ring", "ulysses"],
                    help="ring attention (K/V blocks travel the ring) or Ulysses (all-to-all to heads)")
    cp.add_argument("--layout", default=None, choices=["zigzag", "contiguous"],
                    help="which chunks of a sequence each rank holds: zigzag (the ring's default; balances causal "
                         "work) or contiguous (Ulysses always)")
    cp.add_argument("--seq_len", type=int, default=1024, help="tokens per packed training sequence")
    cp.add_argument("--block_size", type=int, default=128, help="ring: tile size of the blockwise attention")
    add_common_args(parser, batch_size=2)
    args = parser.parse_args(argv)
    if args.dp < 1:
        parser.error(f"--dp must be >= 1, not {args.dp}")
    if args.cp is None:
        args.cp = max(1, default_world_size(2 * args.dp) // args.dp)
    if args.attention == "ulysses" and args.layout not in (None, "contiguous"):
        parser.error(f"--layout {args.layout} is for the ring; Ulysses always uses the contiguous layout")
    args.layout = args.layout or ("zigzag" if args.attention == "ring" else "contiguous")
    if args.block_size < 1:
        parser.error(f"--block_size must be >= 1, not {args.block_size}")
    if args.seq_len < args.model_max_length:
        parser.error(f"--seq_len {args.seq_len} is shorter than one pair may be (--model_max_length "
                     f"{args.model_max_length}); use a longer --seq_len")
    if args.batch_size % args.dp:
        parser.error(f"--batch_size {args.batch_size} is not divisible by --dp {args.dp}; each dp rank takes "
                     f"batch_size / dp sequences")
    try:
        dims = ParallelDims(dp=args.dp, cp=args.cp)
    except ValueError as exc:
        parser.error(str(exc))
    if in_torchrun():
        try:
            dims.check(default_world_size(dims.world_size))
        except ValueError as exc:
            parser.error(str(exc))
    chunks = 2 * args.cp if args.layout == "zigzag" else args.cp
    if args.seq_len % chunks:
        fit = args.seq_len // chunks * chunks
        parser.error(f"--seq_len {args.seq_len} must be divisible by {chunks} (the {args.layout} layout cuts each "
                     f"sequence into {chunks} equal chunks over --cp {args.cp}); try --seq_len {fit}")
    args = check_common_args(parser, args, dims.world_size, results_prefix=RESULTS_PREFIX)
    shape = PRESETS[args.preset]
    if args.attention == "ulysses":
        from context_parallel.ulysses import check_heads

        try:
            check_heads(shape["n_head"], args.cp)
        except ValueError as exc:
            parser.error(f"--preset {args.preset} with --cp {args.cp}: {exc}")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    from context_parallel.training import run_cp

    world = args.dp * args.cp
    print(f"context parallel: dp={args.dp} cp={args.cp} attention={args.attention} layout={args.layout} "
          f"seq_len={args.seq_len} device={args.device} backend={args.backend} preset={args.preset} "
          f"batch={args.batch_size} sequences", flush=True)
    try:
        launch(run_cp, world, args, device=args.device, backend=args.backend, timeout=args.timeout,
               max_restarts=args.max_restarts)
    except RankFailure as exc:
        print(f"run failed: {exc}", file=sys.stderr)
        return 1
    print_epoch_table(args.workdir, prefix=RESULTS_PREFIX, n_epochs=args.n_epochs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
