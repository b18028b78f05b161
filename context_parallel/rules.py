"""The torch-free rules of a context-parallel run's configuration (checked before any process starts, also
where torch is not installed: ``modal run`` on a laptop, through ``project/options``).
"""
from __future__ import annotations


def check_heads(n_head: int, cp: int) -> None:
    """Raise ``ValueError`` (naming what to change) unless ``cp`` divides the ``n_head`` attention heads."""
    if n_head % cp:
        divisors = [d for d in range(1, n_head + 1) if n_head % d == 0]
        raise ValueError(f"Ulysses gives each of the cp = {cp} ranks n_head / cp whole heads, but {n_head} heads "
                         f"are not divisible by {cp}; choose cp in {divisors}, or --attention ring")
