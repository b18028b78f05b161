"""Assignment 5.2.1 — the clock-cycle schedule and splitting a model into stages (graded).

Golden schedules are written out by hand from the definition (micro-batch i is on
stage j at clock cycle k = i + j). The splitting cases use the ``meta`` device as a
second device, so grouping by device is tested without GPUs, and an explicit balance
for several stages on ``cpu``.
"""
import pytest
import torch
from torch import nn

from pipeline.partition import WithDevice, _split_module
from pipeline.pipe import Pipe
from pipeline.clock_cycles import _clock_cycles

pytestmark = pytest.mark.a5_2_1

GOLDEN = {
    # (m micro-batches, n stages): [pairs (i, j) of each clock cycle]
    (1, 1): [[(0, 0)]],
    (3, 1): [[(0, 0)], [(1, 0)], [(2, 0)]],
    (1, 3): [[(0, 0)], [(0, 1)], [(0, 2)]],
    (2, 3): [[(0, 0)], [(1, 0), (0, 1)], [(1, 1), (0, 2)], [(1, 2)]],                        # m < n
    (3, 3): [[(0, 0)], [(1, 0), (0, 1)], [(2, 0), (1, 1), (0, 2)], [(2, 1), (1, 2)], [(2, 2)]],  # m = n
    (4, 2): [[(0, 0)], [(1, 0), (0, 1)], [(2, 0), (1, 1)], [(3, 0), (2, 1)], [(3, 1)]],       # m > n
}


@pytest.mark.parametrize("m,n", sorted(GOLDEN))
def test_clock_cycles_match_golden_schedule(m, n):
    cycles = [list(c) for c in _clock_cycles(m, n)]
    assert len(cycles) == m + n - 1 == len(GOLDEN[(m, n)]), f"expected {m + n - 1} clock cycles, got {len(cycles)}"
    for k, (got, want) in enumerate(zip(cycles, GOLDEN[(m, n)])):
        assert len(got) == len(set(got)), f"cycle {k} repeats a task: {got}"
        assert sorted(got) == sorted(want), f"cycle {k}: got {got}, want {want}"
        assert got == want, f"cycle {k}: the tasks must be ordered by stage (j = 0, 1, ...): got {got}, want {want}"


@pytest.mark.parametrize("m,n", [(5, 4), (4, 5), (7, 3)])
def test_clock_cycles_cover_every_task_once_at_i_plus_j(m, n):
    seen = []
    cycles = list(_clock_cycles(m, n))
    assert len(cycles) == m + n - 1
    for k, cycle in enumerate(cycles):
        assert len({j for _, j in cycle}) == len(cycle), f"cycle {k} gives one stage two tasks"
        for i, j in cycle:
            assert i + j == k and 0 <= i < m and 0 <= j < n
            seen.append((i, j))
    assert sorted(seen) == [(i, j) for i in range(m) for j in range(n)]


def _layers():
    return [nn.Linear(3, 3), nn.ReLU(), nn.Linear(3, 3), nn.Tanh(), nn.Linear(3, 3)]


def test_split_by_device_groups_consecutive_layers_and_honours_with_device():
    cpu, meta = torch.device("cpu"), torch.device("meta")
    a, relu, b, tanh, c, sig = nn.Linear(3, 3), nn.ReLU(), nn.Linear(3, 3, device="meta"), nn.Tanh(), \
        nn.Linear(3, 3), nn.Sigmoid()
    model = nn.Sequential(a, WithDevice(relu, "meta"), b, WithDevice(tanh, "meta"), c, WithDevice(sig, "cpu"))
    partitions, devices = _split_module(model)
    assert devices == [cpu, meta, cpu]
    assert [list(p) for p in partitions] == [[a], [relu, b, tanh], [c, sig]], \
        "a parameterless layer takes the device of its WithDevice wrapper, and the wrapper is removed"


def test_split_parameterless_first_layer_joins_the_next_layers_stage():
    first, lin = nn.ReLU(), nn.Linear(3, 3, device="meta")
    partitions, devices = _split_module(nn.Sequential(WithDevice(first, "meta"), lin, nn.Linear(3, 3)))
    assert devices == [torch.device("meta"), torch.device("cpu")]
    assert [len(p) for p in partitions] == [2, 1]
    assert partitions[0][0] is first and partitions[0][1] is lin


@pytest.mark.parametrize("balance", [[2, 1, 2], [1, 1, 1, 1, 1], [4, 1], [5]])
def test_split_with_balance_keeps_several_cpu_stages(balance):
    layers = _layers()
    partitions, devices = _split_module(nn.Sequential(*layers), balance=balance)
    assert devices == [torch.device("cpu")] * len(balance), "every stage is on cpu, and they stay separate"
    assert [len(p) for p in partitions] == balance
    assert [layer for p in partitions for layer in p] == layers, "layers keep their order"


def test_split_with_balance_gives_each_stage_its_layers_device():
    """A balance over layers on two devices: each stage's device is the one its layers sit on."""
    cpu, meta = torch.device("cpu"), torch.device("meta")
    layers = [nn.Linear(3, 3), nn.Linear(3, 3), nn.Linear(3, 3, device="meta"), WithDevice(nn.ReLU(), "meta"),
              nn.Linear(3, 3)]
    partitions, devices = _split_module(nn.Sequential(*layers), balance=[2, 2, 1])
    assert devices == [cpu, meta, cpu], f"stage devices {devices}: each stage is on its layers' device"
    assert [len(p) for p in partitions] == [2, 2, 1]
    assert not any(isinstance(layer, WithDevice) for p in partitions for layer in p), "the wrappers are removed"


def test_pipe_with_a_cpu_device_list_has_one_stage_per_device():
    pipe = Pipe(nn.Sequential(*_layers()), split_size=2, devices=["cpu", "cpu"])
    assert len(pipe.partitions) == 2 and [len(p) for p in pipe.partitions] == [3, 2]
    assert pipe.devices == [torch.device("cpu")] * 2


@pytest.mark.parametrize("balance,bad_stage", [([2, 1], 0), ([1, 2], 1)])
def test_split_with_balance_refuses_a_stage_on_two_devices(balance, bad_stage):
    """With a ``balance``, every layer of a stage must already sit on the stage's device: a stage whose
    layers are on two devices is an error where the stage is made, naming the stage."""
    if bad_stage == 0:
        layers = nn.Sequential(nn.Linear(3, 3), nn.Linear(3, 3, device="meta"), nn.Linear(3, 3))
    else:
        layers = nn.Sequential(nn.Linear(3, 3), nn.Linear(3, 3), nn.Linear(3, 3, device="meta"))
    with pytest.raises(ValueError, match=f"stage {bad_stage} holds layers on several devices"):
        _split_module(layers, balance=balance)
