"""3D-parallel GPT-2 training (data x pipeline x tensor parallel) on Multi30k German→English (assignment 5.6).

    python project/run_3d.py                                       # dp 1 x pp 4 x tp 2, 1F1B, 8 micro-batches
    python project/run_3d.py --dp 2 --pp 2 --tp 2 --schedule gpipe --micro_batches 4 --trace trace.json
    torchrun --standalone --nproc_per_node=8 project/run_3d.py --dp 1 --pp 4 --tp 2

Starts ``dp * pp * tp`` processes (gloo on the CPU, NCCL with one GPU each) or joins the
group torchrun made. Writes ``<workdir>/three_d_rank{r}_results_epoch{e}.json`` (timeline of
the last batch, communication per group, peak activation memory, coordinates) and
``<workdir>/three_d_translations_epoch{e}.json``; ``--trace FILE`` writes a Chrome/Perfetto
trace of the run (:mod:`course.trace`: every rank, named by its mesh coordinates, with its forwards
and backwards, optimizer steps and, on a row of their own, its communication — tp all-reduces, pp
sends/receives, dp and tied all-reduces, with bytes — on one clock), ``--profile`` a torch.profiler
trace per rank (:mod:`course.profiler`).

Checkpoints (``--checkpoint_every N``) load at another layout with the same tp and number of
ranks: ``python project/run_3d.py --dp 1 --pp 4 --tp 2 --checkpoint_every 100`` then
``python project/run_3d.py --dp 2 --pp 2 --tp 2 --resume <workdir>/three_d_checkpoints/step00000100``
(``torch.distributed.checkpoint`` reads each stage's layers from wherever they were written;
see :mod:`three_d.training`). A different ``--tp`` is refused before any process starts.
"""
import sys
from pathlib import Path

if __name__ == "__main__":  # run as a file: import the packages of the tree this script sits in
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from project.options.run_3d import ThreeDConfig  # noqa: E402,F401  (imported from here too)
from project.train import mode_command  # noqa: E402

parse_args, main = mode_command("3d")  # this command is project/train.py --mode 3d

if __name__ == "__main__":
    sys.exit(main())
