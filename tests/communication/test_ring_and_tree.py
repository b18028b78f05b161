"""Assignment 5.4.1 — ring all-reduce and recursive doubling from send/recv (graded).

One launch of 4 real gloo ranks runs both algorithms on groups of 2, 3 and 4 ranks: ranks {0, 1},
ranks {0, 1, 2}, the whole world (``group=None``), and ranks {1, 2, 3}, whose group ranks are not
their global ranks. While the student's all-reduce runs, the collectives of ``torch.distributed``
are switched off (it must be built from point-to-point messages); the result is compared with
``dist.all_reduce``: bit for bit on integers (any order of addition gives the same sum), within
rounding on floats (float32, and float64 within float64's rounding: messages of the right size in another dtype,
e.g. cast to float32 on the way, lose its digits), for sizes that the group size does not divide (unequal chunks), sizes
smaller than the group, several shapes, SUM and AVG. One launch, so a deadlocked solution costs
one collective timeout, not one per group size.
"""
import pytest
import torch
import torch.distributed as dist

from tests.support.launching import launch_once

pytestmark = pytest.mark.a5_4_1

SHAPES = [(1,), (2,), (7,), (13,), (3, 5), (4, 6, 5), (1001,)]
BLOCKED = ("all_reduce", "reduce_scatter", "all_gather", "broadcast", "reduce", "all_to_all", "all_to_all_single",
           "reduce_scatter_tensor", "all_gather_into_tensor")


def _no_collectives(fn, *args, **kwargs):
    """Run fn with the collectives of torch.distributed replaced by a function that raises."""
    saved = {name: getattr(dist, name) for name in BLOCKED}

    def refuse(*a, **k):
        raise AssertionError("all-reduce must be built from send/recv (isend/irecv) only, not collectives")

    for name in BLOCKED:
        setattr(dist, name, refuse)
    try:
        return fn(*args, **kwargs)
    finally:
        for name, f in saved.items():
            setattr(dist, name, f)


def _cases(rank, seed):
    g = torch.Generator().manual_seed(seed * 1000 + rank)
    for shape in SHAPES:
        yield shape, torch.randint(-1000, 1000, shape, generator=g, dtype=torch.int64), \
            torch.randn(shape, generator=g, dtype=torch.float32), torch.randn(shape, generator=g, dtype=torch.float64)


def _run(fn, group, seed):
    """Results of fn vs dist.all_reduce on this rank, for every shape."""
    rank = dist.get_rank()
    out = []
    for shape, ints, floats, doubles in _cases(rank, seed):
        got_int = ints.clone()
        ret = _no_collectives(fn, got_int, op="sum", group=group)
        same_object = ret is got_int
        want_int = ints.clone()
        dist.all_reduce(want_int, group=group)
        # AVG on integer-valued floats: the sum is exact, so the mean is exact too.
        got_avg = ints.double()
        _no_collectives(fn, got_avg, op="avg", group=group)
        want_avg = ints.double()
        dist.all_reduce(want_avg, group=group)
        want_avg /= dist.get_world_size(group)
        got_float = floats.clone()
        _no_collectives(fn, got_float, op="sum", group=group)
        want_float = floats.clone()
        dist.all_reduce(want_float, group=group)
        got_double = doubles.clone()
        _no_collectives(fn, got_double, op="sum", group=group)
        want_double = doubles.clone()
        dist.all_reduce(want_double, group=group)
        out.append(dict(shape=shape, same_object=same_object, got_int=got_int, want_int=want_int, got_avg=got_avg,
                        want_avg=want_avg, got_float=got_float, want_float=want_float, got_double=got_double,
                        want_double=want_double, input_int=ints))
    return out


# group name -> (its global ranks, its size); None: the world (group=None)
GROUPS = {"ranks 0-1": ([0, 1], 2), "ranks 0-2": ([0, 1, 2], 3), "world": (None, 4), "ranks 1-3": ([1, 2, 3], 3)}


def all_reduce_worker(rank, world_size, planted=None):
    """``planted``: with a planted wrong solution (:mod:`tests.support.planting`)."""
    from tests.support.planting import planting

    with planting(planted):
        return _all_reduce_cases(rank)


def _all_reduce_cases(rank):
    from communication.ring import ring_all_reduce, tree_all_reduce

    groups = {name: dist.new_group(ranks) if ranks else None for name, (ranks, _) in GROUPS.items()}
    out = {}
    for which, fn in (("ring", ring_all_reduce), ("tree", tree_all_reduce)):
        try:
            out[which] = {name: _run(fn, groups[name], seed=seed) for seed, (name, (ranks, _)) in
                          enumerate(GROUPS.items()) if ranks is None or rank in ranks}
        except NotImplementedError as exc:  # a stub: that function's test fails, the other one still runs
            out[which] = exc
    if rank < 3:
        trace = []
        try:
            ring_all_reduce(torch.arange(10, dtype=torch.int64), group=groups["ranks 0-2"], trace=trace)
            out["trace"] = trace
        except NotImplementedError as exc:
            out["trace"] = exc
    return out


