"""Data-parallel GPT-2 training on Multi30k German→English (assignment 5.1).

    python project/run_data_parallel.py --dp 2
    torchrun --standalone --nproc_per_node=2 project/run_data_parallel.py

Spawns ``--dp`` processes (gloo on CPU, NCCL with one GPU each), or joins the
group torchrun made. Writes ``<workdir>/rank{r}_results_epoch{e}.json`` and the scored
translations ``<workdir>/translations_epoch{e}.json``.
"""
import sys
from pathlib import Path

if __name__ == "__main__":  # run as a file: import the packages of the tree this script sits in
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from project.options.run_data_parallel import DataParallelConfig  # noqa: E402,F401
from project.train import mode_command  # noqa: E402

parse_args, main = mode_command("dp")  # this command is project/train.py --mode dp

if __name__ == "__main__":
    sys.exit(main())
