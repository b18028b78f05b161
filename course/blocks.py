"""Assignment blocks: the one scanner of the BEGIN and END marker lines.

A block is the code between a key's BEGIN and END marker comment lines (``ASSIGN5_x_y``; small,
no nesting, inside a function; docs/architecture.md, "Assignment keys"). This module is the only
place that reads the markers. It sits in the shared library because :mod:`course.assignments`
(which tells a notebook cell whether a block is still a stub) needs it and the library imports no
instructor tool; :mod:`instructor.blocks` builds the release's checks and stubs on it.

* :func:`find_blocks` — strict: every marker paired and well formed, else :class:`ReleaseError`
  naming file and line (the release, the grader and the site use it).
* :func:`marked_spans` — lenient: the blocks whose BEGIN and END lines pair, anything else passed
  over (for reading a student's tree or a traceback's file, where a broken marker must not raise).
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Callable

_B, _E = "# " + "BEGIN", "# " + "END"  # spelled apart: this file holds no marker of its own
BEGIN = re.compile(rf"^(\s*){_B} (ASSIGN\w+)\s*$")
END = re.compile(rf"^(\s*){_E} (ASSIGN\w+)\s*$")
ANY_MARKER = re.compile(r"#\s*(BEGIN|END)\s+ASSIGN")


class ReleaseError(ValueError):
    """A marker problem; the message names the file and line."""


@dataclass
class Block:
    marker: str
    begin: int  # 0-based line index of the BEGIN line
    end: int    # 0-based line index of the END line
    indent: str


def find_blocks(lines: list[str], where: str, known: Callable[[str], bool] | None = None) -> list[Block]:
    """The marker blocks of ``lines`` (no trailing newlines), checked for pairing (and, with ``known``, that
    ``known(marker)`` holds for every BEGIN's marker).

    Raises:
        ReleaseError: a BEGIN inside a block, an unknown key, an END without BEGIN or of another key,
            a malformed marker line, a BEGIN without END — naming ``where`` and the 1-based line.
    """
    blocks, open_block = [], None
    for i, line in enumerate(lines):
        b, e = BEGIN.match(line), END.match(line)
        if b:
            if open_block:
                raise ReleaseError(f"{where}:{i + 1}: BEGIN {b.group(2)} inside the block opened at line "
                                   f"{open_block.begin + 1} (blocks do not nest)")
            if known is not None and not known(b.group(2)):
                raise ReleaseError(f"{where}:{i + 1}: unknown assignment key {b.group(2)} "
                                   "(declare it in instructor/keys.py)")
            open_block = Block(b.group(2), i, -1, b.group(1))
        elif e:
            if not open_block:
                raise ReleaseError(f"{where}:{i + 1}: END {e.group(2)} without a BEGIN")
            if e.group(2) != open_block.marker:
                raise ReleaseError(f"{where}:{i + 1}: END {e.group(2)} closes BEGIN {open_block.marker} "
                                   f"of line {open_block.begin + 1}")
            open_block.end = i
            blocks.append(open_block)
            open_block = None
        elif ANY_MARKER.search(line):
            raise ReleaseError(f"{where}:{i + 1}: malformed marker line {line.strip()!r} "
                               "(a marker line holds '#', BEGIN or END, and the key such as ASSIGN5_1_2, and nothing else)")
    if open_block:
        raise ReleaseError(f"{where}:{open_block.begin + 1}: BEGIN {open_block.marker} has no END")
    return blocks


def marked_spans(lines: list[str]) -> list[Block]:
    """The blocks of ``lines`` whose BEGIN is followed by an END of the same key, without raising: an END
    without an open BEGIN, or of another key, is passed over, and a later BEGIN replaces an open one."""
    blocks, open_block = [], None
    for i, line in enumerate(lines):
        if b := BEGIN.match(line):
            open_block = Block(b.group(2), i, -1, b.group(1))
        elif (e := END.match(line)) and open_block is not None and e.group(2) == open_block.marker:
            open_block.end = i
            blocks.append(open_block)
            open_block = None
    return blocks


def may_have_blocks(text: str) -> bool:
    """Whether ``text`` holds the start of a BEGIN marker at all (a quick test before reading the blocks)."""
    return _B + " ASSIGN" in text
