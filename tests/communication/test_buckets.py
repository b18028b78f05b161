"""Assignment 5.4.2 — bucketed gradient averaging overlapped with the backward pass (graded).

* the buckets: reverse registration order, capacity respected;
* real gloo runs: after k optimizer steps the weights equal those of ``average_gradients``
  and of torch's ``DistributedDataParallel`` (same buckets), with overlap on and off, with a
  layer no rank uses (its grad stays None) and, against DDP with
  ``find_unused_parameters=True``, a layer that only rank 0 uses;
* overlap: with ``dist.all_reduce`` and the returned work handles watched, the first
  bucket's all-reduce must start before the backward pass has produced its last gradient,
  no handle may be waited on before the backward pass ends, and every handle must be
  waited on before ``finish()`` returns;
* order: the ranks' all-reduces are matched by the order they are issued in, so every rank
  launches the buckets in bucket order — also with a model whose gradients arrive in another
  order than the buckets' (a later bucket fills first) and a layer only rank 0 uses (its
  bucket never fills on rank 1); the gradients are then the average with the missing ones
  as zeros.
"""
import pytest
import torch
import torch.distributed as dist
from torch import nn

from tests.support.launching import launch_once

pytestmark = pytest.mark.a5_4_2

PER_RANK, STEPS = 4, 3
# Weights after STEPS = 3 SGD steps (momentum 0.9, lr 0.1): SGD is linear in the gradient, so gradient rounding
# differences d1, d2, d3 move a weight by lr x (2.71 d1 + 1.9 d2 + d3) <= 0.56 max|d| (plus their small effect on the
# later gradients), never amplified as by Adam's normalisation. The gradients are float32 sums of <= 4 ranks x PER_RANK
# x 8 = 128 products in another order (per-rank partial sums, then the all-reduce; buckets flatten without changing
# the values): <= 128 x 2^-24 ~ 7.6e-6 of the sum of the terms' magnitudes in the worst case, sqrt(128) x 2^-24 ~ 7e-7
# typically, so the weights differ by well under 1e-6 + 1e-5 |w| for these O(0.1 .. 1) values
TOL = dict(rtol=1e-5, atol=1e-6)


class Net(nn.Module):
    """Five linear layers; ``unused`` is never used; ``rank0_only`` only when asked to; ``scale`` is frozen."""

    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList([nn.Linear(6, 8), nn.Linear(8, 8), nn.Linear(8, 8), nn.Linear(8, 8),
                                     nn.Linear(8, 3)])
        self.unused = nn.Linear(3, 3)
        self.rank0_only = nn.Linear(3, 3)
        self.scale = nn.Parameter(torch.full((3,), 0.5), requires_grad=False)

    def forward(self, x, use_rank0_only=False):
        for layer in self.layers[:-1]:
            x = torch.tanh(layer(x))
        x = self.layers[-1](x) * self.scale
        return self.rank0_only(x) if use_rank0_only else x


def make_model():
    torch.manual_seed(0)
    return Net()


def batches(world_size, rank):
    g = torch.Generator().manual_seed(1)
    for _ in range(STEPS):
        x, y = torch.randn(world_size * PER_RANK, 6, generator=g), torch.randn(world_size * PER_RANK, 3, generator=g)
        yield x[rank * PER_RANK:(rank + 1) * PER_RANK], y[rank * PER_RANK:(rank + 1) * PER_RANK]


def average_gradients(model, group=None):
    """The reference (assignment 5.1.2's average_gradients, written out here so this key depends on no other)."""
    for p in model.parameters():
        if p.grad is not None:
            dist.all_reduce(p.grad, group=group)
            p.grad /= dist.get_world_size(group)


def train(variant, rank, world_size, partly_used):
    from communication.buckets import BucketedReducer

    model = make_model()
    bucket_mb = 300 / 2**20  # about 300 bytes: several buckets of one or more parameters
    reducer, forward = None, model
    if variant == "ddp":
        forward = nn.parallel.DistributedDataParallel(model, bucket_cap_mb=bucket_mb, find_unused_parameters=True)
    elif variant != "average_gradients":
        reducer = BucketedReducer(model, group=None, bucket_mb=bucket_mb, overlap=variant == "overlap")
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    grads_none = None
    for x, y in batches(world_size, rank):
        opt.zero_grad(set_to_none=True)
        if reducer is not None:
            reducer.before_backward()
        nn.functional.mse_loss(forward(x, use_rank0_only=partly_used and rank == 0), y).backward()
        if reducer is not None:
            reducer.finish()
        elif variant == "average_gradients":
            average_gradients(model, group=None)
        grads_none = sorted(n for n, p in model.named_parameters() if p.grad is None)
        opt.step()
    return {"weights": {n: p.detach().clone() for n, p in model.named_parameters()}, "grads_none": grads_none}


