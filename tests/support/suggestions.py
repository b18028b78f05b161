"""The fixes an error message suggests, in a form a test can follow (tests/course/test_bad_input.py,
tests/course/test_checkpoint_integrity.py): every suggested fix must itself pass the checks."""
from __future__ import annotations

import re

_SUGGESTED = re.compile(r"(?:try|use|choose|resume with) (--\w+|\w+) (?:in \[([\d, ]+)\]|(?:<=|>=) (\S+)|(\S+))")


def suggested_fixes(message: str) -> list[tuple[str, str]]:
    """``(option, value)`` for each concrete fix a message suggests: ``try --x V``, ``use --x <= V``, ``choose --x
    in [a, b]`` (each of a, b), ``choose cp in [...]``, ``resume with --x V``."""
    fixes = []
    for match in _SUGGESTED.finditer(message):
        option = match.group(1) if match.group(1).startswith("--") else f"--{match.group(1)}"
        values = match.group(2).split(",") if match.group(2) else [match.group(3) or match.group(4)]
        fixes += [(option, v.strip().rstrip(";.,)")) for v in values if v.strip()]
    return fixes


def with_option(argv: list[str], option: str, value: str) -> list[str]:
    """``argv`` with ``option`` set to ``value`` (replaced where it is given, else added)."""
    out = list(argv)
    if option in out:
        out[out.index(option) + 1] = value
    else:
        out += [option, value]
    return out
