"""The GPU figures the notebooks show: read from the newest GPU report in ``results/gpu/``.

``python project/tools/gpu_report.py``, run on a machine with a GPU, writes ``results/gpu/<device>-<date>.json``
(the GPU tier on one GPU, the measured bf16 matrix-product peak beside the datasheet's, tokens/s and MFU of
a GPT-2 in bf16, peak memory against the planner, activation checkpointing's recomputation on the GPU).
Notebooks 05 (memory) and 06 (3D parallelism, MFU) print its figures with the device and date they were
measured on — never typed-in numbers — or, where no report exists yet, a sentence that says so::

    from course.gpu_figures import gpu_figures_text
    print(gpu_figures_text("memory"))       # notebook 05; "throughput" in notebook 06

* :func:`latest_report` — the newest report (by its ``created`` time; dry runs on the CPU are left out);
* :func:`gpu_figures` — one part's rows (``figure``, ``median``, ``min``, ``max``, ``n``, ``unit``, ``note``)
  with the device, date and file, ready for a ``pandas.DataFrame``;
* :func:`gpu_figures_text` — the same as text.

This module reads JSON only (no torch): the shared library imports no part and no script.
"""
from __future__ import annotations

import json
from pathlib import Path

KIND = "course GPU report"  # the "kind" of a report's JSON (project/tools/gpu_report.py writes it)
RESULTS = "results/gpu"     # where the reports go, relative to the repository
REPORTS_DIR = Path(__file__).resolve().parent.parent / RESULTS
PARTS = ("memory", "throughput")
VARIANT_NAMES = {"plain": "bf16", "checkpointing": "bf16 + activation checkpointing"}


def _variants(found: dict) -> list[tuple[str, dict]]:
    """``found``'s variants, plain first (JSON keeps them sorted by name)."""
    return sorted(found.items(), key=lambda item: (item[0] != "plain", item[0]))


def latest_report(folder=None) -> dict | None:
    """The newest GPU report in ``folder`` (default: the repository's ``results/gpu/``) as a dict, with
    ``"file"`` added (``results/gpu/<name>.json`` for the repository's folder, else the file's name); None
    when there is none. Files of another kind and dry runs (``--device cpu``) are left out.

    Raises:
        ValueError: a ``*.json`` file there is not JSON (its name in the message).
    """
    folder = REPORTS_DIR if folder is None else Path(folder)
    found = []
    for path in sorted(folder.glob("*.json")):
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path.name} in {RESULTS if folder == REPORTS_DIR else folder} is not JSON ({exc}): "
                             f"remove it or write it again with project/tools/gpu_report.py") from None
        if not isinstance(data, dict) or data.get("kind") != KIND or data.get("dry_run"):
            continue
        shown = f"{RESULTS}/{path.name}" if folder.resolve() == REPORTS_DIR.resolve() else path.name
        found.append((str(data.get("created", "")), path.name, dict(data, file=shown)))
    return max(found, key=lambda f: f[:2])[2] if found else None


def _row(figure: str, summary: dict | None, unit: str, note: str = "", scale: float = 1.0) -> dict:
    if summary is None:
        return {"figure": figure, "median": None, "min": None, "max": None, "n": 0, "unit": unit, "note": note}
    return {"figure": figure, "median": summary["median"] * scale, "min": summary["min"] * scale,
            "max": summary["max"] * scale, "n": summary["n"], "unit": unit, "note": note}


def caption(report: dict) -> str:
    """One line: device, date, versions, the GPU tier's outcome and the file."""
    v, tests = report["versions"], report.get("tests")
    tier = "GPU tier not run"
    if tests:
        c = tests["counts"]
        tier = (f"GPU tier on one GPU: {c['passed']} passed, {c['failed']} failed, {c['skipped']} skipped"
                + (" (timed out)" if tests.get("timed_out") else ""))
    return (f"Measured on {report['device']['name']} on {report['date']} (torch {v['torch']}, CUDA {v['cuda']}; "
            f"{tier}; {report['file']})")


def _memory_rows(report: dict) -> tuple[list[dict], list[str]]:
    mem, t = report["memory"], report["training"]
    rows = []
    for name, r in _variants(mem["variants"]):
        what = f"peak memory of a step, {VARIANT_NAMES.get(name, name)}"
        rows.append(_row(what, r["peak_bytes"], "GB", f"measured; {mem['measure']}", 1e-9))
        rows.append({"figure": f"planner's prediction, {VARIANT_NAMES.get(name, name)}",
                     "median": r["predicted_bytes"] * 1e-9, "min": None, "max": None, "n": 0, "unit": "GB",
                     "note": f"measured / predicted {r['measured_over_predicted']:.2f}"})
    c = report["checkpointing"]
    notes = [f"{t['preset']} ({t['n_params'] / 1e6:.0f}M parameters), batch {t['batch_size']} x {t['seq_len']} tokens, "
             f"vocabulary {t['vocab_size']}, AdamW, one rank; planner: {mem['planner']}",
             f"activation checkpointing on {c['device']} under bf16 autocast with dropout {c['dropout']}: "
             f"{c['equal_blocks']} of {c['blocks']} blocks recomputed bit-equal to the forward pass "
             f"({c['forward_dtype']} / {c['recomputed_dtype']}), losses {'equal' if c['loss_equal'] else 'different'}, "
             f"largest gradient difference {c['max_gradient_difference']:.2g} of the largest gradient"]
    return rows, notes