def runs(planted=None):
    """One launch of 4 ranks runs both algorithms on every group (process start-up dominates the time)."""
    return launch_once(all_reduce_worker, 4, planted, timeout=120)


def _check(all_outputs, size, which):
    outputs = {rank: out[which] for rank, out in all_outputs.items()}
    for rank, results in outputs.items():
        if isinstance(results, Exception):
            raise results
    names = [name for name, (_, n) in GROUPS.items() if n == size]
    outputs = {rank: {name: cases for name, cases in results.items() if name in names}
               for rank, results in outputs.items()}
    outputs = {rank: results for rank, results in outputs.items() if results}
    assert sum(len(results) for results in outputs.values()) == sum(
        len(GROUPS[name][0] or range(4)) for name in names), f"{which}: a rank is missing results"
    for rank, results in outputs.items():
        for group_name, cases in results.items():
            for c in cases:
                where = f"{which} all-reduce, group {group_name} ({size} ranks), rank {rank}, shape {c['shape']}"
                assert c["same_object"], f"{where}: must reduce in place and return the tensor it was given"
                assert c["got_int"].shape == c["input_int"].shape, f"{where}: shape changed"
                wrong = (c["got_int"] != c["want_int"]).reshape(-1).nonzero().reshape(-1).tolist()
                assert not wrong, (f"{where}: int64 SUM differs from dist.all_reduce at flat positions {wrong[:10]} "
                                   f"of {c['got_int'].numel()} (chunks missed, not gathered, or the remainder dropped?)")
                assert torch.equal(c["got_avg"], c["want_avg"]), f"{where}: AVG is not the sum divided by the group size"
                # a sum of p <= 4 float32 values in another order: at most (p - 1) x 2^-24 ~ 1.8e-7 times the sum of
                # their magnitudes (O(1) randn values: <= ~1e-6 absolute), so 1e-5 both ways leaves a factor of 10
                assert torch.allclose(c["got_float"], c["want_float"], rtol=1e-5, atol=1e-5), \
                    f"{where}: float32 SUM differs from dist.all_reduce beyond rounding"
                # the same sums in float64: (p - 1) x 2^-53 ~ 3.3e-16 of the magnitudes' sum (<= ~1e-15 absolute);
                # 1e-12 leaves a factor of 1000, while a float32 step anywhere (2^-24 ~ 6e-8 relative) is far outside
                assert c["got_double"].dtype == torch.float64 and torch.allclose(
                    c["got_double"], c["want_double"], rtol=1e-12, atol=1e-12), \
                    f"{where}: float64 SUM differs from dist.all_reduce beyond float64's rounding (messages sent in " \
                    "another dtype?)"
        for group_name, cases in results.items():
            for c, c0 in zip(cases, outputs[min(r for r in outputs if group_name in outputs[r])][group_name]):
                assert torch.equal(c["got_float"], c0["got_float"]), \
                    f"{which}, {group_name} group: ranks hold different float results (shape {c['shape']})"


@pytest.mark.parametrize("group_size", [2, 3, 4])
def test_ring_all_reduce_equals_dist_all_reduce(group_size):
    _check(runs(), group_size, "ring")


@pytest.mark.parametrize("group_size", [2, 3, 4])
def test_tree_all_reduce_equals_dist_all_reduce(group_size):
    _check(runs(), group_size, "tree")


def test_ring_trace_sends_to_the_right_neighbour_2_p_minus_1_messages():
    outputs = {rank: out for rank, out in runs().items() if rank < 3}  # the ring of ranks 0-2
    for rank, out in outputs.items():
        if isinstance(out["trace"], Exception):
            raise out["trace"]
        trace = out["trace"]
        assert len(trace) == 2 * (3 - 1), f"rank {rank}: a ring all-reduce sends 2(p-1) messages, not {len(trace)}"
        assert {m["dst"] for m in trace} == {(rank + 1) % 3} and {m["src"] for m in trace} == {(rank - 1) % 3}
        assert [m["phase"] for m in trace] == ["reduce_scatter"] * 2 + ["all_gather"] * 2
        # reduce-scatter: the chunk sent in step s+1 is the one received (and added to) in step s
        rs = [m for m in trace if m["phase"] == "reduce_scatter"]
        assert rs[1]["send_chunk"] == rs[0]["recv_chunk"], f"rank {rank}: the ring must pass on the chunk it just reduced"
        # all-gather: a rank ends with every chunk: its own reduced chunk plus the p-1 it receives
        ag = [m for m in trace if m["phase"] == "all_gather"]
        assert sorted([ag[0]["send_chunk"]] + [m["recv_chunk"] for m in ag]) == [0, 1, 2]
