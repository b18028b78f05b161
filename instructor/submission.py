"""What a submission is, and how the grader takes it: the code between the markers, nothing else.

A student works in the release, where every assignment block is a stub
``raise NotImplementedError("Assignment 5.1.2: ...")`` between its two marker lines (BEGIN and
END of ``ASSIGN5_1_2``), and replaces the stub by a solution **between the same two lines**. A submission is the
student's copy of the course (or of the part packages): the grader reads, for every file of
the instructor's tree that holds blocks of a key, the file at the same relative path in the
submission, and takes from it the text between the key's markers — block by block, in order.
Everything else in the submission (tests, ``conftest.py``, ``pyproject.toml``, the grader,
code outside the blocks, extra files) is ignored: those come from the instructor's tree.

:func:`grading_tree` writes, for one key, a fresh copy of the instructor's tree in which that key's
blocks hold the submission's code, the keys it depends on (``depends_on`` in
``instructor/keys.py``, followed to the end) keep their reference solution — its tests run
that code — and **every other key's block is its stub**: no reference solution the key does not
need is within its reach. A key is graded on its own code alone (a wrong 5.1.2 does not cost
the 5.1.3 marks, and code in one key's block never runs while another key is graded).
Instructor-only files (the release and integrity tools, their tests) stay out of the copy.

Before anything runs, every submitted block of the key is checked against the block policy
(:mod:`instructor.policy`): its rules, and that the code stays inside the block's function.
A block that breaks a rule raises :class:`PolicyError`, which names the rule, file and line.
"""
from __future__ import annotations

import ast
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from instructor.blocks import course_files, find_blocks, is_instructor_only, marked_spans, stub_notebook, stub_source
from instructor.keys import KEYS, requirements
from instructor.policy import Violation, check_block, check_scope, course_parts, scaffolding_bindings


class SubmissionError(ValueError):
    """A key's blocks cannot be taken from the submission (missing file or block, unparsable code)."""


class PolicyError(SubmissionError):
    """A submitted block breaks the block policy; ``violations`` are ``(file, Violation)`` pairs."""

    def __init__(self, violations: list[tuple[str, Violation]]):
        self.violations = violations
        super().__init__("\n".join(v.describe(name) for name, v in violations))


@dataclass
class Spliced:
    """A grading tree for one key: where the submission's lines of that key ended up."""

    root: Path
    key: str
    # relative file path -> [(first line, last line)] of the submission's code (1-based, inclusive)
    student_lines: dict[str, list[tuple[int, int]]] = field(default_factory=dict)

    def is_student_line(self, path: str | Path, line: int) -> bool:
        """Whether ``path:line`` (absolute, or relative to the tree) is a line of the submission's code."""
        path = Path(path)
        try:
            rel = str(path.resolve().relative_to(self.root.resolve())) if path.is_absolute() else str(path)
        except ValueError:
            return False
        return any(lo <= line <= hi for lo, hi in self.student_lines.get(rel, []))


def marker_files(root: Path, key: str) -> list[str]:
    """The files of the tree ``root`` that hold blocks of ``key`` (relative paths, sorted)."""
    marker = KEYS[key].marker
    found = []
    for name in course_files(root):
        if name.endswith(".py") and not is_instructor_only(name) and any(
                block.marker == marker for block in marked_spans((root / name).read_text(encoding="utf-8").split("\n"))):
            found.append(name)
    return sorted(found)


def submission_root(submission: Path, instructor_root: Path) -> Path:
    """The folder of ``submission`` that plays the repository root: ``submission`` itself, or the
    one sub-folder below it that holds more of the course's block files (an uploaded folder)."""
    wanted = {name for key in KEYS for name in marker_files(instructor_root, key)}
    candidates = [submission] + sorted(p for p in submission.iterdir() if p.is_dir() and not p.name.startswith("."))
    return max(candidates, key=lambda c: (sum((c / name).is_file() for name in wanted), c == submission))


def _blocks_of(lines: list[str], marker: str, where: str):
    try:
        blocks = find_blocks(lines, where)
    except ValueError as exc:  # ReleaseError: unpaired or malformed markers
        raise SubmissionError(str(exc)) from None
    return [b for b in blocks if b.marker == marker]


