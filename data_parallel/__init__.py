"""Assignment 5.1: data parallelism — partitioning, gradient averaging, training across processes."""
from data_parallel.comm import average_gradients, cleanup, setup
from data_parallel.partition import DataPartitioner, Partition, partition_dataset

__all__ = ["Partition", "DataPartitioner", "partition_dataset", "setup", "cleanup", "average_gradients"]