def equality_worker(rank, world_size, planted=None):
    """``planted``: with a planted wrong solution (:mod:`tests.support.planting`)."""
    from tests.support.planting import planting

    out = {}
    with planting(planted):
        for variant in ("overlap", "no_overlap", "average_gradients", "ddp"):
            out[variant] = train(variant, rank, world_size, partly_used=False)
        for variant in ("overlap", "ddp"):
            out["partly_" + variant] = train(variant, rank, world_size, partly_used=True)
    return out


@pytest.mark.parametrize("world_size", [2, 3])
def test_bucketed_equals_average_gradients_and_ddp_step_for_step(world_size):
    check_equal_to_average_gradients_and_ddp(launch_once(equality_worker, world_size, timeout=150))


def check_equal_to_average_gradients_and_ddp(outputs):
    for rank, out in outputs.items():
        assert "unused.weight" in out["average_gradients"]["grads_none"]
        for variant in ("overlap", "no_overlap"):
            assert out[variant]["grads_none"] == out["average_gradients"]["grads_none"], (
                f"rank {rank}, {variant}: parameters without gradient {out[variant]['grads_none']} (a parameter no rank "
                f"uses must keep grad None, as with average_gradients: {out['average_gradients']['grads_none']})")
            for reference in ("average_gradients", "ddp"):
                for name, w in out[reference]["weights"].items():
                    got = out[variant]["weights"][name]
                    assert torch.allclose(got, w, **TOL), (
                        f"rank {rank}, {variant}: {name} after {STEPS} steps differs from {reference} "
                        f"(max diff {float((got - w).abs().max()):.2e})")
        for name, w in out["partly_ddp"]["weights"].items():
            got = out["partly_overlap"]["weights"][name]
            assert torch.allclose(got, w, **TOL), (
                f"rank {rank}: with a layer only rank 0 uses, {name} differs from DDP(find_unused_parameters=True) "
                f"(max diff {float((got - w).abs().max()):.2e}); the missing gradients count as zeros")
        for variant in ("overlap", "partly_overlap"):
            for name, w in out[variant]["weights"].items():
                assert torch.equal(w, outputs[0][variant]["weights"][name]), f"{variant}: ranks differ in {name}"


class WorkSpy:
    """Wraps the work handle of an asynchronous all-reduce and logs when it is waited on."""

    def __init__(self, work, log, index):
        self._work, self._log, self._index = work, log, index

    def wait(self, *args, **kwargs):
        self._log.append(("wait", self._index))
        return self._work.wait(*args, **kwargs)

    def get_future(self):
        self._log.append(("wait", self._index))
        return self._work.get_future()

    def __getattr__(self, name):
        return getattr(self._work, name)


def overlap_worker(rank, world_size, planted=None):
    """The overlap runs (with and without) and the bucket-order run, in one launch. ``planted``: with a planted
    wrong solution (:mod:`tests.support.planting`)."""
    from tests.support.planting import planting

    with planting(planted):
        out = {overlap: _overlap_run(rank, world_size, overlap) for overlap in (True, False)}
        out["order"] = _order_run(rank, world_size)
    return out


_OVERLAP = {}


def overlap_runs():
    """One launch for the overlap tests and the bucket-order test."""
    if not _OVERLAP:
        _OVERLAP.update(launch_once(overlap_worker, 2, timeout=90))
    return _OVERLAP


def _overlap_run(rank, world_size, overlap):
    from communication.buckets import BucketedReducer

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 8), nn.Tanh(),
                          nn.Linear(8, 3))  # every parameter used
    reducer = BucketedReducer(model, group=None, bucket_mb=1e-6, overlap=overlap)  # one parameter per bucket
    log = []
    for name, p in model.named_parameters():   # registered after the reducer's hooks: they run after them
        if p.requires_grad:
            p.register_post_accumulate_grad_hook(lambda _p, name=name: log.append(("grad", name)))
    real = dist.all_reduce

    def spy(tensor, *args, **kwargs):
        work = real(tensor, *args, **kwargs)
        log.append(("launch", len([e for e in log if e[0] == "launch"])))
        return WorkSpy(work, log, log[-1][1]) if work is not None else None

    dist.all_reduce = spy
    try:
        x, y = next(batches(world_size, rank))
        reducer.before_backward()
        nn.functional.mse_loss(model(x), y).backward()
        log.append(("backward_done", None))
        reducer.finish()
        log.append(("finish_returned", None))
    finally:
        dist.all_reduce = real
    return {"log": log, "n_buckets": len(reducer.buckets)}


