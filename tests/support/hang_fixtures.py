"""The recorded dumps the graded tests of the hang analysis read (``tests/communication/hang_dumps/<case>/``).

Written once by running every planted bug of :mod:`communication.labs.hang_workers` (and the healthy step) with the
flight recorder on, in fresh processes, so the graded tests are fast and do not depend on this machine:

    python -m tests.support.hang_fixtures          # rewrites tests/communication/hang_dumps/
    python -m tests.support.hang_fixtures unmatched_send    # rewrites that case only

Only the course's JSON dumps are kept (a few KB each); the line numbers in them are those of the workers when
the dumps were written.
"""
from __future__ import annotations

import shutil
import sys
import tempfile
from pathlib import Path

FOLDER = Path(__file__).resolve().parent.parent / "communication" / "hang_dumps"
CASES = ["early_stop", "receive_first", "wrong_group", "crossed_sizes", "mystery_metrics", "healthy_step",
         "unmatched_send", "mistyped_message", "undumped_rank", "uneven_all_to_all"]


def swap_in_one_batch(rank: int, world_size: int) -> list:
    """Two ranks swap a tensor in one ``batch_isend_irecv`` (a worker for test_hang_runs.py): what the rank received."""
    import torch
    import torch.distributed as dist

    inbox = torch.empty(3)
    peer = 1 - rank
    ops = [dist.P2POp(dist.isend, torch.full((3,), float(rank)), peer, group=dist.group.WORLD),
           dist.P2POp(dist.irecv, inbox, peer, group=dist.group.WORLD)]
    for work in dist.batch_isend_irecv(ops):
        work.wait()
    return inbox.tolist()


def write_fixtures(folder: Path = FOLDER, cases: list[str] = CASES) -> None:
    from communication.labs.hang_workers import run_planted

    for case in cases:
        with tempfile.TemporaryDirectory() as tmp:
            run_planted(case, Path(tmp) / case)
            target = folder / case
            shutil.rmtree(target, ignore_errors=True)
            target.mkdir(parents=True)
            for dump in sorted((Path(tmp) / case).glob("rank*.json")):
                shutil.copy(dump, target / dump.name)
        print(case, sorted(p.name for p in target.iterdir()))


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent.parent))
    write_fixtures(cases=sys.argv[1:] or CASES)
