"""Assignment 5.1.2 — process group set-up/tear-down and all-reduce gradient averaging (graded).

Real 2- and 3-process gloo runs: after ``average_gradients`` every rank must hold the
gradient that one process computes on the whole global batch (the mean of the ranks'
mean losses), identical on every rank; parameters without a gradient stay without one, and a gradient that is
all zeros on one rank (``gate``: its input feature is 0 in every other rank's shard) is all-reduced like any other
(a rank that skipped it would leave the others' all-reduce of it unmatched: mismatched or hung).
In a world of 4 split into two groups of 2 (the dp groups of a run that also splits the
model), each group averages over its own two ranks only. ``setup`` joins the group at the
address and port it is given, whatever the environment says.
"""
import pytest
import torch
import torch.distributed as dist
from torch import nn

from course.launch import launch
from tests.support.launching import GRADED_COLLECTIVE_TIMEOUT, launch_once

pytestmark = pytest.mark.a5_1_2

PER_RANK = 4
# Gradients of a 6 -> 8 -> 3 MLP over world_size x PER_RANK <= 16 examples: each a float32 sum of <= 16 x 8 = 128 products,
# summed here per rank and then across ranks (another order than one process's): <= 128 x 2^-24 ~ 7.6e-6 of the terms'
# magnitudes in the worst case, sqrt(128) x 2^-24 ~ 7e-7 typically, against rtol 1e-5 plus atol 1e-6 for O(0.1) values
TOL = dict(rtol=1e-5, atol=1e-6)


class Net(nn.Module):
    """A small MLP with a layer that is never used in the forward pass, a frozen parameter, and ``gate`` (registered
    first), whose gradient is exactly zero on every rank but rank 0 (:func:`global_batch`)."""

    def __init__(self):
        super().__init__()
        self.gate = nn.Parameter(torch.full((3,), 0.3))
        self.first, self.second = nn.Linear(6, 8), nn.Linear(8, 3)
        self.unused = nn.Linear(3, 3)  # not in forward: its grads stay None
        self.scale = nn.Parameter(torch.full((3,), 0.5), requires_grad=False)  # frozen: in forward, no grad

    def forward(self, x):
        return self.second(torch.tanh(self.first(x))) * self.scale + x[:, :1] * self.gate


def make_model():
    torch.manual_seed(0)
    return Net()


def global_batch(world_size):
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(world_size * PER_RANK, 6, generator=g), torch.randn(world_size * PER_RANK, 3, generator=g)
    x[PER_RANK:, 0] = 0  # feature 0 only in rank 0's shard: gate's gradient is exactly 0 on the other ranks
    return x, y


def grad_worker(rank, world_size, planted=None):
    """``planted``: with a planted wrong solution (:mod:`tests.support.planting`)."""
    from tests.support.planting import planting

    model = make_model()
    x, y = global_batch(world_size)
    shard = slice(rank * PER_RANK, (rank + 1) * PER_RANK)
    nn.functional.mse_loss(model(x[shard]), y[shard]).backward()
    with planting(planted):
        from data_parallel.gradients import average_gradients

        average_gradients(model)
    return {name: (None if p.grad is None else p.grad.clone()) for name, p in model.named_parameters()}


GROUPS = ([0, 1], [2, 3])  # two data-parallel groups in a world of 4


