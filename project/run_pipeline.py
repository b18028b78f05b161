"""Pipeline-parallel GPT-2 training on Multi30k German→English (assignment 5.2).

    python project/run_pipeline.py                                   # --single_process pipe, CPU defaults
    python project/run_pipeline.py --single_process sequential
    python project/run_pipeline.py --schedule 1f1b --pp 2 --micro_batches 4
    python project/run_pipeline.py --schedule 1f1b --pp 2 --balance auto
    python project/run_pipeline.py --schedule interleaved --pp 2 --virtual_stages 2
    python project/run_pipeline.py --schedule zb-h1 --pp 2
    torchrun --standalone --nproc_per_node=4 project/run_pipeline.py --schedule 1f1b

``--single_process pipe`` (the Pipe, the default) and ``sequential`` run in this process (one worker thread per
stage; on GPUs stage s on ``cuda:s``); ``--schedule`` ``1f1b``, ``gpipe``, ``interleaved`` (``--virtual_stages``
chunks per process), ``zb-h1``, ``zbv`` and ``dualpipev`` start one process per stage
(gloo on CPU, NCCL with one GPU each) or join the group torchrun made. Writes
``<workdir>/pipeline_<schedule or single_process>_rank{r}_results_epoch{e}.json`` (with the per-stage
timeline) and ``<workdir>/pipeline_<schedule or single_process>_translations_epoch{e}.json``.
"""
import sys
from pathlib import Path

if __name__ == "__main__":  # run as a file: import the packages of the tree this script sits in
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from project.options.run_pipeline import PipelineConfig  # noqa: E402,F401  (imported from here too)
from project.train import mode_command  # noqa: E402

parse_args, main = mode_command("pipeline")  # this command is project/train.py --mode pipeline

if __name__ == "__main__":
    sys.exit(main())
