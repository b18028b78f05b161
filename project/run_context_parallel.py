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
import sys
from pathlib import Path

if __name__ == "__main__":  # run as a file: import the packages of the tree this script sits in
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from project.options.run_context_parallel import ContextParallelConfig  # noqa: E402,F401  (imported from here too)
from project.train import mode_command  # noqa: E402

parse_args, main = mode_command("cp")  # this command is project/train.py --mode cp

if __name__ == "__main__":
    sys.exit(main())
