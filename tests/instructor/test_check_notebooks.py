"""The course's notebook checker (project/tools/check_notebooks.py): every committed notebook passes it, and it fails on
each planted defect — a verdict its own ratios contradict, a quiet label beside a busy core, a stale deterministic
value, an exercise without a check, stderr, a comparison typed in words, a timing verdict from an oversubscribed
run. The committed notebooks fail here until `python project/tools/execute_notebooks.py` has run their current cells
(as tests/instructor/test_notebook_outputs.py does); the planted ones are built in memory (no kernel starts)."""
from __future__ import annotations

import json
from pathlib import Path

import nbformat
import pytest

from course import benchmarking
from project.tools.check_notebooks import check_notebook, same_number, stale_values
from project.tools.execute_notebooks import course_notebooks

NOTEBOOKS = course_notebooks()


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name[:2])
def test_committed_notebooks_pass_the_checker(path: Path):
    problems = check_notebook(json.loads(path.read_text(encoding="utf-8")), path.name)
    assert not problems, "\n".join(map(str, problems)) + (
        f"\n(fix the cells, then `python project/tools/execute_notebooks.py {path.name[:2]}`)")


# ---- planted defects --------------------------------------------------------------------------------------

QUIET = {"cores": 2, "usable_cores": 2, "cpu_model": "a CPU", "device": "cpu", "torch": "2.x", "timer": "host-clock",
         "busy_ranks": 2, "ranks_per_core": 1.0, "others_running": 0.0, "others_running_after": 0.2,
         "load_average": [0.1, 0.1, 0.1]}
QUIET["conditions"] = benchmarking.conditions(QUIET)
ROUNDS = [1.0, 1.3, 0.9, 1.6, 1.1, 1.4, 1.0]
FASTER = benchmarking.compare([0.7 * t for t in ROUNDS], ROUNDS, ("zero3", "zero0"), conditions=QUIET)["sentence"]
SAME = benchmarking.compare([1.0, 3.0, 1.0, 3.0, 1.0, 3.0, 2.5], [2.0] * 7, ("a", "b"), conditions=QUIET)["sentence"]


def stream(text: str, name: str = "stdout"):
    return nbformat.v4.new_output("stream", name=name, text=text)


def notebook(*extra_cells) -> dict:
    """A notebook that passes: the machine line first, a verdict, an exercise with its check."""
    machine = f"machine: {benchmarking.describe(QUIET)}; 2030-01-01 00:00 UTC (measured when this cell ran)\n"
    cells = [nbformat.v4.new_code_cell("print_machine()", outputs=[stream(machine)]),
             nbformat.v4.new_code_cell("print(v['sentence'])", outputs=[stream(FASTER + "\n" + SAME + "\n")]),
             nbformat.v4.new_markdown_cell("## Exercises\n\n1. **Bubbles.** p = 4, m = 8: the bubble?\n"),
             nbformat.v4.new_code_cell("check_bubble(None)  # 1. a fraction",
                                       outputs=[stream("bubble: not yet (None) — hint: (p-1)/(m+p-1)\n")]),
             *extra_cells]
    return nbformat.v4.new_notebook(cells=cells)


def rules(nb) -> list[str]:
    return sorted({p.rule for p in check_notebook(nb, "planted.ipynb")})


def test_a_clean_notebook_passes():
    assert check_notebook(notebook(), "clean.ipynb") == []
    assert "7 of 7 repeats below 1" in FASTER and "are indistinguishable" in SAME


def test_a_verdict_its_own_ratios_contradict_fails():
    nb = notebook()
    contradicted = FASTER.replace("zero3 is faster than zero0, ", "zero3 is slower than zero0, ")
    nb.cells[1].outputs = [stream(contradicted + "\n")]
    assert rules(nb) == ["verdict"]
    # indistinguishable where 7 of 7 paired ratios lie below 1 (notebook 05's ZeRO-3 against ZeRO-0)
    nb.cells[1].outputs = [stream(FASTER.replace("zero3 is faster than zero0, 1.43x", "zero3 and zero0 are "
                                                 "indistinguishable") + "\n")]
    assert rules(nb) == ["verdict"]
    # a p that its counts do not give, and a verdict with no conditions
    nb.cells[1].outputs = [stream(SAME.replace("p = 1 >=", "p = 0.01 <") + "\n")]
    assert rules(nb) == ["verdict"]
    nb.cells[1].outputs = [stream(benchmarking.compare(ROUNDS, ROUNDS, ("a", "b"))["sentence"] + "\n")]
    assert rules(nb) == ["verdict"]


def test_a_loss_verdict_says_lower_or_higher_and_the_checker_holds_it_to_its_ratios():
    """A loss is compared in its own words (course.benchmarking.compare's ``words``): DiLoCo's loss above DDP's in
    all 7 paired seeds is "higher", and the same line saying "lower" fails."""
    loss = benchmarking.compare([1.1 * t for t in ROUNDS], ROUNDS, ("diloco", "ddp"), unit="nats",
                                words=("lower", "higher"), conditions="the same tokens per seed")["sentence"]
    assert "diloco is higher than ddp, 1.1x" in loss
    nb = notebook()
    nb.cells[1].outputs = [stream(loss + "\n")]
    assert check_notebook(nb, "loss.ipynb") == []
    nb.cells[1].outputs = [stream(loss.replace("diloco is higher than", "diloco is lower than") + "\n")]
    assert rules(nb) == ["verdict"]