class Reversed(nn.Module):
    """Layers used in the opposite order to their registration, so the backward pass produces the
    gradients of the last buckets first; ``rank0_only`` (registered last: the first buckets) is used
    on rank 0 only."""

    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList([nn.Linear(8, 3), nn.Linear(8, 8), nn.Linear(8, 8), nn.Linear(6, 8)])
        self.rank0_only = nn.Linear(8, 8)

    def forward(self, x, use_rank0_only):
        h = torch.tanh(self.layers[3](x))
        if use_rank0_only:
            h = torch.tanh(self.rank0_only(h))
        return self.layers[0](torch.tanh(self.layers[1](torch.tanh(self.layers[2](h)))))


def _order_run(rank, world_size):
    from communication.buckets import BucketedReducer

    torch.manual_seed(0)
    model = Reversed()
    reducer = BucketedReducer(model, group=None, bucket_mb=1e-6, overlap=True)  # one parameter per bucket
    launched, real = [], dist.all_reduce

    def spy(tensor, *args, **kwargs):
        launched.append(next((b for b, buffer in enumerate(reducer.buffers) if buffer is tensor), -1))
        return real(tensor, *args, **kwargs)

    dist.all_reduce = spy
    try:
        x, y = next(batches(world_size, rank))
        reducer.before_backward()
        nn.functional.mse_loss(model(x, rank == 0), y).backward()
        reducer.finish()
    finally:
        dist.all_reduce = real
    return {"launched": launched, "n_buckets": len(reducer.buckets),
            "grads": {n: None if p.grad is None else p.grad.clone() for n, p in model.named_parameters()}}


def test_buckets_start_in_bucket_order_on_every_rank_whatever_order_they_fill_in():
    check_bucket_order(overlap_runs())


def check_bucket_order(runs):
    outputs = {rank: out["order"] for rank, out in runs.items()}
    for rank, out in outputs.items():
        assert out["launched"] == list(range(out["n_buckets"])), (
            f"rank {rank} started the buckets' all-reduces in the order {out['launched']}: ranks match all-reduces by "
            "the order they are issued in, and rank 1 never fills the buckets of the layer only rank 0 uses — start "
            "bucket b only after buckets 0..b-1 (DDP's rule), whichever bucket fills first")
    torch.manual_seed(0)
    model = Reversed()
    for rank in range(2):  # the average over the ranks, a missing gradient counting as zeros
        x, y = next(batches(2, rank))
        (nn.functional.mse_loss(model(x, rank == 0), y) / 2).backward()
    for name, p in model.named_parameters():
        for rank, out in outputs.items():
            torch.testing.assert_close(out["grads"][name], p.grad, **TOL,
                                       msg=f"rank {rank}: {name} is not the average over the ranks")


def _positions(log, kind):
    return [i for i, e in enumerate(log) if e[0] == kind]


def test_first_bucket_starts_before_the_backward_pass_ends_and_all_are_waited_on():
    for rank, out in overlap_runs().items():
        out = out[True]
        log = out["log"]
        launches, grads, waits = _positions(log, "launch"), _positions(log, "grad"), _positions(log, "wait")
        done, returned = _positions(log, "backward_done")[0], _positions(log, "finish_returned")[0]
        assert len(launches) == out["n_buckets"], f"rank {rank}: one all-reduce per bucket, got {len(launches)}"
        assert launches and launches[0] < grads[-1], (
            f"rank {rank}: the first bucket's all-reduce must start before the last gradient of the backward pass is "
            f"ready (overlap); events: {log}")
        assert all(i < grads[-1] for i in launches[:-1]), (
            f"rank {rank}: with one parameter per bucket every bucket but the last must start during the backward pass")
        assert not [i for i in waits if i < done], (
            f"rank {rank}: a bucket was waited on during the backward pass, which stalls it (no overlap); wait in "
            f"finish(); events: {log}")
        waited = {log[i][1] for i in waits if i < returned}
        assert waited >= {log[i][1] for i in launches}, (
            f"rank {rank}: finish() returned before waiting on every bucket's all-reduce (waited on {sorted(waited)} of "
            f"{len(launches)})")


def test_without_overlap_the_buckets_start_after_the_backward_pass():
    for rank, out in overlap_runs().items():
        out = out[False]
        log = out["log"]
        done = _positions(log, "backward_done")[0]
        assert _positions(log, "launch") and min(_positions(log, "launch")) > done, \
            "overlap=False: every bucket starts in finish()"


def test_buckets_follow_reverse_registration_order_and_capacity():
    from communication.buckets import bucket_parameters

    assert bucket_parameters([4, 4, 4, 4, 100, 4], 8) == [[5], [4], [3, 2], [1, 0]]
    assert bucket_parameters([1, 2, 3], 1000) == [[2, 1, 0]]
    assert bucket_parameters([5, 5, 5], 1) == [[2], [1], [0]]
