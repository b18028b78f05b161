"""Assignment 5.1.1 — split a dataset into disjoint, shuffled, per-rank shards.

Data parallelism gives every rank a different slice of the data (Li et al. 2020,
"PyTorch Distributed: Experiences on Accelerating Data Parallel Training", Sec. 2).
Every rank builds the same :class:`DataPartitioner` from the same seed, so they all
compute the same permutation without communicating, and rank r takes partition r.
"""
from __future__ import annotations

import math
import random
from typing import Sequence

from torch.utils.data import DataLoader


class Partition:
    """A view of ``data`` restricted to ``index`` (a list of positions into ``data``).

    ``partition[i]`` is ``data[index[i]]``; ``len(partition)`` is ``len(index)``.
    """

    def __init__(self, data, index: Sequence[int]):
        self.data = data
        self.index = list(index)

    def __len__(self) -> int:
        # BEGIN ASSIGN5_1_1
        return len(self.index)
        # END ASSIGN5_1_1

    def __getitem__(self, i: int):
        # BEGIN ASSIGN5_1_1
        return self.data[self.index[i]]
        # END ASSIGN5_1_1


class DataPartitioner:
    """Shuffle the positions of ``data`` with a seeded RNG and cut them into consecutive parts.

    Args:
        data: any sequence with ``len`` and ``[]`` (e.g. a list of examples).
        sizes: fractions of the data per partition, summing to 1 (e.g. ``[0.5, 0.5]``).
        seed: seed of the shuffle; the same seed gives the same partitions in every
            process, whatever the global random state.

    After construction, ``self.partitions`` is a list of index lists: pairwise disjoint,
    together holding every position ``0 .. len(data)-1`` exactly once, partition k
    holding ``round(cumsum(sizes)[k] * n) - round(cumsum(sizes)[k-1] * n)`` positions
    (so equal sizes give parts that differ by at most one element).

    Raises:
        ValueError: a negative size, or sizes that do not sum to 1.
    """

    def __init__(self, data, sizes: Sequence[float] = (0.7, 0.2, 0.1), seed: int = 1234):
        if any(s < 0 for s in sizes) or not math.isclose(sum(sizes), 1.0, rel_tol=1e-6):
            raise ValueError(f"sizes must be non-negative fractions summing to 1, got {list(sizes)}")
        self.data = data
        self.sizes = list(sizes)
        self.seed = seed
        self.partitions: list[list[int]] = []
        # BEGIN ASSIGN5_1_1
        rng = random.Random(seed)
        order = list(range(len(data)))
        rng.shuffle(order)
        bounds, acc = [0], 0.0
        for size in sizes:
            acc += size
            bounds.append(round(acc * len(data)))
        bounds[-1] = len(data)
        self.partitions = [order[lo:hi] for lo, hi in zip(bounds[:-1], bounds[1:])]
        # END ASSIGN5_1_1

    def use(self, partition: int) -> Partition:
        """The :class:`Partition` number ``partition`` (0-based)."""
        return Partition(self.data, self.partitions[partition])


def partition_dataset(rank: int, world_size: int, dataset, batch_size: int = 128, collate_fn=None,
                      seed: int = 1234) -> DataLoader:
    """A DataLoader over rank ``rank``'s shard of ``dataset``.

    Args:
        rank: this process's rank, 0 <= rank < world_size.
        world_size: number of data-parallel ranks.
        batch_size: the GLOBAL batch size; each rank loads ``batch_size // world_size``
            examples per step, so one step of all ranks together sees ``batch_size``.
        collate_fn: turns a list of examples into a batch (see course.collate).

    Returns:
        ``DataLoader`` over ``DataPartitioner(dataset, [1/world_size] * world_size, seed).use(rank)``
        with the per-rank batch size (the shard itself is already shuffled).

    Raises:
        ValueError: ``batch_size`` not divisible by ``world_size``, or a rank out of range.
    """
    if batch_size % world_size:
        raise ValueError(f"batch_size {batch_size} is not divisible by world_size {world_size}")
    if not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} is outside 0..{world_size - 1}")
    # BEGIN ASSIGN5_1_1
    per_rank_batch_size = batch_size // world_size
    partitioner = DataPartitioner(dataset, [1.0 / world_size] * world_size, seed)
    return DataLoader(partitioner.use(rank), batch_size=per_rank_batch_size, collate_fn=collate_fn)
    # END ASSIGN5_1_1
