"""Assignment 5.1: data parallelism — partitioning, gradient averaging, training across processes.

* ``partition``      — ``Partition``, ``DataPartitioner``, ``partition_dataset`` (5.1.1)
* ``process_group``  — ``setup``, ``cleanup`` (5.1.2)
* ``gradients``      — ``average_gradients(model, group)`` (5.1.2)
* ``training``       — the data-parallel training mode and ``dp_training``, what
  ``project/run_data_parallel.py`` trains on every rank (5.1.3)
* ``labs``           — ``experiments``: workers that notebooks/01_data_parallel.ipynb launches;
  ``async_checkpoint_benchmark``; ``checks``: the exercises' answer checks

See notebooks/01_data_parallel.ipynb.
"""
from data_parallel.gradients import average_gradients
from data_parallel.partition import DataPartitioner, Partition, partition_dataset
from data_parallel.process_group import cleanup, setup
from data_parallel.training import DataParallelTraining, common_steps, dp_training

__all__ = ["Partition", "DataPartitioner", "partition_dataset", "setup", "cleanup", "average_gradients",
           "DataParallelTraining", "common_steps", "dp_training"]
