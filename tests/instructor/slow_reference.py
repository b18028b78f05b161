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

from course.blocks import find_blocks

ROOT = Path(__file__).resolve().parents[2]

# (file, the block's marker, reference lines inside that block, slow lines)
CHANGES = (
    ("communication/buckets.py", "ASSIGN5_4_2", "        if self.overlap:\n            while self.launched",
     "        if False:  # planted: every bucket waits for finish()\n            while self.launched"),
    ("pipeline/schedules.py", "ASSIGN5_2_4", "    warmup = min(n_stages - rank - 1, micro_batches)\n    actions = [",
     "    warmup = 0  # planted: no warm-up forwards\n    actions = ["),
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
    for name, marker, old, new in CHANGES:
        path = dest / name
        path.write_text(replace_in_block(path.read_text(encoding="utf-8"), marker, old, new, name), encoding="utf-8")
    return dest


def block_bodies(text: str, marker: str, where: str) -> list[tuple[int, int]]:
    """``(first, end)`` line ranges of the bodies of ``marker``'s blocks in ``text`` (the course's one block scanner,
    :func:`course.blocks.find_blocks`)."""
    return [(b.begin + 1, b.end) for b in find_blocks(text.split("\n"), where) if b.marker == marker]


def replace_in_block(text: str, marker: str, old: str, new: str, where: str) -> str:
    """``text`` with ``old`` replaced by ``new`` inside the one block of ``marker`` that holds it, once.

    Raises:
        RuntimeError: ``old`` is not in exactly one place of ``marker``'s blocks (the reference changed: update
            :data:`CHANGES`).
    """
    lines = text.split("\n")
    spans = [(a, b) for a, b in block_bodies(text, marker, where) if old in "\n".join(lines[a:b])]
    if len(spans) != 1 or "\n".join(lines[spans[0][0]:spans[0][1]]).count(old) != 1:
        raise RuntimeError(f"{where}: the reference lines {old!r} are not in one {marker} block once; update CHANGES")
    a, b = spans[0]
    return "\n".join(lines[:a] + "\n".join(lines[a:b]).replace(old, new).split("\n") + lines[b:])


if __name__ == "__main__":
    print(write(Path(sys.argv[1])))
