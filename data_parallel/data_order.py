"""The data order of a data-parallel run resumed at another number of ranks.

In epoch ``e`` a run at ``dp`` ranks takes, at step ``s``, the **global batch** made of every rank's
``s``-th batch of its shard (:func:`data_parallel.partition_dataset` with seed ``seed + e``: the
epoch's shuffle cut into ``dp`` contiguous shards, each read ``batch_size / dp`` examples at a time),
rank 0's rows first. Which examples form a global batch therefore depends on dp.

**"The same run at the new size"**, as the course defines it: a run checkpointed at ``dp = D`` in the
middle of epoch ``e`` and resumed at ``dp = D'`` continues epoch ``e`` with the *same global batches in
the same order* — those of the run at ``D`` — and only their split over the ranks changes: at each
step the ``batch_size`` examples of the global batch (old rank 0's rows, then old rank 1's, ...) are
cut into ``D'`` equal consecutive blocks, rank ``r`` taking block ``r`` (:func:`regrouped_batches`).
Every example of the epoch is still seen exactly once, and the weights and AdamW state come from the
checkpoint. From epoch ``e + 1`` on the run shuffles and shards as any run at ``D'`` does.

What stays different is the objective's weighting: a data-parallel step averages the ``dp`` ranks'
*per-rank mean* losses (each a mean over that rank's target tokens), so the same global batch split
into 2 instead of 4 parts weights its tokens slightly differently — the gradient of the same batch at
the same weights differs beyond rounding, and the run at ``D'`` is exactly what ``D'`` ranks computing
the mean of their ``D'`` block losses do (tests/data_parallel/test_resume_world_size.py checks it against
one process doing that, and the first resumed step — same weights, same examples — against the
uninterrupted run at ``D``). The checkpoint records the dp whose order the epoch follows
(``data_order``), so a run resized twice in one epoch keeps the order it began with.
"""
from __future__ import annotations

from data_parallel.partition import partition_dataset

DATA_ORDER = "data_order"  # checkpoint key: int64 [dp whose global batches the epoch in progress follows]


def regrouped_batches(dataset, batch_size: int, collate, seed: int, order_dp: int, dp_rank: int, dp_size: int,
                      max_batches: int | None = None):
    """This rank's part of the epoch's global batches of a run at ``order_dp`` ranks, split over ``dp_size``.

    Args:
        dataset, batch_size (global), collate, seed: as the epoch's :func:`data_parallel.partition_dataset`.
        order_dp: the number of ranks whose global batches the epoch follows (the checkpointed run's).
        dp_rank, dp_size: this rank and the ranks the batches are split over now.
        max_batches: stop after this many steps.

    Returns:
        ``(batches, steps)``: an iterator of collated batches (``batch_size / dp_size`` rows each; at the last
        step of a whole epoch the shards' short batches are shared out as evenly) and the
        number of steps, the fewest batches any of the ``order_dp`` shards has (as the run at ``order_dp``
        agreed in its dp group).

    Raises:
        ValueError: ``batch_size`` not divisible by ``order_dp`` or by ``dp_size``.
    """
    if batch_size % order_dp or batch_size % dp_size:
        raise ValueError(f"the global batch of {batch_size} does not split over {order_dp} and over {dp_size} ranks")
    shards = [partition_dataset(r, order_dp, dataset, batch_size, collate_fn=list, seed=seed) for r in range(order_dp)]
    steps = min(len(loader) for loader in shards)
    steps = steps if max_batches is None else min(steps, max_batches)
    def batches():
        for step, parts in zip(range(steps), zip(*shards)):
            examples = [example for part in parts for example in part]  # short only at an epoch's very end
            n = len(examples)
            yield collate(examples[n * dp_rank // dp_size:n * (dp_rank + 1) // dp_size])

    return batches(), steps


def global_batch_indices(n_examples: int, batch_size: int, dp: int, seed: int, steps: int | None = None
                         ) -> list[list[int]]:
    """The positions of the examples in each global batch of an epoch at ``dp`` ranks, rank 0's rows first.

    What :meth:`data_parallel.DataParallelTraining.epoch_batches` feeds the ranks in an epoch whose shuffle
    seed is ``seed`` (the run's ``seed + epoch``): rank ``r``'s ``s``-th batch of
    ``partition_dataset(r, dp, range(n_examples), batch_size, seed=seed)``. Every dp cuts the same
    permutation (same seed, same ``n_examples``), but into ``dp`` contiguous shards read in parallel, so the
    global batches depend on dp: the global batch ``s`` at dp = 1 is positions ``s B .. (s + 1) B`` of the
    shuffle; at dp = 2 it is ``s B/2 .. (s + 1) B/2`` and ``n/2 + s B/2 ..`` of it.

    Args:
        n_examples: the dataset's length ``n``; batch_size: the global batch ``B`` (divisible by ``dp``);
        steps: at most this many global batches (default: the whole epoch, as many as every rank has).

    Returns:
        ``steps`` lists of example positions (``B`` each, fewer only at an epoch's end).

    Raises:
        ValueError: ``batch_size`` not divisible by ``dp`` (from :func:`data_parallel.partition_dataset`).
    """
    loaders = [partition_dataset(r, dp, range(n_examples), batch_size, collate_fn=list, seed=seed) for r in range(dp)]
    n_steps = min(len(loader) for loader in loaders)
    n_steps = n_steps if steps is None else min(n_steps, steps)
    return [[i for part in parts for i in part] for _, parts in zip(range(n_steps), zip(*loaders))]
