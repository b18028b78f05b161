"""Feedback that quotes reference code is withheld: the grader's last wall.

A key's grading copy holds the reference solutions of the keys it depends on (its tests run
them), and a block's exception message goes back to the student. :class:`ReferenceLines` holds
every line of every reference block that is not public anyway (not in the student release, not
in the student's own blocks) and tells whether a text contains one of them — as written, or
encoded the ways a program that read the files would pass them on:

* as written, in a ``repr`` (escaped ``\\n``, ``\\'``), reversed, or rot13;
* base64 (standard or URL-safe), base32, base85/ascii85 or hex runs, each also after zlib, gzip,
  bz2 or lzma decompression, and reversed;
* a run of character codes (``[114, 101, 116, ...]``).

How far it goes, and why no further: the block policy (:mod:`instructor.policy`) is what keeps a
block from reading files, the interpreter's frames or other modules in the first place, and
the copy holds no reference the key does not need. This check catches what still comes out by
the obvious routes; a cipher of one's own (xor with a key, a shuffled alphabet) is not
detected, and every withheld message is listed for the instructor to review.
Lines shorter than :data:`MIN_LENGTH` characters (``return x``, ``else:``) are too common to
be told from the student's own code and are not looked for.
"""
from __future__ import annotations

import base64
import binascii
import bz2
import codecs
import json
import lzma
import re
import zlib
from pathlib import Path
from typing import Iterator

from instructor.blocks import scan

MIN_LENGTH = 12
_B64 = re.compile(r"[A-Za-z0-9+/_=-]{16,}")
_B32 = re.compile(r"[A-Z2-7=]{16,}")
_B85 = re.compile(r"[0-9A-Za-z!#$%&()*+\-;<=>?@^_`{|}~]{20,}")
_A85 = re.compile(r"<~[!-u\s]{20,}~>|[!-u]{20,}")
_BASES = (("base64", _B64, base64.b64decode, 4), ("base64", _B64, base64.urlsafe_b64decode, 4),
          ("base32", _B32, base64.b32decode, 8), ("base85", _B85, base64.b85decode, 5),
          ("ascii85", _A85, lambda run: base64.a85decode(run, adobe=run.startswith("<~")), 5))
_HEX = re.compile(r"(?:[0-9a-fA-F]{2}[\s:]?){8,}")
_CODES = re.compile(r"(?:\b\d{2,3}\b[\s,;]+){8,}\b\d{2,3}\b")
FEEDBACK_CHARS = 20_000  # characters of one message shown to the student, and looked at here


def normalise(text: str) -> str:
    """Whitespace runs as one space, ends stripped: how lines are compared."""
    return " ".join(text.split())


def _unpacked(data: bytes) -> Iterator[bytes]:
    """``data``, and what it decompresses to as zlib, raw deflate, gzip, bz2 or lzma — as far as it goes
    (a stream cut short by the message's length limit still gives its beginning)."""
    yield data
    for make in (lambda: zlib.decompressobj(), lambda: zlib.decompressobj(-15), lambda: zlib.decompressobj(31),
                 bz2.BZ2Decompressor, lzma.LZMADecompressor):
        try:
            out = make().decompress(data)
        except Exception:  # noqa: BLE001 - not that format
            continue
        if out:
            yield out


def _as_text(data: bytes) -> Iterator[str]:
    for d in _unpacked(data):
        text = d.decode("utf-8", errors="ignore")
        if text:
            yield text
            yield text[::-1]


def decodings(text: str) -> Iterator[tuple[str, str]]:
    """``(how, decoded text)`` for every reading of ``text`` that :class:`ReferenceLines` looks at."""
    text = text[:FEEDBACK_CHARS]
    yield "as written", text
    yield "reversed", text[::-1]
    yield "rot13", codecs.decode(text, "rot13")
    try:
        unescaped = codecs.decode(text.encode("latin-1", errors="backslashreplace"), "unicode_escape")
    except Exception:  # noqa: BLE001 - not an escaped string
        unescaped = text
    if unescaped != text:
        yield "escaped", unescaped
        yield "escaped, reversed", unescaped[::-1]
    sources = {text, unescaped, text[::-1]}
    for source in sources:
        for name, pattern, decode, group in _BASES:
            for run in pattern.findall(source):
                # as it is (padding added), and cut to whole groups: a run cut short by the length limit
                for candidate in {run + "=" * (-len(run) % group) if group in (4, 8) else run,
                                  run.rstrip("=")[:len(run.rstrip("=")) // group * group]}:
                    try:
                        data = decode(candidate)
                    except (binascii.Error, ValueError):
                        continue
                    for decoded in _as_text(data):
                        yield name, decoded
        for run in _HEX.findall(source):
            digits = re.sub(r"[\s:]", "", run)
            try:
                data = bytes.fromhex(digits[:len(digits) // 2 * 2])
            except ValueError:
                continue
            for decoded in _as_text(data):
                yield "hex", decoded
        for run in _CODES.findall(source):
            codes = [int(c) for c in re.findall(r"\d+", run)]
            if all(9 <= c < 128 for c in codes):
                decoded = "".join(map(chr, codes))
                yield "character codes", decoded
                yield "character codes", decoded[::-1]


class ReferenceLines:
    """The lines of reference code a student may not be shown (normalised, each at least
    :data:`MIN_LENGTH` characters)."""

    def __init__(self, lines: set[str]):
        self.lines = {line for line in lines if len(line) >= MIN_LENGTH}

    @classmethod
    def of_tree(cls, root: Path, own_code: str = "") -> "ReferenceLines":
        """Every line of every block in the tree ``root`` (:func:`instructor.blocks.scan`), less the
        lines the student release shows anyway (outside the blocks) and the lines of ``own_code``
        (the student's own blocks)."""
        blocks, outside = scan(root)
        secret = {normalise(line) for block in blocks for line in block.body}
        public = {normalise(line) for line in outside}
        own = {normalise(line) for line in own_code.split("\n")}
        return cls(secret - public - own)

    def found_in(self, text: str) -> tuple[str, str] | None:
        """``(how it was encoded, the line)`` of the first reference line ``text`` contains; None if none."""
        if not text or not self.lines:
            return None
        for how, candidate in decodings(text):
            flat = normalise(candidate)
            if len(flat) < MIN_LENGTH:
                continue
            for line in self.lines:
                if line in flat:
                    return how, line
        return None
