"""The course's notebook checker: every committed notebook's outputs read against what its own numbers allow.

    python project/tools/check_notebooks.py              # every notebook in notebooks/: its committed outputs
    python project/tools/check_notebooks.py 04 07        # the notebooks whose names start with 04 and 07
    python project/tools/check_notebooks.py --recompute  # also run each in quick mode and compare its deterministic cells

A reader checks a sentence of a notebook against the output beside it; this script does it for the sentences the
course prints in fixed forms (docs/architecture.md, "The benchmark harness"):

* **the machine** — the first output of a notebook is its machine line (:func:`course.notebook_run.print_machine`),
  and every ``conditions: ...`` clause anywhere (:func:`course.benchmarking.conditions_clause`) must follow from the
  numbers printed in it: ``quiet`` only when the busy ranks plus the other processes' runnable threads fit the
  cores at the start and at the end (:func:`course.benchmarking.conditions`, the same rule); ``oversubscribed``
  exactly when the busy ranks exceed the cores;
* **verdicts** — every ``verdict: ...`` line (:func:`course.benchmarking.compare`) must agree with its own paired
  ratios: the sign test's p recomputed from the counts it prints, the word (faster, slower, indistinguishable) that
  p and the side of the ratios allow, a median on that side; it names its conditions, and no measured verdict
  comes from an ``oversubscribed`` run (a wall-clock lesson needs no more busy ranks than cores: replay instead);
* **comparisons** — an output that compares in words ("faster than", "slower than", "indistinguishable",
  "speed-up") does so in a verdict line, computed from the numbers, never in a sentence of its own;
* **exercises** — every numbered item of a notebook's "Exercises" sections has a check: a call in a later code
  cell marked with the exercise's number (``check_bubble(None)  # 3.``) whose cell printed the check's answer
  (:func:`course.exercise_checks.report`: ``...: right (...)`` or ``...: not yet (...)``);
* **stderr** — no committed output is written to stderr (warnings and progress belong on stdout or nowhere);
* **deterministic cells** — a cell tagged ``deterministic`` prints what the code computes the same on every run,
  at every size and on every CPU (formulas, schedules, counts of bytes — not a rounding-level difference from a
  reference, whose exact value, zero or not, depends on the CPU's kernels): :func:`stale_values` compares its
  committed outputs with a fresh execution's, number by number (a committed ``0.0`` where the code now gives
  ``2.4e-07`` is stale).
  The test suite's notebook run (``conftest.py``) makes that comparison for every notebook it executes;
  ``--recompute`` makes it here.

Each problem names the notebook, the cell (its index, as the issues cite cells) and the rule. Exit status 1 when
any is found.
"""
from __future__ import annotations

import argparse
import json
import math
import re
import sys
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
if __name__ == "__main__":  # run as a file: import the packages of the tree this script sits in
    sys.path.insert(0, str(REPO))

DETERMINISTIC = "deterministic"  # the cell tag of cells whose outputs a fresh run must repeat

_NUMBER = r"[-+]?(?:\d+\.?\d*|\.\d+)(?:e[-+]?\d+)?"
CONDITIONS = re.compile(
    r"conditions: (?P<word>quiet|loaded|oversubscribed)"
    r"(?: \((?P<busy>\d+) busy ranks \+ (?P<first>\d+(?:\.\d+)?)(?: other runnable threads)? at the (?P<when1>start|end)"
    r"(?:, (?P<second>\d+(?:\.\d+)?) at the end)?, on (?P<cores>\d+) cores\))?")
VERDICT = re.compile(
    r"verdict: (?:(?P<a>.+?) is (?P<word>faster|slower|lower|higher) than (?P<b>.+?), (?P<factor>" + _NUMBER + r")x"
    r"|(?P<a2>.+?) and (?P<b2>.+?) are (?P<word2>indistinguishable)) "
    r"\(median ratio .+? (?P<median>" + _NUMBER + r"), per repeat (?P<lo>" + _NUMBER + r")–(?P<hi>" + _NUMBER + r"); "
    r"(?P<below>\d+) of (?P<n>\d+) repeats below 1, (?P<above>\d+) above: sign test p = (?P<p>" + _NUMBER + r") "
    r"(?P<cmp><|>=) (?P<alpha>" + _NUMBER + r")(?: \(too few repeats[^)]*\))?; "
    r"(?P<unit>[^,;]+), (?P<better>lower|higher) is better; (?P<conditions>conditions: [^\n]*?)\)(?=$|[\s.;,)])")
