"""3D-parallel GPT-2 training (data x pipeline x tensor parallel) on Multi30k German→English (assignment 5.6).

    python project/run_3d.py                                       # dp 1 x pp 4 x tp 2, 1F1B, 8 micro-batches
    python project/run_3d.py --dp 2 --pp 2 --tp 2 --schedule gpipe --n_chunk 4 --trace trace.json
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

import argparse
import sys
from pathlib import Path

if __name__ == "__main__":  # run as a file: import the packages of the tree this script sits in
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from course.cli import add_common_args, check_common_args  # noqa: E402
from course.launch import RankFailure, in_torchrun, launch  # noqa: E402
from course.mesh import ParallelDims  # noqa: E402
from course.model import PRESETS  # noqa: E402
from course.results import print_epoch_table  # noqa: E402

RESULTS_PREFIX = "three_d_"


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    mesh = parser.add_argument_group("3D parallelism")
    mesh.add_argument("--dp", type=int, default=1, help="data-parallel replicas")
    mesh.add_argument("--pp", type=int, default=4, help="pipeline stages")
    mesh.add_argument("--tp", type=int, default=2, help="tensor-parallel ranks per stage")
    mesh.add_argument("--schedule", default="1f1b", choices=("1f1b", "gpipe"), help="pipeline schedule")
    mesh.add_argument("--n_chunk", type=int, default=8, help="micro-batches per dp rank's share of a batch")
    mesh.add_argument("--scatter_gather", action="store_true",
                      help="send 1/tp of each activation between stages and all-gather it in the tp group")
    mesh.add_argument("--max_grad_norm", type=float, default=1.0, help="clip the global gradient norm to this")
    mesh.add_argument("--trace", default=None, metavar="FILE",
                      help="write a Chrome/Perfetto trace (chrome://tracing JSON) of the last batch of the last epoch")
    add_common_args(parser, batch_size=64)
    args = parser.parse_args(argv)
    try:
        dims = ParallelDims(dp=args.dp, pp=args.pp, tp=args.tp)
    except ValueError as exc:
        parser.error(str(exc))
    if args.n_chunk < 1:
        parser.error(f"--n_chunk must be >= 1 (micro-batches per batch), not {args.n_chunk}")
    if args.batch_size % (args.dp * args.n_chunk):
        parser.error(f"--batch_size {args.batch_size} is not divisible by --dp {args.dp} x --n_chunk {args.n_chunk}: "
                     f"every dp rank gets batch_size / dp rows cut into n_chunk equal micro-batches; try --batch_size "
                     f"{max(1, args.batch_size // (args.dp * args.n_chunk)) * args.dp * args.n_chunk}")
    if not args.max_grad_norm > 0:
        parser.error(f"--max_grad_norm must be positive, not {args.max_grad_norm}")
    args = check_common_args(parser, args, dims.world_size, results_prefix=RESULTS_PREFIX)
    shape = PRESETS[args.preset]
    try:
        dims.check(dims.world_size, n_layer=shape["n_layer"], n_head=shape["n_head"],
                   n_inner=shape.get("n_inner") or 4 * shape["n_embd"])
    except ValueError as exc:
        parser.error(f"{exc} (preset {args.preset!r})")
    if args.resume is not None:
        check_resume_layout(parser, args, dims)
    if in_torchrun():
        import os

        if int(os.environ.get("WORLD_SIZE", "1")) != dims.world_size:
            parser.error(f"dp x pp x tp = {dims.world_size} must equal torchrun's WORLD_SIZE "
                         f"{os.environ.get('WORLD_SIZE')}")
    return args


def check_resume_layout(parser, args, dims: ParallelDims) -> None:
    """A checkpoint reshards across --dp and --pp, not across --tp or the number of ranks: stop here if it would."""
    from course.checkpoint import checkpoint_root, resolve_resume
    from three_d.training import checkpoint_layout, tp_mismatch_message

    path = resolve_resume(args.resume, checkpoint_root(args.workdir, RESULTS_PREFIX))
    try:
        saved = checkpoint_layout(path)
    except ValueError as exc:
        parser.error(str(exc))
    if saved["tp"] != dims.tp:
        parser.error(tp_mismatch_message(saved, dims.tp))
    ranks = saved["dp"] * saved["pp"] * saved["tp"]
    if ranks != dims.world_size:
        parser.error(f"--resume: the checkpoint was written by dp={saved['dp']} x pp={saved['pp']} x tp={saved['tp']} "
                     f"= {ranks} ranks, this run has {dims.world_size}; the progress and random generators are kept "
                     f"per rank: choose --dp and --pp with dp x pp = {ranks // saved['tp']}")


def main(argv=None) -> int:
    args = parse_args(argv)
    from three_d.trace import write_chrome_trace
    from three_d.training import run_3d

    world_size = args.dp * args.pp * args.tp
    print(f"3d: dp={args.dp} pp={args.pp} tp={args.tp} schedule={args.schedule} n_chunk={args.n_chunk} "
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
