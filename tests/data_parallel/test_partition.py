"""Assignment 5.1.1 — DataPartitioner and partition_dataset (graded).

Shards must be disjoint, cover the dataset exactly, be balanced, be shuffled by a seeded
RNG that every rank reproduces, and be loaded with the per-rank batch size.
"""
import random

import pytest
import torch

from data_parallel.partition import DataPartitioner, Partition, partition_dataset

pytestmark = pytest.mark.a5_1_1

# Unique values, a length no world size below divides evenly.
DATA = [f"sentence {i}" for i in range(103)]


def shard_values(partitioner, n):
    return [[partitioner.use(r)[i] for i in range(len(partitioner.use(r)))] for r in range(n)]


def test_partition_is_a_view_by_index():
    part = Partition(["a", "b", "c", "d"], [3, 0])
    assert len(part) == 2
    assert [part[0], part[1]] == ["d", "a"]


@pytest.mark.parametrize("world_size", [1, 2, 3, 4, 5])
def test_equal_shards_are_disjoint_cover_everything_and_are_balanced(world_size):
    shards = shard_values(DataPartitioner(DATA, [1 / world_size] * world_size, seed=3), world_size)
    flat = [x for shard in shards for x in shard]
    assert len(flat) == len(DATA), "every element must land in exactly one shard"
    assert sorted(flat) == sorted(DATA), "shards must be disjoint and cover the dataset"
    sizes = [len(s) for s in shards]
    assert max(sizes) - min(sizes) <= 1, f"equal fractions must give balanced shards, got {sizes}"


def test_unequal_fractions_give_the_asked_sizes():
    shards = shard_values(DataPartitioner(DATA, [0.7, 0.2, 0.1], seed=3), 3)
    sizes = [len(s) for s in shards]
    assert sum(sizes) == len(DATA)
    for size, fraction in zip(sizes, [0.7, 0.2, 0.1]):
        assert abs(size - fraction * len(DATA)) <= 1, sizes
    assert sorted(x for s in shards for x in s) == sorted(DATA)


def test_shards_are_shuffled():
    first = shard_values(DataPartitioner(DATA, [0.5, 0.5], seed=3), 2)[0]
    positions = [DATA.index(x) for x in first]
    assert positions != sorted(positions), "shard 0 keeps the dataset's order: shuffle before cutting"
    assert set(positions) != set(range(len(first))), "shard 0 is the first half of the data: shuffle first"


def test_permutation_is_seeded_and_independent_of_global_random_state():
    random.seed(0)
    torch.manual_seed(0)
    a = shard_values(DataPartitioner(DATA, [0.5, 0.5], seed=7), 2)
    random.seed(12345)
    torch.manual_seed(999)
    random.random()
    b = shard_values(DataPartitioner(DATA, [0.5, 0.5], seed=7), 2)
    assert a == b, "the same seed must give the same shards in every process (use a seeded RNG of your own)"
    c = shard_values(DataPartitioner(DATA, [0.5, 0.5], seed=8), 2)
    assert a != c, "a different seed must give a different permutation"


def list_collate(examples):
    return list(examples)


@pytest.mark.parametrize("world_size,batch_size", [(1, 8), (2, 8), (4, 16), (3, 12)])
def test_partition_dataset_gives_each_rank_its_shard_with_the_per_rank_batch(world_size, batch_size):
    seen = []
    for rank in range(world_size):
        loader = partition_dataset(rank, world_size, DATA, batch_size=batch_size, collate_fn=list_collate)
        batches = list(loader)
        assert all(len(b) <= batch_size // world_size for b in batches)
        assert len(batches[0]) == batch_size // world_size, "per-rank batch size is batch_size // world_size"
        seen.append([x for b in batches for x in b])
    flat = [x for shard in seen for x in shard]
    assert sorted(flat) == sorted(DATA), "ranks' loaders must be disjoint and cover the dataset"
    if world_size > 1:
        assert seen[0] != DATA[: len(seen[0])], "rank 0 must get a shuffled shard"


def test_partition_dataset_uses_the_collate_fn():
    loader = partition_dataset(0, 2, list(range(40)), batch_size=8, collate_fn=lambda xs: torch.tensor(xs) * 10)
    batch = next(iter(loader))
    assert torch.is_tensor(batch) and batch.shape == (4,)
    assert all(int(v) % 10 == 0 for v in batch)


@pytest.mark.parametrize("world_size", [2, 3])
def test_partition_dataset_serves_the_partitioners_shard_for_its_seed_in_its_order(world_size):
    """The loader's seed is the ``seed`` argument, and it serves the shard as the partitioner ordered it:
    no second shuffle (a DataLoader with ``shuffle=True`` would reorder it, differently on every pass)."""
    for seed in (5, 6):
        partitioner = DataPartitioner(DATA, [1 / world_size] * world_size, seed=seed)
        for rank in range(world_size):
            loader = partition_dataset(rank, world_size, DATA, batch_size=2 * world_size, collate_fn=list_collate,
                                       seed=seed)
            passes = [[x for b in loader for x in b] for _ in range(2)]
            want = [partitioner.use(rank)[i] for i in range(len(partitioner.use(rank)))]
            assert passes[0] == want, f"seed {seed}, rank {rank}: not DataPartitioner(seed={seed})'s shard in its order"
            assert passes[1] == passes[0], "the loader reshuffles: serve the shard in the partitioner's order"
    a = [x for b in partition_dataset(0, 2, DATA, 4, list_collate, seed=5) for x in b]
    b = [x for b in partition_dataset(0, 2, DATA, 4, list_collate, seed=6) for x in b]
    assert a != b, "partition_dataset ignores its seed argument"


SPLIT_SCRIPT = """
import json, sys
from data_parallel.partition import DataPartitioner
data = [f"sentence {i}" for i in range(103)]
p = DataPartitioner(data, [0.5, 0.5], seed=int(sys.argv[1]))
print(json.dumps([[p.use(r)[i] for i in range(len(p.use(r)))] for r in range(2)]))
"""


def test_the_same_seed_gives_the_same_split_in_every_process():
    """Processes with different hash seeds and fresh random states must cut the same shards (every rank
    computes the partition on its own, without communicating)."""
    import json
    import os
    import subprocess
    import sys

    outs = []
    for hash_seed in ("1", "2"):
        env = dict(os.environ, PYTHONHASHSEED=hash_seed)
        done = subprocess.run([sys.executable, "-c", SPLIT_SCRIPT, "9"], capture_output=True, text=True, env=env,
                              timeout=60)
        assert done.returncode == 0, done.stderr[-2000:]
        outs.append(json.loads(done.stdout))
    assert outs[0] == outs[1], "two processes with the same seed cut different shards"
    assert outs[0] == shard_values(DataPartitioner(DATA, [0.5, 0.5], seed=9), 2)