def _throughput_rows(report: dict) -> tuple[list[dict], list[str]]:
    m, t = report["matmul"], report["training"]
    sheet = m.get("datasheet")
    rows = [_row(f"bf16 matrix product, n = {s['n']}", s["flop_per_s"], "TFLOP/s", "measured", 1e-12)
            for s in m["sizes"]]
    if sheet:
        rows.append({"figure": f"datasheet peak, {sheet['model']} (dense bf16)", "median": sheet["flops"] * 1e-12,
                     "min": None, "max": None, "n": 0, "unit": "TFLOP/s",
                     "note": f"measured peak = {m['measured_over_datasheet']:.0%} of it; {sheet['source']}"})
    for name, r in _variants(t["variants"]):
        label = VARIANT_NAMES.get(name, name)
        rows.append(_row(f"tokens/s, {label}", r["tokens_per_s"], "tokens/s", "measured"))
        if r.get("mfu_datasheet"):
            rows.append(_row(f"MFU against the datasheet, {label}", r["mfu_datasheet"], "%", "", 100))
        rows.append(_row(f"MFU against the measured product peak, {label}", r["mfu_measured_peak"], "%",
                         f"peak {m['measured_peak']['flop_per_s']['median'] * 1e-12:.3g} TFLOP/s at n = "
                         f"{m['measured_peak']['n']}", 100))
    notes = [f"{t['preset']} ({t['n_params'] / 1e6:.0f}M parameters) in bf16 (autocast; fp32 weights and AdamW), batch "
             f"{t['batch_size']} x {t['seq_len']} synthetic tokens, vocabulary {t['vocab_size']}, one rank; "
             f"{t['model_flops_per_step'] / 1e12:.3g} TFLOP of model FLOPs per step (recomputation not counted)",
             _verdict(t["checkpointing_vs_plain"], report.get("machine"))]
    return rows, notes


def _verdict(stored: dict, machine: dict | None) -> str:
    """The verdict of a stored comparison, decided again from its per-repeat times by today's
    :func:`course.benchmarking.compare` (its paired sign test), so that an older report reads as the harness
    decides now."""
    from course.benchmarking import compare

    a, b = stored["a"]["all"], stored["b"]["all"]
    return compare(a, b, tuple(stored["names"]), unit=stored.get("unit", "s"),
                   conditions=machine if machine else "not recorded")["sentence"]


def gpu_figures(part: str, folder=None) -> dict | None:
    """The figures of ``part`` — ``"memory"`` (notebook 05: peak memory of a step against the planner, the
    recomputation check) or ``"throughput"`` (notebook 06: bf16 matrix-product peak and the datasheet's,
    tokens/s, MFU) — of :func:`latest_report`: ``{"device", "date", "file", "caption", "rows", "notes"}``
    (``rows``: ``figure``, ``median``, ``min``, ``max``, ``n``, ``unit``, ``note``; a prediction or a datasheet
    figure has ``n`` 0). None when there is no report.

    Raises:
        ValueError: an unknown part.
    """
    if part not in PARTS:
        raise ValueError(f"part must be one of {PARTS}, not {part!r}")
    report = latest_report(folder)
    if report is None:
        return None
    rows, notes = (_memory_rows if part == "memory" else _throughput_rows)(report)
    return {"device": report["device"]["name"], "date": report["date"], "file": report["file"],
            "caption": caption(report), "rows": rows, "notes": notes}


def _number(x) -> str:
    return "" if x is None else f"{x:.4g}"


def gpu_figures_text(part: str, folder=None) -> str:
    """:func:`gpu_figures` as text: the caption, a table, the notes; or, without a report, a sentence saying
    how to make one."""
    figures = gpu_figures(part, folder)
    if figures is None:
        return (f"No GPU report yet ({RESULTS}/ holds none): run `python project/tools/gpu_report.py` on a machine with a "
                f"CUDA GPU; it writes {RESULTS}/<device>-<date>.json, and this cell then shows its measured figures "
                f"with the device and date.")
    width = max(len(r["figure"]) for r in figures["rows"])
    lines = [figures["caption"], "",
             f"{'figure':<{width}}  {'median':>10}  {'min':>10}  {'max':>10}  {'n':>3}  unit"]
    for r in figures["rows"]:
        note = f"  ({r['note']})" if r["note"] else ""
        lines.append(f"{r['figure']:<{width}}  {_number(r['median']):>10}  {_number(r['min']):>10}  "
                     f"{_number(r['max']):>10}  {r['n'] or '':>3}  {r['unit']}{note}")
    lines += [""] + figures["notes"]
    return "\n".join(lines)
