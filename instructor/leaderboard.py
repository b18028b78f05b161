"""The leaderboard: one JSON entry per submission under ``leaderboard/``, validated, written from a performance run.

    python instructor/performance.py --submission ../alice --json perf.json     # measure (instructor/performance.py)
    python instructor/leaderboard.py write perf.json --name alice --commit <sha of alice's code>
    python instructor/leaderboard.py check                                     # every entry under leaderboard/

The format is documented in ``leaderboard/README.md``; :func:`validate` is its definition. An entry holds the
performance keys' ratios with their bootstrap intervals and verdicts, the machine record of the harness
(:func:`course.benchmarking.machine` / :func:`~course.benchmarking.finish`) of each timed key, the submission's
commit, and the **parity check** that validates it: the submission's losses in the measurement's first steps equal
the library's (``DistributedDataParallel``'s, ``Schedule1F1B``'s) within the correctness tolerance
(:data:`instructor.performance.DP_PARITY_RTOL`, :data:`~instructor.performance.PP_PARITY_RTOL`). A ratio is
re-judged from the entry's own per-repeat numbers (:func:`instructor.performance.judge`), so an edited ratio or
verdict is caught. Only what was measured on a ``quiet`` machine, with parity, is accepted.
"""
from __future__ import annotations

import argparse
import json
import math
import re
import sys
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if __name__ == "__main__":  # run as a file: import the packages of the tree this script sits in
    sys.path.insert(0, str(ROOT))

from instructor.performance import PERF_KEYS, grading_conditions, judge  # noqa: E402

FORMAT = 1
FOLDER = ROOT / "leaderboard"
MACHINE_FIELDS = ("cores", "usable_cores", "cpu_model", "device", "torch", "load_average", "load_average_after",
                  "busy_ranks", "conditions")
_NAME = re.compile(r"^[a-z0-9][a-z0-9_-]{0,63}$")
_COMMIT = re.compile(r"^[0-9a-f]{40}$")


class EntryError(ValueError):
    """A leaderboard entry that is not accepted; the message lists every reason."""


def entry_from_run(run: list[dict], name: str, commit: str, label: str = "", reference: bool = False,
                   course_commit: str = "") -> dict:
    """A leaderboard entry from a performance run (``instructor/performance.py --json``: a list of results).

    Raises:
        EntryError: the entry would not pass :func:`validate` (every reason listed).
    """
    keys = {}
    for result in run:
        d = result["detail"]
        keys[result["key"]] = {k: d.get(k) for k in ("verdict", "ratio", "interval", "spread", "repeats", "threshold",
                                                      "margin", "bound", "at_least", "conditions", "unit", "yours",
                                                      "library", "checks", "rows", "machine", "reason")
                               if d.get(k) is not None}
    entry = {"format": FORMAT, "name": name, "label": label or name, "reference": bool(reference), "commit": commit,
             "course_commit": course_commit, "date": datetime.now(timezone.utc).strftime("%Y-%m-%d"), "keys": keys}
    validate(entry)
    return entry


