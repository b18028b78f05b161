"""Assignment 5.1.3 — the data-parallel epoch: shards, shuffles and the number of steps (graded).

On 2 real gloo ranks, :meth:`data_parallel.DataParallelTraining.epoch_batches` must give every
rank its own shard of the epoch — disjoint, together the whole training set — in a new order
every epoch (the seed changes with the epoch), the same orders again in a second run, and a
number of steps that every rank can take: when the shards differ by a batch, the rank with one
more batch must not step alone (its all-reduce would wait forever for the other rank).

In a (dp 2, tp 2) mesh of 4 ranks, whose dp groups [0, 2] and [1, 3] are not the world, the epoch is shared
out over the dp group by the rank in it (the shards of a group's two ranks are disjoint and cover the data), and
a training step averages the gradients over the dp group only: each rank's weights after one SGD step of a small
float64 model equal one process's step on the mean gradient of its group's two batches (float64 sums of a few
terms: ~1e-16 relative, against 1e-12; averaging over the world moves the weights by lr x the gradient's
spread, ~1e-2).
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


VOCAB, LR = 7, 0.5


class TinyLM(torch.nn.Module):
    """Logits (batch, seq, VOCAB) from an embedding: a model :func:`course.loss.model_loss` can train, in float64."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.emb = torch.nn.Embedding(VOCAB, VOCAB).double()

    def forward(self, input_ids, attention_mask):
        return self.emb(input_ids)


def lm_batch(rank):
    ids = torch.randint(0, VOCAB, (2, 5), generator=torch.Generator().manual_seed(50 + rank))
    labels = ids.clone()
    labels[:, :2] = -100  # the source part: not scored
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": labels}


def groups_worker(rank, world_size, planted=None):
    """A (dp 2, tp 2) mesh: this rank's shard of epoch 0 and its weights after one step on its own batch.
    ``planted``: with a planted wrong solution (:mod:`tests.support.planting`)."""
    import torch.distributed as dist

    from course.mesh import Mesh
    from data_parallel import DataParallelTraining
    from project.run_data_parallel import DataParallelConfig
    from tests.support.planting import planting

    mesh = Mesh.build(dp=2, tp=2)
    config = DataParallelConfig.for_test(dp=2, batch_size=BATCH, seed=11, quiet=True, device="cpu")
    data = SimpleNamespace(train=[{"id": i} for i in range(N_EXAMPLES)], collate=lambda xs: [x["id"] for x in xs])
    model = TinyLM()
    mode = DataParallelTraining(config, data, "cpu", model, torch.optim.SGD(model.parameters(), lr=LR),
                                mesh.dp_group, rank=rank, show_progress=False)
    with planting(planted):
        loader, steps = mode.epoch_batches(0)
        mode.train_step(lm_batch(rank))
    return {"dp_group": dist.get_process_group_ranks(mesh.dp_group), "shard": [i for b in loader for i in b],
            "steps": steps, "weight": model.emb.weight.detach().clone()}


def check_groups(out):
    from course.loss import model_loss

    for rank, r in out.items():
        assert r["dp_group"] == [rank % 2, rank % 2 + 2], f"the mesh's dp group of rank {rank}: {r['dp_group']}"
        a, b = (out[q]["shard"] for q in r["dp_group"])
        assert sorted(a + b) == list(range(N_EXAMPLES)), (
            f"dp group {r['dp_group']}: shards {a} and {b} are not disjoint or miss data: share the epoch out over "
            "the dp group, by the rank in it (self.dp_rank, self.dp_size), not the world's rank and size")
        assert r["steps"] == 2, f"rank {rank}: {r['steps']} steps; the dp group's ranks have 3 and 2 batches"
        grads = []
        for q in r["dp_group"]:
            model = TinyLM()
            model_loss(model, lm_batch(q)).backward()
            grads.append(model.emb.weight.grad)
        want = TinyLM().emb.weight.detach() - LR * (grads[0] + grads[1]) / 2
        err = float((r["weight"] - want).abs().max())
        assert err <= 1e-12, (f"rank {rank}: weights after one step differ by {err:.2e} from the step on the mean "
                              f"gradient of its dp group {r['dp_group']}: average over the dp group, not the world")


@pytest.mark.timeout(150)
def test_dp_groups_that_are_not_the_world_share_the_epoch_and_average_within_the_group():
    from course.launch import launch
    from tests.support.launching import GRADED_COLLECTIVE_TIMEOUT

    check_groups(launch(groups_worker, 4, timeout=90, collective_timeout=GRADED_COLLECTIVE_TIMEOUT))
