"""Ranks reused between runs (course.launch_pool): the same processes serve consecutive runs, each run
starts from a fresh state, and a run that fails ends its pool so the next one starts clean."""
from __future__ import annotations

import os

import pytest
import torch
import torch.distributed as dist

from course import launch_pool
from course.launch import RankFailure, launch


def state_worker(rank, world_size, make_group: bool):
    """What a run sees: its pid, the caller's environment, the groups left by earlier runs, NCCL-rules mode."""
    from torch.distributed import distributed_c10d as c10d

    from course import nccl_rules

    seen = {"pid": os.getpid(), "marker": os.environ.get("LLMSYS_POOL_TEST"), "cwd": os.getcwd(),
            "groups": len(c10d._world.pg_map), "rules": dist.isend is nccl_rules.isend,
            "threads": torch.get_num_threads()}
    if make_group:
        dist.new_group([0, 1])
        torch.set_num_threads(1)
    t = torch.ones(1)
    dist.all_reduce(t)
    seen["sum"] = float(t)
    return seen


def failing_worker(rank, world_size):
    if rank == 1:
        raise ValueError("planted failure in a pooled rank")
    dist.barrier()


@pytest.fixture
def pool_on():
    was = launch_pool._ENABLED
    launch_pool.enable()
    yield
    if not was:
        launch_pool.shutdown()


def test_consecutive_runs_reuse_the_ranks_each_from_a_fresh_state(pool_on, monkeypatch, tmp_path):
    first = launch(state_worker, 2, True, timeout=60)
    monkeypatch.setenv("LLMSYS_POOL_TEST", "second")
    monkeypatch.setenv("LLMSYS_NCCL_RULES", "1")
    monkeypatch.chdir(tmp_path)
    second = launch(state_worker, 2, False, timeout=60)
    for rank in (0, 1):
        assert second[rank]["pid"] == first[rank]["pid"], "the second run did not reuse the ranks"
        assert second[rank]["sum"] == 2.0
        assert first[rank]["marker"] is None and second[rank]["marker"] == "second", "the caller's environment"
        assert second[rank]["cwd"] == str(tmp_path)
        assert second[rank]["groups"] == first[rank]["groups"], "the group made by the first run was not destroyed"
        assert second[rank]["threads"] == first[rank]["threads"], "the thread count was not restored"
        assert not first[rank]["rules"] and second[rank]["rules"], "NCCL-rules mode follows the caller's environment"


def test_a_failed_run_ends_its_pool_and_the_next_run_starts_clean(pool_on):
    before = launch(state_worker, 2, False, timeout=60)
    with pytest.raises(RankFailure, match="planted failure in a pooled rank"):
        launch(failing_worker, 2, timeout=60)
    after = launch(state_worker, 2, False, timeout=60)
    assert {r["pid"] for r in after.values()}.isdisjoint({r["pid"] for r in before.values()})
    assert all(r["sum"] == 2.0 for r in after.values())


def test_fresh_processes_inside_disabled(pool_on):
    pooled = launch(state_worker, 2, False, timeout=60)
    with launch_pool.disabled():
        fresh = launch(state_worker, 2, False, timeout=60)
    assert {r["pid"] for r in fresh.values()}.isdisjoint({r["pid"] for r in pooled.values()})


class _Group:
    """A stand-in for a process group: a name, and a hash like an object's address (different in each process)."""

    def __init__(self, name: str, address: int):
        self.name, self.address = name, address

    def __hash__(self):
        return self.address

    def __repr__(self):
        return self.name


def test_the_groups_a_run_made_are_destroyed_in_one_order_on_every_rank(monkeypatch):
    """Two ranks made the groups 0..5 in that order (each holds those it is a member of), at different addresses;
    both destroy what they hold in the same order — the last made first — whatever the addresses (NCCL's abort
    was collective in some versions; a set's order, what the pool used, follows the addresses)."""
    import types

    from torch.distributed import distributed_c10d as c10d

    world = _Group("world", 0)
    held = {0: [0, 1, 2, 3, 5], 1: [1, 2, 3, 4, 5]}  # group 0 only on rank 0, group 4 only on rank 1
    addresses = {0: lambda i: 8 * (7 - i), 1: lambda i: 8 * (3 * i % 7)}  # a different placement in each process
    destroyed = {}
    for rank, groups in held.items():
        pg_map = {world: None} | {_Group(str(i), addresses[rank](i)): None for i in groups}
        monkeypatch.setattr(c10d, "_world", types.SimpleNamespace(pg_map=pg_map, default_pg=world))  # GroupMember.WORLD
        order: list[str] = []
        launch_pool._destroy_groups_made_since([], lambda g: order.append(g.name))
        destroyed[rank] = order
    assert destroyed == {0: ["5", "3", "2", "1", "0"], 1: ["5", "4", "3", "2", "1"]}, destroyed