COMPARISON_WORDS = re.compile(r"\b(faster than|slower than|indistinguishable|speed-?up)\b", re.IGNORECASE)
REPORT_LINE = re.compile(r": (right|not yet) \(")
CHECK_CALL = re.compile(r"^\s*[\w.]+\(.*\)\s*;?\s*#\s*(\d+)\.(?:\s|$)", re.MULTILINE)
EXERCISE_HEADING = re.compile(r"^(#+)\s+(?:\d+\.\s*)?Exercises?\b", re.IGNORECASE)
HEADING = re.compile(r"^(#+)\s")
ITEM = re.compile(r"^(\d+)\.\s")


@dataclass(frozen=True)
class Problem:
    """One finding: ``notebook`` (file name), ``cell`` (index in the notebook, None for the whole notebook),
    ``rule`` (machine, conditions, verdict, comparison, exercise, stderr, stale) and what is wrong."""

    notebook: str
    cell: int | None
    rule: str
    message: str

    def __str__(self) -> str:
        where = f"{self.notebook} [{self.cell}]" if self.cell is not None else self.notebook
        return f"{where} {self.rule}: {self.message}"


# ---- reading a notebook ---------------------------------------------------------------------------------

def _source(cell: dict) -> str:
    source = cell.get("source", "")
    return source if isinstance(source, str) else "".join(source)


def output_text(output: dict) -> str:
    """The text of one output: a stream's text, a result's or a display's ``text/plain`` (images have none)."""
    if output.get("output_type") == "stream":
        text = output.get("text", "")
    elif output.get("output_type") in ("execute_result", "display_data"):
        text = output.get("data", {}).get("text/plain", "")
    elif output.get("output_type") == "error":
        text = "\n".join([f"{output.get('ename')}: {output.get('evalue')}"])
    else:
        text = ""
    return text if isinstance(text, str) else "".join(text)


def cell_text(cell: dict) -> str:
    """Every output of ``cell`` as one text."""
    return "\n".join(output_text(o) for o in cell.get("outputs", []))


# ---- the rules ----------------------------------------------------------------------------------------------

def check_conditions_clause(match: re.Match) -> str | None:
    """What is wrong with one ``conditions: ...`` clause (None: it follows from its numbers, or it prints none)."""
    from course.benchmarking import SAMPLING_SLACK

    if match.group("busy") is None:
        return None
    busy, cores = int(match.group("busy")), int(match.group("cores"))
    readings = [float(match.group("first"))] + ([float(match.group("second"))] if match.group("second") else [])
    if busy > cores:
        want = "oversubscribed"
    elif busy + max(readings) > cores + SAMPLING_SLACK:
        want = "loaded"
    else:
        want = "quiet"
    word = match.group("word")
    if word == want:
        return None
    return (f"'{match.group(0)}' says {word}, but {busy} busy ranks and {max(readings):g} other runnable threads on "
            f"{cores} cores are {want}")


def _close(p_printed: float, p: float) -> bool:
    return math.isclose(p_printed, p, rel_tol=0.06, abs_tol=5e-4)  # p is printed to two significant digits


def check_verdict(match: re.Match) -> list[str]:
    """What is wrong with one ``verdict:`` line: counts, p, word and median against each other, and its
    conditions."""
    from course.benchmarking import sign_test_p

    wrong = []
    word = match.group("word") or match.group("word2")
    below, above, n = int(match.group("below")), int(match.group("above")), int(match.group("n"))
    p_printed, alpha = float(match.group("p")), float(match.group("alpha"))
    median, lower_better = float(match.group("median")), match.group("better") == "lower"
    if below + above > n:
        wrong.append(f"{below} below and {above} above 1 of only {n} repeats")
    p = sign_test_p(below, above)
    if not _close(p_printed, p):
        wrong.append(f"p = {p_printed:g} printed, but {below} below and {above} above give p = {p:.2g}")
    significant = p < alpha
    if (match.group("cmp") == "<") != significant:
        wrong.append(f"p = {p:.2g} is {'below' if significant else 'not below'} {alpha:g}, as the line does not say")
    if significant:
        a_smaller = below > above
        a_better = a_smaller == lower_better
        want = ("faster" if a_better else "slower") if word in ("faster", "slower") else \
            ("lower" if a_smaller else "higher")  # a quantity's own words (a loss: lower is better)
        if word != want:
            wrong.append(f"says {word}, but {below} of {n} paired ratios below 1 and {above} above (p = {p:.2g}) "
                         f"make it {want}")
        elif (median < 1) != a_smaller and median != 1:
            wrong.append(f"says {word}, but its median ratio {median:g} lies on the other side of 1")
    elif word != "indistinguishable":
        wrong.append(f"says {word}, but p = {p:.2g} >= {alpha:g}: the paired ratios do not separate the two")
    conditions = match.group("conditions")
    if "not given" in conditions:
        wrong.append("names no conditions (a verdict prints the machine's, or 'replayed')")
    elif word != "indistinguishable" and "oversubscribed" in conditions and "replayed" not in conditions:
        wrong.append("a wall-clock verdict from an oversubscribed run (more busy ranks than cores): replay the "
                     "measured costs instead, labelled replayed")
    return wrong


