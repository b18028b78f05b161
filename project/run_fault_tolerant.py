"""Fault-tolerant GPT-2 training on Multi30k German→English: replica groups under torchft (notebook 11).

    python project/run_fault_tolerant.py --replicas 3 --max_batches 20
    python project/run_fault_tolerant.py --replicas 3 --max_batches 20 --kill_group 2 --kill_step 6   # a drill
    python project/run_fault_tolerant.py --replicas 3 --max_batches 20 --kill_group 2 --kill_step 6 \\
        --recovery restart_all --checkpoint_every 4                                             # stop the world

Starts torchft's lighthouse in this process and ``--replicas`` replica groups of ``--dp`` processes each (gloo on
CPU, NCCL with one GPU each); the gradients are averaged over the live quorum every step. Writes
``<workdir>/ft_replica{g}_rank{r}_results_epoch{e}.json``; with ``--kill_group`` prints the steps and seconds the
failure cost.
"""
import sys
from pathlib import Path

if __name__ == "__main__":  # run as a file: import the packages of the tree this script sits in
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from project.options.run_fault_tolerant import FaultTolerantConfig  # noqa: E402,F401
from project.train import mode_command  # noqa: E402

parse_args, main = mode_command("ft")  # this command is project/train.py --mode ft

if __name__ == "__main__":
    sys.exit(main())
