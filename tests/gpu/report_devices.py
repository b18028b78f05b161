"""Started by ``tests/gpu/test_launcher_nccl.py`` under torchrun: each rank prints the device and the
group the launcher gave it, as one JSON line."""
import json
import sys
from pathlib import Path

if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    import os

    from course.launch import launch
    from tests.gpu.workers import group_worker

    out = launch(group_worker, int(os.environ["WORLD_SIZE"]), device="auto")
    for rank, value in out.items():
        print("REPORT " + json.dumps({"rank": rank, **value}), flush=True)