def check_outputs(cells: list[dict], name: str) -> list[Problem]:
    """The machine line, conditions, verdicts, comparisons and stderr of every code cell's outputs."""
    problems = []
    first = next((c for c in cells if c.get("cell_type") == "code" and c.get("outputs")), None)
    first_text = cell_text(first).lstrip() if first else ""
    clause = CONDITIONS.search(first_text.split("\n")[0])
    if not first_text.startswith("machine: ") or not clause or clause.group("busy") is None:
        problems.append(Problem(name, cells.index(first) if first else None, "machine",
                                "the first output is not the machine line with its conditions and the numbers they "
                                "follow from (print_machine())"))
    for i, cell in enumerate(cells):
        if cell.get("cell_type") != "code":
            continue
        for output in cell.get("outputs", []):
            if output.get("output_type") == "stream" and output.get("name") == "stderr":
                text = output_text(output).strip().split("\n")[0][:120]
                problems.append(Problem(name, i, "stderr", f"a committed output on stderr: {text!r}"))
        text = cell_text(cell)
        for m in CONDITIONS.finditer(text):
            wrong = check_conditions_clause(m)
            if wrong:
                problems.append(Problem(name, i, "conditions", wrong))
        for line in text.split("\n"):
            if "verdict:" in line:
                found = list(VERDICT.finditer(line))
                if len(found) != line.count("verdict:"):
                    problems.append(Problem(name, i, "verdict", f"a verdict line not in compare()'s form: "
                                                                f"{line.strip()[:160]!r}"))
                for m in found:
                    problems += [Problem(name, i, "verdict", f"{w}: {m.group(0)[:160]!r}") for w in check_verdict(m)]
                continue
            if COMPARISON_WORDS.search(line) and "predict" not in line:
                problems.append(Problem(name, i, "comparison", f"a comparison in words, not a computed verdict "
                                                               f"line: {line.strip()[:160]!r}"))
    return problems


def exercises(cells: list[dict]) -> dict[int, int]:
    """``{exercise number: index of the markdown cell that states it}``: the numbered items of every section whose
    heading says Exercises (to the next heading of the same or a higher level)."""
    found, level = {}, None
    for i, cell in enumerate(cells):
        if cell.get("cell_type") != "markdown":
            continue
        for line in _source(cell).split("\n"):
            heading = HEADING.match(line)
            if heading:
                depth = len(heading.group(1))
                if EXERCISE_HEADING.match(line):
                    level = depth
                elif level is not None and depth <= level:
                    level = None
                continue
            item = ITEM.match(line)
            if level is not None and item:
                found.setdefault(int(item.group(1)), i)
    return found


def check_exercises(cells: list[dict], name: str) -> list[Problem]:
    """Every exercise has a check: a call marked ``# N.`` in a later code cell whose outputs hold a check's answer."""
    problems = []
    checked: dict[int, int] = {}
    for i, cell in enumerate(cells):
        if cell.get("cell_type") != "code":
            continue
        numbers = [int(n) for n in CHECK_CALL.findall(_source(cell))]
        if numbers and not REPORT_LINE.search(cell_text(cell)):
            problems.append(Problem(name, i, "exercise", f"the checks of exercises {numbers} printed no answer "
                                                         f"(course.exercise_checks.report: right / not yet)"))
        for n in numbers:
            checked.setdefault(n, i)
    for n, where in sorted(exercises(cells).items()):
        if checked.get(n, -1) < where:
            problems.append(Problem(name, where, "exercise", f"exercise {n} has no check (a call marked '# {n}.' in "
                                                             f"a later code cell, printing right / not yet)"))
    return problems