def grading_tree(instructor_root: Path, submission: Path, key: str, out: Path, enforce_policy: bool = True) -> Spliced:
    """Copy the instructor's course files to ``out``, stub every block of the keys ``key`` does not
    depend on, and put the submission's ``key`` blocks in.

    Raises:
        SubmissionError: a file of the key is missing from the submission, it has a different
            number of the key's blocks, or the spliced file does not parse.
        PolicyError: a submitted block breaks the block policy (unless ``enforce_policy`` is False,
            which only the grader's own tests use, to try the walls behind the policy).
    """
    marker = KEYS[key].marker
    stubbed = {KEYS[k].marker for k in KEYS if k != key and k not in requirements(key)}
    if out.exists():
        shutil.rmtree(out)
    for name in course_files(instructor_root):
        if is_instructor_only(name):
            continue
        target = out / name
        target.parent.mkdir(parents=True, exist_ok=True)
        if name.endswith(".py"):
            target.write_text(stub_source((instructor_root / name).read_text(encoding="utf-8"), name,
                                          only=stubbed)[0], encoding="utf-8")
        elif name.endswith(".ipynb"):
            target.write_text(stub_notebook((instructor_root / name).read_text(encoding="utf-8"), name,
                                            only=stubbed)[0], encoding="utf-8")
        else:
            shutil.copy2(instructor_root / name, target)
    spliced = Spliced(out, key)
    violations: list[tuple[str, Violation]] = []
    parts = course_parts(instructor_root)
    for name in marker_files(instructor_root, key):
        theirs = submission / name
        if not theirs.is_file():
            raise SubmissionError(f"{name} is missing from the submission (it holds your code for {KEYS[key].number})")
        original = (instructor_root / name).read_text(encoding="utf-8")
        mine_lines = (out / name).read_text(encoding="utf-8").split("\n")
        their_lines = theirs.read_text(encoding="utf-8", errors="replace").split("\n")
        mine, theirs_blocks = _blocks_of(mine_lines, marker, name), _blocks_of(their_lines, marker, f"submission {name}")
        if len(mine) != len(theirs_blocks):
            raise SubmissionError(f"{name}: the submission has {len(theirs_blocks)} block(s) of {marker}, the course "
                                  f"has {len(mine)}; keep the BEGIN and END lines of {marker} as released")
        for block, their in zip(reversed(mine), reversed(theirs_blocks)):  # bottom-up: earlier line numbers hold
            mine_lines[block.begin + 1:block.end] = their_lines[their.begin + 1:their.end]
        # line ranges of the student's code in the spliced file, top-down
        ranges, offset = [], 0
        for block, their in zip(mine, theirs_blocks):
            n = their.end - their.begin - 1
            first = block.begin + 1 + offset + 1  # 1-based line after BEGIN
            ranges.append((first, first + n - 1))
            offset += n - (block.end - block.begin - 1)
        text = "\n".join(mine_lines)
        try:
            ast.parse(text, filename=name)
        except SyntaxError as exc:
            raise SubmissionError(f"{name}: your code for {KEYS[key].number} does not parse: {exc.msg} "
                                  f"(line {exc.lineno})") from None
        if enforce_policy:
            bindings = scaffolding_bindings(original)
            for (lo, hi), block in zip(ranges, mine):
                code = "\n".join(mine_lines[lo - 1:hi])
                found = check_block(code, bindings, lo, parts) if hi >= lo else []
                found += check_scope(text, lo, hi, len(block.indent.expandtabs()))
                violations += [(name, v) for v in found]
        (out / name).write_text(text, encoding="utf-8")
        spliced.student_lines[name] = [r for r in ranges if r[1] >= r[0]]
    if violations:
        raise PolicyError(violations)
    return spliced


def submitted_code(submission: Path, instructor_root: Path) -> str:
    """The text of every block of every key in ``submission`` (the student's own code, all keys)."""
    chunks = []
    for key in KEYS:
        for name in marker_files(instructor_root, key):
            path = submission / name
            if not path.is_file():
                continue
            lines = path.read_text(encoding="utf-8", errors="replace").split("\n")
            try:
                blocks = _blocks_of(lines, KEYS[key].marker, name)
            except SubmissionError:
                continue
            chunks += ["\n".join(lines[b.begin + 1:b.end]) for b in blocks]
    return "\n".join(chunks)
