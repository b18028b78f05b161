"""Tensor-parallel GPT-2 training on Multi30k German→English (assignment 5.3).

    python project/run_tensor_parallel.py --tp 2
    python project/run_tensor_parallel.py --tp 2 --sequence_parallel
    python project/run_tensor_parallel.py --tp 2 --block_types tp,spd,parallel,parallel
    torchrun --standalone --nproc_per_node=4 project/run_tensor_parallel.py --tp 4

Spawns ``--tp`` processes (gloo on CPU, NCCL with one GPU each), or joins the group
torchrun made; every rank holds 1/tp of each split weight and all ranks process the
same batches. ``--block_types`` picks, per layer, exact Megatron blocks (``tp``), Sync-Point
Drop (``spd``, an approximation) or per-rank residual streams (``parallel``, a different
architecture): one name for all layers or one per layer, comma-separated. Writes
``<workdir>/tensor_parallel_rank{r}_results_epoch{e}.json`` (with the collectives per step).
"""
import sys
from pathlib import Path

if __name__ == "__main__":  # run as a file: import the packages of the tree this script sits in
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from project.options.run_tensor_parallel import TensorParallelConfig  # noqa: E402,F401  (imported from here too)
from project.train import mode_command  # noqa: E402

parse_args, main = mode_command("tp")  # this command is project/train.py --mode tp

if __name__ == "__main__":
    sys.exit(main())
