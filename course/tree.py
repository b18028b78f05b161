"""Which checkout the course's packages come from.

The reference tree and a student release hold packages of the same names. With one of them
installed in editable mode, code run from the other can silently import the installed one's
packages — the release's notebooks running the reference solution, say. :func:`check_tree`
stops such a mix-up with a message; the test suite (``conftest.py``) and every notebook's
first cell call it.
"""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path


def tree_packages(root: str | Path) -> list[str]:
    """The packages of a checkout: its top-level folders that hold an ``__init__.py``."""
    return sorted(p.name for p in Path(root).iterdir() if (p / "__init__.py").is_file())


def check_tree(root: str | Path) -> Path:
    """Check that every package of the checkout at ``root`` is imported from ``root``.

    Returns:
        ``root`` resolved.
    Raises:
        RuntimeError: naming the package, where it comes from instead and what to do.
    """
    root = Path(root).resolve()
    for name in tree_packages(root):
        module = sys.modules.get(name)
        origin = getattr(module, "__file__", None) if module is not None else None
        if origin is None:
            spec = importlib.util.find_spec(name)
            origin = spec.origin if spec is not None else None
        if origin is None:
            continue
        if not Path(origin).resolve().is_relative_to(root):
            raise RuntimeError(
                f"the package {name!r} is imported from {Path(origin).parent}, not from this checkout {root}: another "
                f"copy of the course (e.g. installed with `pip install -e .` elsewhere) comes first. Run from {root}, "
                f"or run `pip install -e .` in {root}; in a notebook, restart the kernel after that.")
    return root
