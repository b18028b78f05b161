"""Tensor-parallel GPT-2 training on Multi30k German→English (assignment 5.3).

    python project/run_tensor_parallel.py --tp_size 2
    python project/run_tensor_parallel.py --tp_size 2 --sequence_parallel
    python project/run_tensor_parallel.py --tp_size 2 --block_types tp,spd,parallel,parallel
    torchrun --standalone --nproc_per_node=4 project/run_tensor_parallel.py --tp_size 4

Spawns ``--tp_size`` processes (gloo on CPU, NCCL with one GPU each), or joins the group
torchrun made; every rank holds 1/tp_size of each split weight and all ranks process the
same batches. ``--block_types`` picks, per layer, exact Megatron blocks (``tp``), Sync-Point
Drop (``spd``, an approximation) or per-rank residual streams (``parallel``, a different
architecture): one name for all layers or one per layer, comma-separated. Writes
``<workdir>/tensor_parallel_rank{r}_results_epoch{e}.json`` (with the collectives per step).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from types import SimpleNamespace

if __name__ == "__main__":  # run as a file: import the packages of the tree this script sits in
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from course.cli import add_common_args, check_common_args  # noqa: E402
from course.launch import RankFailure, default_world_size, launch  # noqa: E402
from course.model import PRESETS  # noqa: E402
from course.results import print_epoch_table  # noqa: E402

RESULTS_PREFIX = "tensor_parallel_"


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    tp = parser.add_argument_group("tensor parallelism")
    tp.add_argument("--tp_size", type=int, default=None,
                    help="ranks the model is split over (default: torchrun's WORLD_SIZE, else 2)")
    tp.add_argument("--sequence_parallel", action="store_true",
                    help="also split layer norms and dropout along the sequence (Korthikanti et al. 2022)")
    tp.add_argument("--block_types", default="tp",
                    help="tp, spd or parallel: one for every layer, or one per layer comma-separated")
    add_common_args(parser, batch_size=32)
    args = parser.parse_args(argv)
    args.tp_size = args.tp_size if args.tp_size is not None else default_world_size(2)
    if args.tp_size < 1:
        parser.error(f"--tp_size must be >= 1, not {args.tp_size}")
    if args.sequence_parallel and args.model_max_length % args.tp_size:
        # Sequences are padded up to a multiple of tp_size; the longest (model_max_length) would then
        # run past the position embeddings, and a rank would crash mid-run.
        fit = args.model_max_length // args.tp_size * args.tp_size
        parser.error(f"--sequence_parallel splits each sequence into --tp_size {args.tp_size} equal parts, but "
                     f"--model_max_length {args.model_max_length} is not divisible by {args.tp_size}; "
                     f"try --model_max_length {fit}")
    args = check_common_args(parser, args, args.tp_size, results_prefix=RESULTS_PREFIX)
    from tensor_parallel.gpt2 import validate_tp_config

    shape = PRESETS[args.preset]
    config = SimpleNamespace(n_head=shape["n_head"], n_embd=shape["n_embd"], n_layer=shape["n_layer"],
                             n_inner=shape.get("n_inner"))
    try:
        args.block_types = validate_tp_config(config, args.tp_size, args.block_types)
    except ValueError as exc:
        parser.error(f"--preset {args.preset} with --tp_size {args.tp_size}: {exc}")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    from tensor_parallel.training import run_tp

    kinds = ",".join(args.block_types)
    print(f"tensor parallel: tp_size={args.tp_size} sequence_parallel={args.sequence_parallel} block_types={kinds} "
          f"device={args.device} backend={args.backend} preset={args.preset} batch={args.batch_size}", flush=True)
    try:
        launch(run_tp, args.tp_size, args, device=args.device, backend=args.backend, timeout=args.timeout,
               max_restarts=args.max_restarts)
    except RankFailure as exc:
        print(f"run failed: {exc}", file=sys.stderr)
        return 1
    print_epoch_table(args.workdir, prefix=RESULTS_PREFIX, n_epochs=args.n_epochs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
