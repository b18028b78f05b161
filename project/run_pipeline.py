"""Pipeline-parallel GPT-2 training on Multi30k German→English (assignment 5.2).

    python project/run_pipeline.py                                   # pipeline_parallel, CPU defaults
    python project/run_pipeline.py --model_parallel_mode model_parallel
    python project/run_pipeline.py --model_parallel_mode 1f1b --n_stages 2 --n_chunk 4
    python project/run_pipeline.py --model_parallel_mode 1f1b --n_stages 2 --balance auto
    python project/run_pipeline.py --model_parallel_mode interleaved --n_stages 2 --n_virtual 2
    python project/run_pipeline.py --model_parallel_mode zb-h1 --n_stages 2
    torchrun --standalone --nproc_per_node=4 project/run_pipeline.py --model_parallel_mode 1f1b

``model_parallel`` and ``pipeline_parallel`` run in this process (one worker thread per
stage; on GPUs stage s on ``cuda:s``); ``1f1b``, ``gpipe``, ``interleaved`` (``--n_virtual``
chunks per process) and ``zb-h1`` start one process per stage
(gloo on CPU, NCCL with one GPU each) or join the group torchrun made. Writes
``<workdir>/pipeline_<mode>_rank{r}_results_epoch{e}.json`` (with the per-stage
timeline) and ``<workdir>/pipeline_<mode>_translations_epoch{e}.json``.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

if __name__ == "__main__":  # run as a file: import the packages of the tree this script sits in
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from course.cli import add_common_args, check_common_args  # noqa: E402
from course.launch import RankFailure, default_world_size, in_torchrun, launch  # noqa: E402
from course.model import PRESETS  # noqa: E402
from course.results import print_epoch_table  # noqa: E402

MODES = ("model_parallel", "pipeline_parallel", "1f1b", "gpipe", "interleaved", "zb-h1")
MULTIPROCESS = ("1f1b", "gpipe", "interleaved", "zb-h1")


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--model_parallel_mode", default="pipeline_parallel", choices=MODES,
                        help="model_parallel: stages one after another; pipeline_parallel: Pipe with micro-batches; "
                             "1f1b / gpipe: one process per stage with that schedule")
    parser.add_argument("--n_stages", type=int, default=None,
                        help="pipeline stages (default: torchrun's WORLD_SIZE for 1f1b/gpipe, else 2)")
    parser.add_argument("--n_chunk", type=int, default=4,
                        help="micro-batches per batch (micro-batch size = batch_size // n_chunk)")
    parser.add_argument("--balance", default="count", choices=("count", "auto"),
                        help="layers per stage: count = blocks spread evenly (embeddings on the first, head on the "
                             "last stage); auto = from each layer's measured forward+backward time, the LM head's "
                             "included (multi-process modes)")
    parser.add_argument("--n_virtual", type=int, default=None,
                        help="interleaved: model chunks (virtual stages) per process, default 2; other modes: 1")
    add_common_args(parser, batch_size=64)
    parser.set_defaults(max_batches=150)
    args = parser.parse_args(argv)
    multiprocess = args.model_parallel_mode in MULTIPROCESS
    if args.n_stages is None:
        args.n_stages = default_world_size(2) if multiprocess else 2
    if args.n_stages < 1:
        parser.error(f"--n_stages must be >= 1, not {args.n_stages}")
    if not multiprocess and in_torchrun():
        parser.error(f"--model_parallel_mode {args.model_parallel_mode} runs in one process; under torchrun use "
                     "--model_parallel_mode 1f1b, gpipe, interleaved or zb-h1 (one process per stage)")
    if multiprocess and in_torchrun() and args.n_stages != default_world_size(args.n_stages):
        parser.error(f"--n_stages {args.n_stages} must equal torchrun's WORLD_SIZE {default_world_size(1)} "
                     "(one process per stage)")
    if args.n_chunk < 1:
        parser.error(f"--n_chunk must be >= 1 (micro-batches per batch), not {args.n_chunk}")
    if args.batch_size // args.n_chunk < 1:
        parser.error(f"--n_chunk {args.n_chunk} is larger than --batch_size {args.batch_size}: the micro-batch size "
                     f"batch_size // n_chunk would be < 1; use --n_chunk <= {args.batch_size}")
    if args.batch_size % args.n_chunk:
        parser.error(f"--batch_size {args.batch_size} is not divisible by --n_chunk {args.n_chunk}: every micro-batch "
                     f"must have batch_size // n_chunk rows; try --batch_size "
                     f"{args.batch_size // args.n_chunk * args.n_chunk}")
    args = check_common_args(parser, args, args.n_stages if multiprocess else 1,
                             results_prefix=f"pipeline_{args.model_parallel_mode}_")
    interleaved = args.model_parallel_mode == "interleaved"
    if args.n_virtual is None:
        args.n_virtual = 2 if interleaved else 1
    if args.n_virtual < 1 or (args.n_virtual != 1 and not interleaved):
        parser.error(f"--n_virtual {args.n_virtual}: model chunks per process must be >= 1, and more than 1 only "
                     "with --model_parallel_mode interleaved")
    if args.balance == "auto" and not multiprocess:
        parser.error(f"--balance auto places the stages of the multi-process modes {MULTIPROCESS}; "
                     f"--model_parallel_mode {args.model_parallel_mode} splits by count")
    if interleaved:
        from pipeline.schedules import micro_batches_per_round
        try:
            micro_batches_per_round(args.n_stages, args.n_chunk)
        except ValueError as exc:
            parser.error(f"--n_chunk {args.n_chunk}: {exc}")
    n_layer = PRESETS[args.preset]["n_layer"]
    if args.n_stages > n_layer:
        parser.error(f"--n_stages {args.n_stages} is more than the {n_layer} transformer blocks of preset "
                     f"{args.preset!r}; use --n_stages <= {n_layer} or a bigger --preset")
    if args.n_stages * args.n_virtual > n_layer:
        parser.error(f"--n_stages {args.n_stages} x --n_virtual {args.n_virtual} virtual stages are more than the "
                     f"{n_layer} transformer blocks of preset {args.preset!r}; use fewer or a bigger --preset")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    from pipeline.training import results_prefix, run_single_process, run_stage_worker

    mode = args.model_parallel_mode
    print(f"{mode}: n_stages={args.n_stages} n_chunk={1 if mode == 'model_parallel' else args.n_chunk} "
          f"batch={args.batch_size} device={args.device} preset={args.preset} max_batches={args.max_batches}",
          flush=True)
    if mode in MULTIPROCESS:
        try:
            launch(run_stage_worker, args.n_stages, args, device=args.device, backend=args.backend,
                   timeout=args.timeout, collective_timeout=600, max_restarts=args.max_restarts)
        except RankFailure as exc:
            print(f"run failed: {exc}", file=sys.stderr)
            return 1
    else:
        run_single_process(args)
    print_epoch_table(args.workdir, prefix=results_prefix(mode), n_epochs=args.n_epochs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
