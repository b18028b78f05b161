"""``--verify``: build the first and the last rank of each ranked plan in a fake world, beside the planner's bytes.

    python -m project.planner.verify '[{"preset": "tiny", "dp": 8, ...}, ...]'    # what verify_plans runs

The fake world (:mod:`project.planner.fake_mesh`: the course's mesh, stage and ZeRO on meta tensors over torch's fake
process group) runs in a child process — a process group, once made, stays in its process — bounded in time. The
fake rank builds fp32 dense runs without checkpointing or sequence parallelism
(:func:`project.planner.fake_mesh.check_supported`): each plan is verified in that form (the bytes' arithmetic is
the same; bf16's 2 + 2 + 12 bytes per parameter are 4 + 4 + 8 there), and the changes are said.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

CHANGES = {"precision": "fp32", "activation_checkpointing": False, "sequence_parallel": False}


def fake_ranks(values: list[dict]) -> list[dict]:
    """In this process (a fresh one): for each configuration's values, its first and last rank's bytes held and
    planned, or ``{"error"}`` for one the fake rank does not build."""
    from project.planner.config import PlanConfig
    from project.planner.fake_mesh import check_supported, measure

    out = []
    for v in values:
        plan = PlanConfig.for_test(**v)
        try:
            check_supported(plan)
        except ValueError as exc:
            out.append({"error": str(exc)})
            continue
        for rank in sorted({0, plan.world_size - 1}):
            got = measure(plan, rank)
            out.append({"rank": rank, "stage": got["stage"], "held": got["bytes"], "planned": got["planned"],
                        "peak": got["memtracker"]["peak"].get("Total")})
    return out


def verify_plans(plans: list, timeout: float = 1800.0, log=print) -> list[dict]:
    """:func:`fake_ranks` of each plan (:class:`project.planner.search.Plan`) in a child process bounded by
    ``timeout`` seconds, logged one line per rank.

    Returns:
        ``[{"dims", "rank", "stage", "held": {params, grads, optimizer}, "planned": {...}, "peak" (MemTracker's peak
        total), "changed"}]`` (or ``{"dims", "error"}``).

    Raises:
        RuntimeError: the child failed (its error's end in the message).
    """
    values = [p.config.record() | CHANGES | {"verify": False, "out": None} for p in plans]
    root = Path(__file__).resolve().parents[2]
    done = subprocess.run([sys.executable, "-m", "project.planner.verify", json.dumps(values)], cwd=root,
                          capture_output=True, text=True, timeout=timeout, env={**os.environ, "PYTHONPATH": str(root)})
    if done.returncode:
        raise RuntimeError(f"the fake ranks failed: {done.stderr[-2000:]}")
    found, results = [], iter(json.loads(done.stdout.strip().splitlines()[-1]))
    for p in plans:
        changed = [k for k, v in CHANGES.items() if getattr(p.config, k) != v]
        first = next(results)
        if "error" in first:
            log(f"  {p.dims}: not built ({first['error']})")
            found.append({"dims": p.dims, "error": first["error"]})
            continue
        rows = [first] + ([next(results)] if p.config.world_size > 1 else [])
        for row in rows:
            row.update(dims=p.dims, changed=changed)
            found.append(row)
            log("  " + " ".join(f"{k}={v}" for k, v in p.dims.items()) + f", rank {row['rank']} (stage "
                f"{row['stage']})" + (f" [{', '.join(changed)}: as fp32 / off]" if changed else "") + ": "
                + ", ".join(f"{k} {row['held'][k] / 1e6:,.2f} MB held / {row['planned'][k] / 1e6:,.2f} MB planned "
                            f"({row['held'][k] - row['planned'][k]:+,.0f} B)" for k in ("params", "grads", "optimizer")))
    return found


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print("usage: python -m project.planner.verify '<JSON list of planner option values>'", file=sys.stderr)
        return 2
    print(json.dumps(fake_ranks(json.loads(argv[0]))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
