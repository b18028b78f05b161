"""Markdown handling for the site: README sections, escaping, and relative links moved to staged pages.

The site's pages are staged copies of the course's files (``website/stage.py``); a relative link
written for the repository (``[the grader](docs/grading.md)``, ``![plot](../results/x.png)``) must
still lead somewhere from the staged copy. :func:`rewrite_links` resolves each link against the
file it was written in and

* to a file that is a page of the site: points it at that page;
* to an image in the repository: keeps it and asks for the image to be copied beside the page;
* to any other file or folder of the repository (source code is not published): keeps the
  link text and shows the path as code;
* to nothing: leaves it, so that Sphinx reports the broken link and the build fails.
"""
from __future__ import annotations

import posixpath
import re
from dataclasses import dataclass, field
from pathlib import Path

IMAGE_SUFFIXES = {".png", ".jpg", ".jpeg", ".gif", ".svg", ".webp"}
_FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})")
_CODE_SPAN = re.compile(r"(`+)(?:.|\n)*?(?<!`)\1(?!`)")
_LINK = re.compile(r"(!?)\[((?:[^\[\]]|\[[^\]]*\])*)\]\(\s*<?([^)\s>]+)>?((?:\s+\"[^\"]*\")?)\s*\)")
_SCHEME = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")
_ESCAPED = re.compile(r"([\\*_\[\]<>{}|#$~])")


@dataclass
class Section:
    heading: str   # the text of the "## " line, without the hashes
    body: str      # the lines after it, up to the next "## " line

    @property
    def slug(self) -> str:
        """A file name for the section: lower case, words joined by dashes (``running-on-gpus``)."""
        return re.sub(r"[^a-z0-9]+", "-", self.heading.lower()).strip("-") or "section"


def split_sections(text: str) -> tuple[str, list[Section]]:
    """``text`` cut at its level-2 headings (outside code blocks): the preamble and the sections."""
    preamble, sections, fence = [], [], None
    for line in text.split("\n"):
        opening = _FENCE.match(line)
        if opening and fence is None:
            fence = opening.group(1)[0]
        elif opening and line.strip().startswith(fence * 3):
            fence = None
        if fence is None and line.startswith("## "):
            sections.append(Section(line[3:].strip(), ""))
        elif sections:
            sections[-1].body += line + "\n"
        else:
            preamble.append(line)
    return "\n".join(preamble), sections


def escape(text: str) -> str:
    """``text`` (e.g. a docstring) as literal Markdown: markup characters escaped outside code spans,
    lines joined into one (it goes into a table cell)."""
    text = " ".join(text.split())
    out, last = [], 0
    for span in _CODE_SPAN.finditer(text):
        out.append(_ESCAPED.sub(r"\\\1", text[last:span.start()]))
        out.append(span.group(0).replace("|", "\\|"))
        last = span.end()
    out.append(_ESCAPED.sub(r"\\\1", text[last:]))
    return "".join(out)


def _outside_code(text: str, change) -> str:
    """``text`` with ``change(prose, code_spans)`` applied to every stretch outside fenced code blocks;
    ``code_spans`` are the (start, end) offsets of the stretch's inline code spans."""
    pieces, prose, fence = [], [], None

    def flush():
        if prose:
            joined = "".join(prose)
            pieces.append(change(joined, [m.span() for m in _CODE_SPAN.finditer(joined)]))
            prose.clear()

    for line in text.splitlines(keepends=True):
        opening = _FENCE.match(line)
        if fence is None and opening:
            flush()
            fence = opening.group(1)
            pieces.append(line)
        elif fence is not None:
            pieces.append(line)
            if line.strip().startswith(fence[0] * len(fence)) and not line.strip().strip(fence[0]):
                fence = None
        else:
            prose.append(line)
    flush()
    return "".join(pieces)


@dataclass
class LinkMap:
    """Where the repository's files are on the site.

    ``pages`` maps a repository path (``docs/grading.md``) to its staged page path; ``anchors``
    maps (repository path, anchor) to a staged page path when that section became a page of its
    own (a README section). Images to copy are collected in ``images``.
    """
    root: Path
    pages: dict[str, str]
    anchors: dict[tuple[str, str], str] = field(default_factory=dict)
    images: set[str] = field(default_factory=set)

    def rewrite(self, text: str, written_in: str, staged_as: str) -> str:
        """``text`` of the repository file ``written_in``, its relative links made right for its
        staged copy at ``staged_as`` (both paths relative to the repository / site root)."""
        here, there = posixpath.dirname(written_in), posixpath.dirname(staged_as)

        def one(match: re.Match) -> str:
            bang, label, target, title = match.groups()
            if _SCHEME.match(target) or target.startswith(("#", "/")):
                return match.group(0)
            path, _, anchor = target.partition("#")
            resolved = posixpath.normpath(posixpath.join(here, path))
            if resolved in self.pages or (resolved, anchor) in self.anchors:
                page = self.anchors.get((resolved, anchor)) or self.pages[resolved]
                new = posixpath.relpath(page, there or ".")
                if anchor and (resolved, anchor) not in self.anchors:
                    new += "#" + anchor
                return f"{bang}[{label}]({new}{title})"
            if resolved.startswith("..") or not (self.root / resolved).exists():
                return match.group(0)  # broken: Sphinx names it and the build fails
            if bang and Path(resolved).suffix.lower() in IMAGE_SUFFIXES:
                self.images.add(resolved)
                return f"{bang}[{label}]({posixpath.relpath(resolved, there or '.')}{title})"
            shown = f"`{resolved}`"
            return label if resolved in label else f"{label} ({shown})"

        def links_outside_code(prose: str, spans: list[tuple[int, int]]) -> str:
            return _LINK.sub(lambda m: m.group(0) if any(a <= m.start() < b for a, b in spans) else one(m), prose)

        return _outside_code(text, links_outside_code)