def check_notebook(notebook: dict, name: str) -> list[Problem]:
    """Every rule of the module docstring but the deterministic cells' (which needs a fresh run:
    :func:`stale_values`) on one notebook (an ``nbformat`` or JSON dict)."""
    cells = notebook["cells"]
    return check_outputs(cells, name) + check_exercises(cells, name)


# ---- deterministic cells against a fresh run ---------------------------------------------------------

_TOKEN = re.compile(r"nan|inf|" + _NUMBER, re.IGNORECASE)


def _numbers(text: str) -> list[str]:
    return _TOKEN.findall(re.sub(r"\d{4}-\d{2}-\d{2} \d{2}:\d{2}", "", text))


def _last_digit(token: str) -> float:
    """The value of one unit in the last printed digit of ``token`` (``0.0130`` -> 1e-4, ``2.4e-07`` -> 1e-8)."""
    mantissa, _, exponent = token.lower().partition("e")
    decimals = len(mantissa.split(".")[1]) if "." in mantissa else 0
    return 10.0 ** (-decimals + (int(exponent) if exponent else 0))


def same_number(committed: str, fresh: str) -> bool:
    """Whether two printings of one deterministic quantity agree: whole numbers (counts) equal, others up to a unit
    in the last printed digit (or 0.1 %); quantities at the level of float rounding (below 1e-4 in size: a largest difference from a
    reference) may move by their rounding between CPU kernels, so they agree within a factor 10 — but a zero
    and a non-zero never do (the stale ``0.0`` of a code that now gives ``2.4e-07``)."""
    a, b = float(committed), float(fresh)
    if a == b or (math.isnan(a) and math.isnan(b)):
        return True
    if max(abs(a), abs(b)) < 1e-4:
        return a != 0 and b != 0 and (a > 0) == (b > 0) and max(abs(a), abs(b)) <= 10 * min(abs(a), abs(b))
    if math.isclose(a, b, rel_tol=1e-3):
        return True
    counts = not any(c in token.lower() for token in (committed, fresh) for c in ".e")
    return not counts and abs(a - b) <= _last_digit(committed) + _last_digit(fresh)


def stale_values(committed: dict, fresh: dict, name: str) -> list[Problem]:
    """The cells tagged ``deterministic`` whose committed outputs a fresh execution of the same cells does not
    repeat: a different count of numbers, or a number that is not :func:`same_number` (a cell committed without
    outputs is left to ``tests/instructor/test_notebook_outputs.py``, which asks for a run)."""
    problems = []
    for i, (old, new) in enumerate(zip(committed["cells"], fresh["cells"])):
        if DETERMINISTIC not in old.get("metadata", {}).get("tags", []) or old.get("cell_type") != "code":
            continue
        if not old.get("outputs"):  # never run: tests/instructor/test_notebook_outputs.py asks for a run
            continue
        before, after = _numbers(cell_text(old)), _numbers(cell_text(new))
        if len(before) != len(after):
            problems.append(Problem(name, i, "stale", f"the committed outputs hold {len(before)} numbers, a fresh "
                                                      f"run {len(after)}: run the notebook again"))
            continue
        for a, b in zip(before, after):
            if not same_number(a, b):
                problems.append(Problem(name, i, "stale", f"committed {a}, a fresh run gives {b}: run the notebook "
                                                          f"again (python project/tools/execute_notebooks.py "
                                                          f"{name[:2]})"))
    return problems


# ---- the command line ----------------------------------------------------------------------------------

def main(argv=None) -> int:
    from project.tools.execute_notebooks import course_notebooks

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("prefixes", nargs="*", help="notebook name prefixes (e.g. 04 07); default: all")
    parser.add_argument("--recompute", action="store_true",
                        help="also execute each notebook in quick mode and compare its deterministic cells")
    args = parser.parse_args(argv)
    paths = course_notebooks(args.prefixes)
    if not paths:
        parser.error(f"no notebook starts with {' or '.join(args.prefixes)}")
    problems = []
    for path in paths:
        notebook = json.loads(path.read_text(encoding="utf-8"))
        problems += check_notebook(notebook, path.name)
        if args.recompute:
            import os

            from course.notebook_run import QUICK_ENV, execute

            os.environ[QUICK_ENV] = "1"
            problems += stale_values(notebook, execute(path), path.name)
    for problem in problems:
        print(problem)
    print(f"{len(paths)} notebook(s), {len(problems)} problem(s)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
