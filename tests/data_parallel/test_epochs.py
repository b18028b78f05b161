"""Assignment 5.1.3 — the data-parallel epoch: shards, shuffles and the number of steps (graded).

On 2 real gloo ranks, :meth:`data_parallel.DataParallelTraining.epoch_batches` must give every
rank its own shard of the epoch — disjoint, together the whole training set — in a new order
every epoch (the seed changes with the epoch), the same orders again in a second run, and a
number of steps that every rank can take: when the shards differ by a batch, the rank with one
more batch must not step alone (its all-reduce would wait forever for the other rank).
"""
from types import SimpleNamespace

import pytest
import torch

pytestmark = pytest.mark.a5_1_3

N_EXAMPLES, BATCH = 9, 4  # 2 ranks: shards of 5 and 4 examples, 2 per rank and step -> 3 and 2 batches


def epochs_worker(rank, world_size, n_epochs, max_batches):
    from course.mesh import Mesh
    from data_parallel import DataParallelTraining

    mesh = Mesh.build(dp=world_size)
    from project.run_data_parallel import DataParallelConfig

    args = DataParallelConfig.for_test(dp=world_size, batch_size=BATCH, seed=11, max_batches=max_batches, quiet=True,
                                       device="cpu")
    data = SimpleNamespace(train=[{"id": i} for i in range(N_EXAMPLES)], collate=lambda xs: [x["id"] for x in xs])
    model = torch.nn.Linear(2, 2)
    mode = DataParallelTraining(args, data, "cpu", model, torch.optim.SGD(model.parameters(), lr=0.1), mesh.dp_group,
                                rank=rank, show_progress=False)
    out = []
    for epoch in range(n_epochs):
        loader, steps = mode.epoch_batches(epoch)
        out.append({"batches": [list(b) for b in loader], "steps": steps})
    return out


@pytest.fixture(scope="module")
def two_runs():
    from course.launch import launch
    from tests.support.launching import GRADED_COLLECTIVE_TIMEOUT

    return [launch(epochs_worker, 2, 3, None, timeout=90, collective_timeout=GRADED_COLLECTIVE_TIMEOUT) for _ in range(2)]


@pytest.mark.timeout(150)
def test_every_epoch_gives_disjoint_shards_that_cover_the_data(two_runs):
    for epoch in range(3):
        shards = [[i for b in two_runs[0][rank][epoch]["batches"] for i in b] for rank in range(2)]
        assert sorted(shards[0] + shards[1]) == list(range(N_EXAMPLES)), f"epoch {epoch}: shards overlap or miss data"
        assert all(len(b) <= BATCH // 2 for rank in range(2) for b in two_runs[0][rank][epoch]["batches"])


@pytest.mark.timeout(150)
def test_every_epoch_has_a_new_shuffle_and_runs_repeat_it(two_runs):
    orders = [tuple(i for rank in range(2) for b in two_runs[0][rank][epoch]["batches"] for i in b)
              for epoch in range(3)]
    assert len(set(orders)) == 3, "the epochs share a shuffle: seed each epoch differently (e.g. seed + epoch)"
    assert two_runs[0] == two_runs[1], "a second run saw other batches: the shuffle must be seeded"


@pytest.mark.timeout(150)
def test_ranks_agree_on_the_number_of_steps(two_runs):
    for epoch in range(3):
        lengths = [len(two_runs[0][rank][epoch]["batches"]) for rank in range(2)]
        steps = [two_runs[0][rank][epoch]["steps"] for rank in range(2)]
        assert sorted(lengths) == [2, 3], "the test expects shards that differ by a batch"
        assert steps == [2, 2], (f"epoch {epoch}: ranks would take {steps} steps for {lengths} batches; every rank "
                                 "must take the steps every rank can take (the fewest)")


@pytest.mark.timeout(150)
def test_max_batches_caps_the_steps():
    from course.launch import launch
    from tests.support.launching import GRADED_COLLECTIVE_TIMEOUT

    out = launch(epochs_worker, 2, 1, 1, timeout=90, collective_timeout=GRADED_COLLECTIVE_TIMEOUT)
    assert [out[rank][0]["steps"] for rank in range(2)] == [1, 1]
