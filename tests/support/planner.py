"""A worker for the planner's in-flight check (tests/plan/test_in_flight_measured.py): every schedule of the
registry run by the course's StageRunner on stages of tiny linear layers, its measured peak of micro-batches in
flight per rank."""
from __future__ import annotations

CASES = {2: 4, 3: 6}  # pipeline stages: micro-batches (2 p: a count every schedule of the registry accepts)


def in_flight_worker(rank: int, world_size: int) -> dict:
    """``{(schedule, p): peak in flight}`` of this rank for every schedule of :data:`pipeline.schedules.SCHEDULES`
    at every ``p`` of :data:`CASES` (the ranks ``0 .. p - 1`` of the world form the pipeline; interleaved with two
    chunks, the V schedules with their two), measured by :class:`pipeline.stage_runner.StageRunner`."""
    import torch
    import torch.distributed as dist
    from torch import nn

    from course.launch import context
    from pipeline.schedules import SCHEDULES, schedule_actions
    from pipeline.stage_runner import StageRunner

    device = context().device
    groups = {p: dist.new_group(list(range(p))) for p in CASES}  # collective: every rank makes every group
    out = {}
    for p, m in CASES.items():
        if rank >= p:
            continue
        for name, entry in SCHEDULES.items():
            v = 2 if entry.interleaved or entry.placement == "v" else 1
            torch.manual_seed(0)
            chunks = [nn.Linear(4, 4).to(device) for _ in range(v)]
            runner = StageRunner(chunks if v > 1 else chunks[0], device, group=groups[p], placement=entry.placement,
                                 loss_fn=lambda y, t: (y - t).pow(2).mean())
            inputs = [torch.randn(2, 4, device=device) for _ in range(m)]
            targets = [torch.randn(2, 4, device=device) for _ in range(m)]
            actions = schedule_actions(name, rank, p, m, 2 if entry.interleaved else 1)
            out[f"{name} {p}"] = runner.run(actions, inputs, targets).peak_in_flight
            dist.barrier(group=groups[p])
    return out
