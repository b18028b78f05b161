"""The worker of tests/course/test_async_checkpoint.py: an asynchronous save held in flight by a slow writer
(``$LLMSYS_CHECKPOINT_WRITE_DELAY``), watched from the training side."""
from __future__ import annotations


def async_save_worker(rank: int, world_size: int, root: str) -> dict:
    """Save step 1 synchronously, then step 2 asynchronously; while step 2's write is held, change the
    weights and look at what ``latest`` names; then wait, and load step 2 back."""
    import torch

    from course.checkpoint import (checkpoint_group, latest_checkpoint, load_checkpoint, save_checkpoint,
                                   save_checkpoint_async)

    def state(value: float) -> dict:
        return {f"own{rank}": torch.full((4096,), value + rank, device="cpu"),
                "shared": torch.full((4096,), value, device="cpu"),
                "progress": {f"rank{rank}": {"steps": int(value)}}}

    save_group = checkpoint_group(None)
    save_checkpoint(root, 1, state(1.0), rank=rank)  # synchronous: the fail-safe tests cover it
    weights = state(2.0)
    pending = save_checkpoint_async(root, 2, weights, rank=rank, save_group=save_group)
    written_at_return = pending.future.done()  # the background write (held $LLMSYS_CHECKPOINT_WRITE_DELAY s)
    for t in (weights[f"own{rank}"], weights["shared"]):
        t.add_(100.0)  # the next steps change the weights while the files are written
    during = {"latest": getattr(latest_checkpoint(root), "name", None), "final_exists": pending.final.exists(),
              "tmp_exists": pending.tmp.exists(), "committed": pending.poll()}
    folder = pending.wait()
    after = {"latest": latest_checkpoint(root).name, "folder": folder.name, "committed": pending.poll(),
             "tmp_exists": pending.tmp.exists()}
    loaded = load_checkpoint(folder, state(0.0))
    return {"written_at_return": written_at_return, "during": during, "after": after,
            "own": float(loaded[f"own{rank}"].unique().item()), "shared": float(loaded["shared"].unique().item()),
            "steps": loaded["progress"][f"rank{rank}"]["steps"]}