def problems(entry: dict) -> list[str]:
    """Every reason ``entry`` is not accepted (empty: accepted)."""
    found = []
    if entry.get("format") != FORMAT:
        found.append(f"format must be {FORMAT}, not {entry.get('format')!r}")
    if not _NAME.match(str(entry.get("name", ""))):
        found.append(f"name {entry.get('name')!r}: lower-case letters, digits, '-' and '_' (the file's name)")
    if not _COMMIT.match(str(entry.get("commit", ""))):
        found.append(f"commit {entry.get('commit')!r} must be the 40-hex-digit commit of the submission's code")
    keys = entry.get("keys")
    if not isinstance(keys, dict) or not keys:
        return found + ["no performance keys: an entry holds at least one key's result"]
    for name, r in keys.items():
        key = PERF_KEYS.get(name)
        if key is None:
            found.append(f"{name}: not a performance key (known: {', '.join(PERF_KEYS)})")
            continue
        machine = r.get("machine")
        missing = [f for f in MACHINE_FIELDS if not isinstance(machine, dict) or f not in machine]
        if missing:
            found.append(f"{name}: no machine record of the harness (missing {', '.join(missing)})")
            continue
        if key.timed:
            judged = grading_conditions(machine)
            if judged != "quiet":
                found.append(f"{name}: measured on a {judged} machine; only a quiet machine's wall-clock ratios are "
                             "entered")
            checks = {c.get("name"): c for c in r.get("checks") or []}
            if "parity" not in checks:
                found.append(f"{name}: no parity check (the submission's losses against the library's)")
            elif not checks["parity"].get("passed"):
                found.append(f"{name}: the parity check failed ({checks['parity'].get('detail', '')})")
            try:
                again = judge(key, r["yours"], r["library"], conditions=grading_conditions(machine),
                              checks=list(checks.values()))
            except (KeyError, TypeError, ValueError) as exc:
                found.append(f"{name}: its per-repeat numbers cannot be judged again ({exc})")
                continue
        else:
            rows = r.get("rows") or []
            if not rows:
                found.append(f"{name}: no replayed configurations (rows)")
                continue
            again = judge(key, ratio=max(row["ratio"] for row in rows))
        if again["verdict"] != r.get("verdict") or not math.isclose(again["ratio"], r.get("ratio") or math.nan,
                                                                   rel_tol=1e-9):
            found.append(f"{name}: the stored verdict/ratio ({r.get('verdict')}, {r.get('ratio')}) is not what its "
                         f"own numbers give ({again['verdict']}, {again['ratio']:.6g})")
    return found


def validate(entry: dict) -> dict:
    """``entry`` if it is accepted.

    Raises:
        EntryError: every reason it is not (:func:`problems`).
    """
    found = problems(entry)
    if found:
        raise EntryError(f"leaderboard entry {entry.get('name')!r} rejected:\n  " + "\n  ".join(found))
    return entry


def entries(folder: Path = FOLDER) -> list[dict]:
    """Every entry under ``folder`` (``*.json``), validated, the reference first, then by name.

    Raises:
        EntryError: an entry is rejected, or its file is not named after it.
    """
    out = []
    for path in sorted(Path(folder).glob("*.json")):
        entry = validate(json.loads(path.read_text(encoding="utf-8")))
        if path.stem != entry["name"]:
            raise EntryError(f"{path}: an entry's file is named after it: {entry['name']}.json")
        out.append(entry)
    return sorted(out, key=lambda e: (not e["reference"], e["name"]))


def write(entry: dict, folder: Path = FOLDER) -> Path:
    """Write a validated entry to ``folder/NAME.json``."""
    from course.results import write_json

    return write_json(Path(folder) / f"{validate(entry)['name']}.json", entry)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description="The leaderboard of the performance keys (leaderboard/README.md).")
    sub = parser.add_subparsers(dest="command", required=True)
    w = sub.add_parser("write", help="write an entry from a performance run's JSON (instructor/performance.py --json)")
    w.add_argument("run", type=Path, help="the JSON written by instructor/performance.py --json")
    w.add_argument("--name", required=True, help="the entry's name (its file: leaderboard/NAME.json)")
    w.add_argument("--commit", required=True, help="the 40-hex-digit commit of the submission's code")
    w.add_argument("--label", default="", help="how the page names it (default: the name)")
    w.add_argument("--reference", action="store_true", help="the course's reference solution")
    w.add_argument("--course_commit", default="", help="the commit of the grader's tree that measured it")
    w.add_argument("--folder", type=Path, default=FOLDER)
    c = sub.add_parser("check", help="validate every entry")
    c.add_argument("--folder", type=Path, default=FOLDER)
    args = parser.parse_args(argv)
    try:
        if args.command == "write":
            entry = entry_from_run(json.loads(args.run.read_text()), args.name, args.commit, args.label,
                                   args.reference, args.course_commit)
            print(f"wrote {write(entry, args.folder)}")
        else:
            found = entries(args.folder)
            print(f"{len(found)} entries accepted in {args.folder}")
    except EntryError as exc:
        print(exc, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
