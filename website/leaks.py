"""No reference solution on the site: every built file checked against every reference block.

The rule (what counts as publishing a reference line):

* A **secret line** is a line strictly inside a reference block (``instructor.blocks.scan``, found with the
  release's parser), normalised — leading and trailing white space removed, every run of white
  space made one space — that has at least :data:`MIN_CHARS` characters and that the student
  release does not show anyway: it is not, normalised, a line of the course's files outside the
  blocks, nor the release's stub of a block. (Short lines such as ``return x``, ``else:`` or a lone
  bracket say nothing of a solution and occur in any prose; a line the release shows is public.)
* The **text of a built file** is, for HTML, its text as a reader sees it (tags dropped, so
  highlighted code reads as written) and its markup with entities decoded; for notebooks and other
  JSON, every string in it; for other text files, the file itself — white space normalised the same
  way. Binary files, and ``_static/`` (the theme's and MathJax's files, copied from their
  packages), are not read.
* A **leak** is a secret line found in the text of a built file, not preceded or followed by a
  letter, digit or underscore (so ``p.grad = avg`` is not found inside ``p.grad = avg_norm``).
"""
from __future__ import annotations

import html
import json
import re
from dataclasses import dataclass
from pathlib import Path

from bs4 import BeautifulSoup

from instructor.blocks import scan, stub_message
from instructor.leaks import MIN_LENGTH as MIN_CHARS
from instructor.leaks import normalise

_WORD = re.compile(r"\w")


@dataclass(frozen=True)
class Secret:
    line: str      # normalised
    marker: str
    file: str


@dataclass(frozen=True)
class Leak:
    page: str      # path relative to the built site
    secret: Secret

    def __str__(self) -> str:
        return (f"{self.page} shows a line of the reference solution {self.secret.marker} "
                f"({self.secret.file}): {self.secret.line!r}")


def secret_lines(root: Path) -> list[Secret]:
    """The secret lines of the course tree at ``root`` (see the module's docstring), one per line text."""
    blocks, outside = scan(root)
    public = {normalise(line) for line in outside}
    public |= {f"raise NotImplementedError({stub_message(b.marker, b.function)!r})" for b in blocks}
    secrets: dict[str, Secret] = {}
    for block in blocks:
        for line in block.body:
            line = normalise(line)
            if len(line) >= MIN_CHARS and line not in public and line not in secrets:
                secrets[line] = Secret(line, block.marker, block.file)
    return list(secrets.values())


def _strings(value) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        value = list(value.values())
    if isinstance(value, list):
        return [s for item in value for s in _strings(item)]
    return []


def readable_text(path: Path) -> str | None:
    """The text of a built file as the leak check reads it (None for a binary file)."""
    try:
        raw = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        return None
    if path.suffix in (".html", ".htm"):
        text = BeautifulSoup(raw, "html.parser").get_text() + "\n" + html.unescape(raw)
    elif raw.lstrip().startswith(("{", "[")):
        try:
            text = "\n".join(_strings(json.loads(raw)))
        except json.JSONDecodeError:
            text = raw
    else:
        text = raw
    return normalise(text)


def find_leaks(site: Path, secrets: list[Secret]) -> list[Leak]:
    """Every secret line shown by a file of the built site ``site`` (its ``_static/`` aside)."""
    leaks = []
    for path in sorted(Path(site).rglob("*")):
        relative = path.relative_to(site)
        if not path.is_file() or relative.parts[0] == "_static":
            continue
        text = readable_text(path)
        if text is None:
            continue
        for secret in secrets:
            start = text.find(secret.line)
            while start >= 0:
                end = start + len(secret.line)
                before = text[start - 1] if start else " "
                after = text[end] if end < len(text) else " "
                if not (_WORD.match(before) and _WORD.match(secret.line[0])) and \
                        not (_WORD.match(after) and _WORD.match(secret.line[-1])):
                    leaks.append(Leak(relative.as_posix(), secret))
                    break
                start = text.find(secret.line, start + 1)
    return leaks
