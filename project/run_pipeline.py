"""Pipeline-parallel GPT-2 training on Multi30k German→English (assignment 5.2).

    python project/run_pipeline.py                                   # pipeline_parallel, CPU defaults
    python project/run_pipeline.py --model_parallel_mode model_parallel
    python project/run_pipeline.py --model_parallel_mode 1f1b --pp 2 --micro_batches 4
    python project/run_pipeline.py --model_parallel_mode 1f1b --pp 2 --balance auto
    python project/run_pipeline.py --model_parallel_mode interleaved --pp 2 --virtual_stages 2
    python project/run_pipeline.py --model_parallel_mode zb-h1 --pp 2
    torchrun --standalone --nproc_per_node=4 project/run_pipeline.py --model_parallel_mode 1f1b

``model_parallel`` and ``pipeline_parallel`` run in this process (one worker thread per
stage; on GPUs stage s on ``cuda:s``); ``1f1b``, ``gpipe``, ``interleaved`` (``--virtual_stages``
chunks per process) and ``zb-h1`` start one process per stage
(gloo on CPU, NCCL with one GPU each) or join the group torchrun made. Writes
``<workdir>/pipeline_<mode>_rank{r}_results_epoch{e}.json`` (with the per-stage
timeline) and ``<workdir>/pipeline_<mode>_translations_epoch{e}.json``.
"""
from __future__ import annotations

import sys
from pathlib import Path

if __name__ == "__main__":  # run as a file: import the packages of the tree this script sits in
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from course.launch import RankFailure, launch  # noqa: E402
from course.results import print_epoch_table  # noqa: E402
from project.options.run_pipeline import MODES, PIPELINE, PipelineConfig, SINGLE_PROCESS  # noqa: E402,F401


def parse_args(argv=None) -> PipelineConfig:
    """The run's :class:`PipelineConfig` from the command line (exits with a message on bad input)."""
    return PipelineConfig.from_command_line(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    from pipeline.training import results_prefix, run_single_process, run_stage_worker

    mode = args.model_parallel_mode
    print(f"{mode}: pp={args.pp} micro_batches={1 if mode == 'model_parallel' else args.micro_batches} "
          f"batch={args.batch_size} device={args.device} preset={args.preset} max_batches={args.max_batches}",
          flush=True)
    if args.multiprocess:
        try:
            launch(run_stage_worker, args.pp, args, device=args.device, backend=args.backend,
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
