"""The command lines' parser: ``argparse``, with a suggestion for a mistyped option.

``python project/train.py --mode dp --max_batchs 3`` ends with ``unrecognized arguments: --max_batchs 3 (did you
mean --max_batches?)``: the closest option the command takes (``difflib``'s ratio >= 0.6), as Python 3.14's
``ArgumentParser(suggest_on_error=True)`` does for mistyped choices and subcommands — this course's Python (3.11)
has no such machinery, and not for options. Every run script (:meth:`course.config.RunConfig.parser`), the one
entry point's front parser, the benchmark harness and the grader use it.
"""
from __future__ import annotations

import argparse
import difflib
import re


def closest_option(word: str, options: list[str]) -> str | None:
    """The option of ``options`` most like ``word`` (``--max_batchs`` -> ``--max_batches``), or None if none is
    close; ``--name=value`` is looked up by its name."""
    name = word.split("=", 1)[0]
    found = difflib.get_close_matches(name, options, n=1, cutoff=0.6)
    return found[0] if found else None


class OptionParser(argparse.ArgumentParser):
    """An ``argparse.ArgumentParser`` that takes each option by its whole name only (no abbreviations) and whose
    "unrecognized arguments" error names the closest option for each unknown one (:func:`closest_option`)."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("allow_abbrev", False)  # one name per option: no abbreviations
        super().__init__(*args, **kwargs)

    def known_options(self) -> list[str]:
        """The option strings this parser shows in ``--help`` (hidden ones left out)."""
        return [s for a in self._actions if a.help != argparse.SUPPRESS for s in a.option_strings]

    def error(self, message: str):
        match = re.match(r"unrecognized arguments: (.*)", message)
        if match:
            hints = [f"{word.split('=', 1)[0]}: did you mean {close}?" for word in match.group(1).split()
                     if word.startswith("--") for close in [closest_option(word, self.known_options())] if close]
            if hints:
                message += " (" + "; ".join(hints) + ")"
        super().error(message)
