"""Workers of tests/course/test_rendezvous.py (spawned ranks import them by name)."""
from __future__ import annotations

import torch
import torch.distributed as dist


def unsafe_order_worker(rank: int, world_size: int) -> float:
    """Both ranks isend, then recv: fine on plain gloo; then the same under NCCL's rules (a deadlock)."""
    from course import nccl_rules

    other = 1 - rank
    for rules in (False, True):
        if rules:
            nccl_rules.install()
        work = dist.isend(torch.full((4096,), float(rank)), other)
        buf = torch.empty(4096)
        dist.recv(buf, other)
        work.wait()
        if not rules:
            print(f"rank {rank}: plain gloo: exchanged {float(buf[0])}", flush=True)
    return float(buf[0])


def crossed_tags_worker(rank: int, world_size: int) -> None:
    """Rank 0 sends a 10-element message (tag 1) then a 20-element one (tag 2); rank 1 receives tag 2
    first. With tags this matches; NCCL matches by order, so the first send meets the 20-element receive."""
    if rank == 0:
        dist.send(torch.ones(10), 1, tag=1)
        dist.send(torch.ones(20), 1, tag=2)
    else:
        dist.recv(torch.empty(20), 0, tag=2)
        dist.recv(torch.empty(10), 0, tag=1)


def batched_exchange_worker(rank: int, world_size: int) -> float:
    from course.collectives import send_recv

    other = 1 - rank
    buf = send_recv(torch.full((4096,), float(rank)), other, torch.empty(4096), other)
    return float(buf[0])


def all_reduce_worker(rank: int, world_size: int) -> list:
    """Ring and tree over the world (p = 4), ranks [0, 1, 2] (p = 3) and [0, 1] / [2, 3] (p = 2)."""
    from communication.ring import ring_all_reduce, tree_all_reduce

    groups = {4: None, 3: dist.new_group([0, 1, 2]), 2: None}
    pairs = [dist.new_group([0, 1]), dist.new_group([2, 3])]
    groups[2] = pairs[rank // 2]
    out = []
    for p, group in groups.items():
        if p == 3 and rank == 3:
            continue
        for name, fn in (("ring", ring_all_reduce), ("tree", tree_all_reduce)):
            for n in (1, 7, 1001):
                x = torch.randint(-1000, 1000, (n,), generator=torch.Generator().manual_seed(17 * rank + n))
                want = x.clone()
                dist.all_reduce(want, group=group)
                got = fn(x.clone(), "sum", group)
                out.append((f"{name} p={p}", got, want))
    return out


def schedules_worker(rank: int, world_size: int, schedules: list, n_chunks: int) -> list:
    """One tiny GPT-2 pipeline step per schedule (tests/support/pipeline.py's worker)."""
    from course.task import worker_env_quiet
    from tests.support.pipeline import gpt2_schedule_worker

    worker_env_quiet()
    torch.set_num_threads(1)
    return [gpt2_schedule_worker(rank, world_size, schedule, n_chunks) for schedule in schedules]


def check_equal_to_single_process(results: dict, world_size: int, schedule: str) -> None:
    from tests.support.pipeline import check_equal_to_single_process as check

    try:
        check(results, world_size)
    except AssertionError as exc:
        raise AssertionError(f"{schedule}: {exc}") from None
