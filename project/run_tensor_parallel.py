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

import sys
from pathlib import Path

if __name__ == "__main__":  # run as a file: import the packages of the tree this script sits in
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from course.launch import RankFailure, launch  # noqa: E402
from course.results import print_epoch_table  # noqa: E402
from project.options.run_tensor_parallel import RESULTS_PREFIX, TensorParallelConfig  # noqa: E402,F401


def parse_args(argv=None) -> TensorParallelConfig:
    """The run's :class:`TensorParallelConfig` from the command line (exits with a message on bad input)."""
    return TensorParallelConfig.from_command_line(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    from tensor_parallel.training import run_tp

    kinds = args.block_types
    print(f"tensor parallel: tp={args.tp} sequence_parallel={args.sequence_parallel} block_types={kinds} "
          f"device={args.device} backend={args.backend} preset={args.preset} batch={args.batch_size}", flush=True)
    try:
        launch(run_tp, args.tp, args, device=args.device, backend=args.backend, timeout=args.timeout,
               max_restarts=args.max_restarts)
    except RankFailure as exc:
        print(f"run failed: {exc}", file=sys.stderr)
        return 1
    print_epoch_table(args.workdir, prefix=RESULTS_PREFIX, n_epochs=args.n_epochs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
