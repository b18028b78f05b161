"""A deliberately slow reference for the performance keys (instructor-only): the reference solution with the
speed taken out and the results kept, written as a submission folder.

    python -m tests.instructor.slow_reference DEST      # then: python instructor/performance.py --submission DEST

* a5_4_2 (``perf_dp_overlap``): the buckets' all-reduces all start after the backward pass (in ``finish``),
  not from the gradient hooks — the same averages, no overlap;
* a5_2_4 (``perf_1f1b``, ``perf_bubble``): 1F1B without its warm-up forwards (``warmup = 0`` on every rank) — each
  micro-batch's backward comes straight after its forward, so the ranks take turns instead of working at once: the
  same gradients, the bubble of a pipeline that never pipelines (``(p - 1) / p``).

Every change is one line of a reference block; :func:`write` checks that each one took.
"""
from __future__ import annotations

import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# (file, reference line, slow line)
CHANGES = (
    ("communication/buckets.py", "        if self.overlap:\n            while self.launched",
     "        if False:  # planted: every bucket waits for finish()\n            while self.launched"),
    ("pipeline/schedules.py", "    # BEGIN ASSIGN5_2_4\n    warmup = min(n_stages - rank - 1, micro_batches)",
     "    # BEGIN ASSIGN5_2_4\n    warmup = 0  # planted: no warm-up forwards"),
)
FILES = ("communication/buckets.py", "pipeline/schedules.py", "pipeline/stage_runner.py")


def write(dest: Path, root: Path = ROOT) -> Path:
    """Write the slow submission to ``dest`` (the files that hold the a5_4_2 and a5_2_4 blocks, at their paths).

    Raises:
        RuntimeError: a reference line was not found (the reference changed: update :data:`CHANGES`).
    """
    dest = Path(dest)
    for name in FILES:
        (dest / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(root / name, dest / name)
    for name, old, new in CHANGES:
        text = (dest / name).read_text(encoding="utf-8")
        if text.count(old) != 1:
            raise RuntimeError(f"{name}: the reference line {old!r} is not there once; update CHANGES")
        (dest / name).write_text(text.replace(old, new), encoding="utf-8")
    return dest


if __name__ == "__main__":
    print(write(Path(sys.argv[1])))