def group_worker(rank, world_size, planted=None):
    """``planted``: with a planted wrong solution (:mod:`tests.support.planting`)."""
    from tests.support.planting import planting

    groups = [dist.new_group(ranks) for ranks in GROUPS]  # every rank creates every group, in the same order
    mine = groups[rank // 2]
    model = make_model()
    x, y = global_batch(world_size)
    shard = slice(rank * PER_RANK, (rank + 1) * PER_RANK)
    nn.functional.mse_loss(model(x[shard]), y[shard]).backward()
    with planting(planted):
        from data_parallel.gradients import average_gradients

        average_gradients(model, group=mine)
    return {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}


def setup_worker(rank, world_size, bogus_ports):
    import os

    from data_parallel.process_group import cleanup, setup

    # The launcher put the real rendezvous in the environment; setup must use the address and port it is
    # given, so the environment now points each rank somewhere else (a different, unused port per rank).
    addr, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
    os.environ["MASTER_PORT"] = str(bogus_ports[rank])
    setup(rank, world_size, backend="gloo", master_addr=addr, master_port=port, timeout_s=20)
    joined = (dist.is_initialized(), dist.get_rank(), dist.get_world_size())
    t = torch.tensor([float(rank + 1)])
    dist.all_reduce(t)
    cleanup()
    return joined, float(t), dist.is_initialized()


@pytest.mark.parametrize("world_size", [2, 3])
def test_averaged_gradients_equal_single_process_gradients(world_size):
    check_averaged_gradients(launch_once(grad_worker, world_size, timeout=120), world_size)


def check_averaged_gradients(outputs, world_size):

    model = make_model()
    x, y = global_batch(world_size)
    shard_losses = [nn.functional.mse_loss(model(x[r * PER_RANK:(r + 1) * PER_RANK]), y[r * PER_RANK:(r + 1) * PER_RANK])
                    for r in range(world_size)]
    (sum(shard_losses) / world_size).backward()  # equal shards: also the mean loss over the whole batch
    assert {n for n, p in model.named_parameters() if p.grad is None} == {"unused.weight", "unused.bias", "scale"}
    for name, p in model.named_parameters():
        for rank in range(world_size):
            got = outputs[rank][name]
            if p.grad is None:
                assert got is None, (f"{name} has no gradient (unused or frozen) and must be skipped on rank {rank}, "
                                     "not turned into zeros")
                continue
            assert torch.allclose(got, p.grad, **TOL), (
                f"rank {rank} {name}: averaged gradient differs from single-process gradient "
                f"(ratio {float((got / p.grad).median()):.3f}; did you divide by the world size?)")
        if p.grad is not None:
            for rank in range(1, world_size):
                assert torch.equal(outputs[rank][name], outputs[0][name]), f"{name} differs between ranks"


def test_each_group_averages_over_its_own_ranks_only():
    """Two groups of 2 in a world of 4: ranks 0-1 hold the average of shards 0-1, ranks 2-3 of shards 2-3
    (an all-reduce over the world, or a division by the world's size, gives something else)."""
    check_group_averages(launch_once(group_worker, 4, timeout=120))


def check_group_averages(outputs):
    x, y = global_batch(4)
    for ranks in GROUPS:
        model = make_model()
        losses = [nn.functional.mse_loss(model(x[r * PER_RANK:(r + 1) * PER_RANK]), y[r * PER_RANK:(r + 1) * PER_RANK])
                  for r in ranks]
        (sum(losses) / len(ranks)).backward()
        for name, p in model.named_parameters():
            if p.grad is None:
                continue
            for rank in ranks:
                got = outputs[rank][name]
                assert torch.allclose(got, p.grad, **TOL), (
                    f"rank {rank} {name}: not the average over its group {ranks} (ratio "
                    f"{float((got / p.grad).median()):.3f}; all-reduce in the group you are given, divide by its size)")
    assert not torch.allclose(outputs[0]["first.weight"], outputs[2]["first.weight"]), \
        "the two groups hold the same gradient: they must not average across each other"


def test_setup_joins_the_group_at_the_given_address_and_cleanup_leaves_it():
    from course.launch import free_port

    outputs = launch(setup_worker, 2, [free_port(), free_port()], timeout=90,
                     collective_timeout=GRADED_COLLECTIVE_TIMEOUT, init_process_group=False)
    for rank, (joined, total, still_initialized) in outputs.items():
        assert joined == (True, rank, 2)
        assert total == 3.0, "the group must connect both ranks (all_reduce of 1 and 2)"
        assert still_initialized is False, "cleanup must destroy the process group"
