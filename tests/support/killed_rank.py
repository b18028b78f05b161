"""The worker of tests/course/test_failed_rank.py: a real pipeline run (``project/train.py --mode pipeline``'s one
worker) in which one rank says when it has reached a given training step, so that the test can SIGKILL it from
outside while its peers exchange activations and gradients with it."""
from __future__ import annotations

import os
from pathlib import Path


def marked_train_worker(rank: int, world_size: int, config, victim: int, at_step: int, marker: str) -> dict:
    """:func:`project.modes.train_worker` on every rank; rank ``victim`` writes its process id to ``marker`` as it
    begins training step ``at_step`` (1-based) and trains on (the test kills it from outside)."""
    if rank == victim:
        import course.epoch_runner as runner

        original = runner.train_epoch

        def train_epoch(step, *args, **kwargs):
            seen = [0]

            def marked(batch):
                seen[0] += 1
                if seen[0] == at_step:
                    tmp = Path(f"{marker}.tmp")
                    tmp.write_text(str(os.getpid()))
                    os.replace(tmp, marker)
                return step(batch)
            return original(marked, *args, **kwargs)
        runner.train_epoch = train_epoch
    from project.modes import train_worker

    return train_worker(rank, world_size, "pipeline", config)
