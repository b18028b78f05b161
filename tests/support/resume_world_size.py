"""The worker of tests/data_parallel/test_resume_world_size.py: in one launch of 4 ranks, for each case a
data-parallel run at dp = 4 that checkpoints, then — in ranks 0 and 1 of the same processes, a group of
their own — the run resumed from that checkpoint at dp = 2, exactly as two runs of
``project/run_data_parallel.py`` (``data_parallel.training.dp_training``) would, but with the data prepared
once; meanwhile rank 2 computes the reference in one process.

The reference is the definition of "the same run at the new size" (data_parallel/data_order.py) written
out plainly, independent of the checkpoint code: one GPT-2 and AdamW, the epoch's global batches of the
run at dp = 4 (every rank's ``partition_dataset`` shard, rank 0's rows first); steps 1..K average the
mean losses of the 4 row blocks a dp = 4 run computes, steps K+1.. the mean losses of the 2 row blocks a
dp = 2 run computes. It returns every block's loss per step.
"""
from __future__ import annotations

import copy


def _sharding(model, config, group, mesh=None):
    if not config.memory_options():
        return None
    from memory import build_sharding

    return build_sharding(model, config, group, mesh)


def _train(config, data, device, rank, group, mesh=None):
    """A data-parallel run (:class:`data_parallel.training.DataParallelTraining`) on prepared data, in ``group`` (its dp
    group and world)."""
    import torch

    from course.epoch_runner import run_epochs
    from course.task import build_model
    from data_parallel.training import DataParallelTraining

    model = build_model(config, data.tokenizer.vocab_size).to(device)
    sharding = _sharding(model, config, group, mesh)
    optimizer = sharding.optimizer if sharding is not None else torch.optim.AdamW(model.parameters(),
                                                                                   lr=config.learning_rate)
    mode = DataParallelTraining(config, data, device, model, optimizer, group, sharding=sharding, rank=rank,
                                world_group=group, throughput_group=group, show_progress=False)
    return run_epochs(mode)


def reference_losses(config, data, first_dp: int, second_dp: int, switch_after: int, steps: int) -> list[list[float]]:
    """Per step, the mean loss of each row block (module docstring), in one process."""
    import torch

    from course.loss import model_loss
    from course.task import build_model
    from data_parallel.partition import partition_dataset

    model = build_model(config, data.tokenizer.vocab_size)
    optimizer = torch.optim.AdamW(model.parameters(), lr=config.learning_rate)
    shards = [partition_dataset(r, first_dp, data.train, config.batch_size, collate_fn=list, seed=config.seed)
              for r in range(first_dp)]
    out = []
    for step, parts in zip(range(steps), zip(*shards)):
        examples = [e for part in parts for e in part]
        blocks = first_dp if step < switch_after else second_dp
        rows = len(examples) // blocks
        optimizer.zero_grad(set_to_none=True)
        losses = [model_loss(model, data.collate(examples[b * rows:(b + 1) * rows])) for b in range(blocks)]
        (sum(losses) / blocks).backward()
        optimizer.step()
        out.append([loss.item() for loss in losses])
    return out


def resume_cases(rank: int, world_size: int, cases: dict, steps: int, every: int) -> dict:
    """For each case ``name: (first config at dp 4, second config at dp 2 with .resume set)``: train, then resume.
    Returns ``{"reference": [...], "cases": {name: {"first": [results], "second": [results]}}}`` (rank 0, 1)."""
    import json

    import torch.distributed as dist

    from course.launch import context
    from course.mesh import Mesh
    from course.task import prepare_data, worker_env_quiet

    worker_env_quiet()
    device = context().device
    mesh = Mesh.build(dp=world_size)
    pair = dist.new_group([0, 1], group_desc="resumed")  # every rank creates it
    first_args = next(iter(cases.values()))[0]
    data = prepare_data(first_args)
    out = {"cases": {}}
    for name, (first, second) in cases.items():
        written = {"first": _train(first, data, device, rank, mesh.dp_group, mesh)}
        if rank < 2:
            written["second"] = _train(second, data, device, rank, pair)
        elif rank == 2 and "reference" not in out:
            out["reference"] = reference_losses(copy.copy(first), data, 4, 2, every, steps)
        dist.barrier()
        out["cases"][name] = {k: [json.loads(open(p).read()) for p in v] for k, v in written.items()}
    return out
