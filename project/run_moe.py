"""GPT-2 with mixture-of-experts MLPs, expert parallel × data parallel, on Multi30k German→English (assignment 5.8).

    python project/run_moe.py                                        # dp 2, ep 2, 4 experts, top-2, dropless
    python project/run_moe.py --dp 4 --ep 2 --num_experts 8 --top_k 1 --capacity_factor 1.25
    python project/run_moe.py --dp 2 --dense --top_k 2               # the dense GPT-2 of the same active parameters
    torchrun --standalone --nproc_per_node=4 project/run_moe.py --dp 4 --ep 4

Starts ``--dp`` processes (gloo on the CPU, NCCL with one GPU each) or joins the group torchrun
made. Every other block's MLP is an MoE layer of ``--num_experts`` GPT-2 MLPs, each token routed to
``--top_k`` of them; the experts are shared out over ``--ep`` ranks (tokens travel to them by
all-to-all), dense gradients are averaged over the dp group and each expert's over its replicas
(``moe.gradients``). Writes ``<workdir>/moe_rank{r}_results_epoch{e}.json`` (with what the routers
did at every step, the collectives per step by group and the parameter counts) and
``moe_translations_epoch{e}.json``.
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

if __name__ == "__main__":  # run as a file: import the packages of the tree this script sits in
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from course.cli import add_common_args, check_common_args  # noqa: E402
from course.launch import RankFailure, default_world_size, in_torchrun, launch  # noqa: E402
from course.mesh import ParallelDims  # noqa: E402
from course.model import PRESETS  # noqa: E402
from course.results import print_epoch_table  # noqa: E402

RESULTS_PREFIX = "moe_"


def parse_args(argv=None):
    """The options of the run, every one checked before any process starts (``parser.error``, exit code 2)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    moe = parser.add_argument_group("mixture of experts")
    moe.add_argument("--dp", type=int, default=None, help="data-parallel ranks (default: torchrun's WORLD_SIZE, else 2)")
    moe.add_argument("--ep", type=int, default=None, help="expert-parallel ranks, dividing --dp (default: --dp)")
    moe.add_argument("--num_experts", type=int, default=4, help="experts per MoE layer")
    moe.add_argument("--top_k", type=int, default=2, help="experts per token (1: Switch Transformer; 2: GShard, Mixtral)")
    moe.add_argument("--capacity_factor", type=float, default=None,
                     help="expert capacity = ceil(factor * tokens * top_k / experts), the rest dropped (default: dropless)")
    moe.add_argument("--no_normalize_gates", action="store_true",
                     help="top-k > 1: keep the softmax probabilities as gates instead of normalising them to sum to 1 "
                          "(top-1 gates are always the probability, as in Switch Transformer)")
    moe.add_argument("--aux_loss_coef", type=float, default=0.01, help="load-balancing loss weight (Switch: 0.01)")
    moe.add_argument("--z_loss_coef", type=float, default=0.001, help="router z-loss weight (ST-MoE: 0.001)")
    moe.add_argument("--moe_every", type=int, default=2, help="one MoE block in this many (blocks 1, 3, ... for 2)")
    moe.add_argument("--dense", action="store_true",
                     help="train the dense GPT-2 of the same active parameters per token instead (same batches)")
    add_common_args(parser, batch_size=32)
    args = parser.parse_args(argv)
    args.dp = args.dp if args.dp is not None else default_world_size(2)
    args.ep = args.ep if args.ep is not None else args.dp
    from moe.config import MoEConfig

    try:
        dims = ParallelDims(dp=args.dp, ep=args.ep)
        MoEConfig(args.num_experts, args.top_k, args.capacity_factor, None, args.aux_loss_coef,
                  args.z_loss_coef).check(args.ep)
    except ValueError as exc:
        parser.error(str(exc))
    if args.moe_every < 1:
        parser.error(f"--moe_every must be >= 1, not {args.moe_every}")
    if args.batch_size % args.dp:
        parser.error(f"--batch_size {args.batch_size} is not divisible by --dp {args.dp} (every rank takes an equal "
                     f"share of a batch); try --batch_size {max(1, args.batch_size // args.dp) * args.dp}")
    if in_torchrun() and int(os.environ["WORLD_SIZE"]) != dims.world_size:
        parser.error(f"--dp {args.dp} must equal torchrun's WORLD_SIZE {os.environ['WORLD_SIZE']}")
    args = check_common_args(parser, args, dims.world_size, results_prefix=RESULTS_PREFIX)
    n_layer = PRESETS[args.preset]["n_layer"]
    if n_layer < args.moe_every:
        parser.error(f"--preset {args.preset} has {n_layer} blocks: with --moe_every {args.moe_every} none would be an "
                     f"MoE block; lower --moe_every")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    from moe.training import run_moe

    kind = "dense" if args.dense else (f"{args.num_experts} experts, top-{args.top_k}, capacity factor "
                                       f"{args.capacity_factor or 'dropless'}")
    print(f"mixture of experts: dp={args.dp} ep={args.ep} {kind} device={args.device} backend={args.backend} "
          f"preset={args.preset} batch={args.batch_size}", flush=True)
    try:
        launch(run_moe, args.dp, args, device=args.device, backend=args.backend, timeout=args.timeout,
               max_restarts=args.max_restarts)
    except RankFailure as exc:
        print(f"run failed: {exc}", file=sys.stderr)
        return 1
    print_epoch_table(args.workdir, prefix=RESULTS_PREFIX, n_epochs=args.n_epochs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
