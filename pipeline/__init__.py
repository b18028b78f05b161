"""Assignment 5.2: pipeline parallelism, built by hand.

* ``clock_cycles``     — the clock-cycle schedule (assignment 5.2.1: ``clock_cycles._clock_cycles``)
* ``partition``        — ``split_module`` (5.2.1: ``partition._split_module``), ``WithDevice``, stage placement
* ``worker``, ``pipe`` — per-stage worker threads and ``Pipe`` (5.2.2)
* ``gpt2``             — GPT-2 as a chain of stage-able layers, ``GPT2Pipeline`` (5.2.3)
* ``schedules``, ``p2p``, ``stage_runner`` — GPipe and 1F1B action lists run across
  processes with send/recv in the pipeline's group (5.2.4); the runner executes the actions,
  ``stage_messages`` carries its messages, ``stage_measure`` times and counts its steps;
  ``step`` — one training step of a stage (``pipeline_step``: the schedule, then the tied gradient
  summed; the 3D step's core too) and the stages gathered back into one model (``gather_stages``); ``gpt2_stages`` cuts GPT-2
  into per-process stages and sums the tied embedding gradient; interleaved 1F1B with
  several chunks per rank (5.2.5) and ZB-H1 with the backward split into B and W (5.2.6);
  the V-shaped ZB-V and DualPipeV (two stages per rank, ``stage_of``; DualPipeV pairs the forward of
  one micro-batch with the backward of another) (5.2.7)
* ``partition.linear_partition``, ``gpt2.gpt2_measured_balance`` — stages balanced by
  measured layer cost (``--balance auto``)
* ``training``         — the training modes of ``project/run_pipeline.py``
* ``metrics``          — bubble and in-flight micro-batches of an action list, the replay of measured costs
* ``labs``             — ``schedule_benchmark`` (bubble and tokens/s of every schedule vs theory, JSON),
  ``bubble_experiment``, ``memory_experiment`` (the notebook's measurements; plots: :mod:`course.plots`) and
  ``checks`` (the exercises' answer checks)

See notebooks/02_pipeline_parallel.ipynb.
"""
from course.environment import torch_installed
from pipeline.clock_cycles import clock_cycles
from pipeline.metrics import bubble_fraction, peak_in_flight, replay
from pipeline.schedules import (SCHEDULES, Schedule, all_actions, dualpipev_actions, flatten_pairs, get_schedule,
                                gpipe_actions, interleaved_1f1b_actions, one_f_one_b_actions, rank_of, schedule_actions,
                                stage_of, zb_h1_actions, zbv_actions)

if torch_installed():  # without torch (modal run on a laptop) only the schedules' arithmetic above loads
    from pipeline.gpt2 import gpt2_balance
    from pipeline.partition import WithDevice, split_module
    from pipeline.pipe import Pipe
    from pipeline.stage_runner import StageRunner, StepResult
    from pipeline.step import gather_stages, pipeline_step

__all__ = ["Pipe", "WithDevice", "clock_cycles", "split_module", "gpipe_actions", "interleaved_1f1b_actions",
           "one_f_one_b_actions", "zb_h1_actions", "zbv_actions", "dualpipev_actions", "stage_of", "rank_of",
           "flatten_pairs", "SCHEDULES", "Schedule", "get_schedule", "schedule_actions",
           "all_actions", "gpt2_balance", "bubble_fraction", "peak_in_flight", "replay", "StageRunner",
           "StepResult", "pipeline_step", "gather_stages"]