def test_a_timing_verdict_from_an_oversubscribed_run_fails_unless_replayed():
    nb = notebook()
    over = dict(QUIET, busy_ranks=8)
    over["conditions"] = benchmarking.conditions(over)
    measured = benchmarking.compare([0.7 * t for t in ROUNDS], ROUNDS, ("4·2·1", "8·1·1"), conditions=over)
    nb.cells[1].outputs = [stream(measured["sentence"] + "\n")]
    assert rules(nb) == ["verdict"]
    replayed = benchmarking.compare([0.7 * t for t in ROUNDS], ROUNDS, ("4·2·1", "8·1·1"),
                                    conditions="replayed (8 devices of one core each)")
    nb.cells[1].outputs = [stream(replayed["sentence"] + "\n")]
    assert rules(nb) == []


def test_a_quiet_label_beside_a_busy_core_fails():
    nb = notebook()
    busy = dict(QUIET, others_running=1.0)  # notebook 03: 1.0 other runnable thread beside 2 ranks on 2 cores
    busy["conditions"] = benchmarking.conditions(busy)
    line = f"machine: {benchmarking.describe(busy)}\n"
    assert "conditions: loaded" in line
    nb.cells.append(nbformat.v4.new_code_cell("", outputs=[stream(line.replace("conditions: loaded",
                                                                               "conditions: quiet"))]))
    assert rules(nb) == ["conditions"]
    nb.cells[-1].outputs = [stream(line)]
    assert rules(nb) == []
    # the first output must be the machine line with its numbers
    nb.cells[0].outputs = [stream("machine: 2 cores; conditions: quiet\n")]
    assert rules(nb) == ["machine"]


def test_an_exercise_without_a_check_fails():
    nb = notebook()
    nb.cells[2].source += "2. (Open.) Rerun section 6 with t_backward = 2 t_forward: the bubble?\n"
    assert rules(nb) == ["exercise"]
    nb.cells[3].source += "\ncheck_backward_bubble(None)  # 2."
    assert rules(nb) == []
    nb.cells[3].outputs = [stream("nothing printed by a check\n")]
    assert rules(nb) == ["exercise"]


def test_stderr_and_comparisons_in_words_fail():
    nb = notebook(nbformat.v4.new_code_cell("", outputs=[stream("p=2 balance=auto: 1 s\n", "stderr")]))
    assert rules(nb) == ["stderr"]
    nb = notebook(nbformat.v4.new_code_cell("", outputs=[stream(
        "every world-size-2 repeat was slower than every world-size-1 repeat\n")]))
    assert rules(nb) == ["comparison"]
    nb = notebook(nbformat.v4.new_code_cell("", outputs=[stream(
        "the model predicts the ring faster than recursive doubling above 1.3 MiB\n")]))
    assert rules(nb) == [], "a model's prediction is not a measured comparison"


def test_a_stale_deterministic_value_fails():
    """Notebook 07 [18] committed max |ours - torch's ring kernel| 0.0; the same code now gives 2.4e-07."""
    def with_cell(text):
        nb = notebook(nbformat.v4.new_code_cell("ring['torch']", outputs=[
            nbformat.v4.new_output("execute_result", data={"text/plain": text}, execution_count=1)]))
        nb.cells[-1].metadata["tags"] = ["deterministic"]
        return nb

    committed = with_cell("max |ours - torch's ring kernel|    0.0")
    problems = stale_values(committed, with_cell("max |ours - torch's ring kernel|    2.384e-07"), "07.ipynb")
    assert [p.rule for p in problems] == ["stale"] and problems[0].cell == 4
    assert stale_values(with_cell("max diff 2.4e-07, 13 tiles"), with_cell("max diff 1.8e-07, 13 tiles"), "x") == []
    assert [p.rule for p in stale_values(with_cell("13 tiles"), with_cell("14 tiles"), "x")] == ["stale"]
    untagged = notebook(nbformat.v4.new_code_cell("", outputs=[stream("0.0\n")]))
    assert stale_values(untagged, notebook(nbformat.v4.new_code_cell("", outputs=[stream("2.4e-07\n")])), "x") == []


@pytest.mark.parametrize("committed,fresh,same", [
    ("0.273", "0.273", True), ("0.2727", "0.2728", True), ("16.86", "16.87", True), ("12.8", "13.1", False),
    ("3.6e-07", "2.4e-07", True), ("0.0", "2.4e-07", False), ("0.0e+00", "0.0", True), ("-1.0", "1.0", False),
    ("124439808", "124439808", True), ("89", "124", False)])
def test_numbers_agree_up_to_their_printing_and_rounding(committed, fresh, same):
    assert same_number(committed, fresh) is same
