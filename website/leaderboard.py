"""The site's leaderboard page, built from the validated entries under ``leaderboard/`` (``instructor/leaderboard.py``).

One row per entry (the reference first), one column per performance key: the median ratio, its 95 % bootstrap
interval and the verdict; then the machine each was measured on and the commit. No entry: no page.
"""
from __future__ import annotations

from pathlib import Path

from instructor.leaderboard import entries
from instructor.performance import PERF_KEYS

PAGE = "leaderboard.md"


def _cell(result: dict | None) -> str:
    if result is None:
        return "—"
    lo, hi = result.get("interval") or (result["ratio"], result["ratio"])
    spread = f" ({lo:.3f}–{hi:.3f})" if hi != lo else ""
    return f"{result['ratio']:.3f}{spread} {result['verdict']}"


def page_markdown(root: Path) -> str | None:
    """The page's Markdown for the course tree ``root``; None when ``root/leaderboard`` holds no entry.

    Raises:
        instructor.leaderboard.EntryError: an entry is rejected (the build fails, naming it and why).
    """
    folder = Path(root) / "leaderboard"
    found = entries(folder) if folder.is_dir() else []
    if not found:
        return None
    names = list(PERF_KEYS)
    lines = ["# Leaderboard", "",
             "Speed as side-by-side ratios against torch's own implementations, measured in one run on one quiet "
             "machine under the course's measurement protocol (median of the per-repeat ratios, 95 % bootstrap "
             "interval in brackets, and the verdict). An entry is accepted only with its parity check (its losses "
             "equal the library's) and a quiet machine; the format and the rules are in `leaderboard/README.md`"
             + (", the keys and thresholds in [Grading](docs/grading.md#performance-keys)."
                if (Path(root) / "docs" / "grading.md").is_file() else "."), "",
             "| entry | " + " | ".join(f"`{n}`" for n in names) + " | date | commit |",
             "|---|" + "---|" * len(names) + "---|---|"]
    for e in found:
        label = f"**{e['label']}** (reference)" if e["reference"] else e["label"]
        lines.append(f"| {label} | " + " | ".join(_cell(e["keys"].get(n)) for n in names)
                     + f" | {e['date']} | `{e['commit'][:10]}` |")
    lines += ["", "| key | goal |", "|---|---|"]
    lines += [f"| `{k.name}` | {k.topic}: {k.goal()} |" for k in PERF_KEYS.values()]
    lines += ["", "Machines:", ""]
    for e in found:
        for name, r in e["keys"].items():
            m = r["machine"]
            lines.append(f"* {e['label']}, `{name}`: {m['cores']} cores ({m['cpu_model']}), {m['device']}, torch "
                         f"{m['torch']}, conditions {r.get('conditions', m['conditions'])}")
    return "\n".join(lines) + "\n"
