"""The clock-cycle schedule of a synchronous pipeline (GPipe forward pass).

With ``m`` micro-batches and ``n`` stages (partitions), micro-batch ``i`` is on stage ``j``
at clock cycle ``k = i + j``. Every task of one clock cycle can run at the same time,
each on its own stage; the forward pass takes ``m + n - 1`` clock cycles.

Example, m = 3 micro-batches, n = 2 stages (row = stage, column = clock cycle)::

    clock      0    1    2    3
    stage 0   F0   F1   F2
    stage 1        F0   F1   F2

Source: Huang et al. 2019, GPipe, Sec. 2.2 and Fig. 2; Kim et al. 2020, torchgpipe, Sec. 3.2.1.
"""
from __future__ import annotations

from typing import Iterator


def _clock_cycles(num_batches: int, num_partitions: int) -> Iterator[list[tuple[int, int]]]:
    """Yield, for each clock cycle ``k = 0 .. m + n - 2``, the tasks ``(i, j)`` with ``i + j = k``.

    Args:
        num_batches: number of micro-batches ``m`` (>= 1).
        num_partitions: number of stages ``n`` (>= 1).

    Yields:
        For every clock cycle, a list of ``(micro-batch index i, stage index j)`` pairs
        with ``0 <= i < m``, ``0 <= j < n`` and ``i + j = k``, one pair per busy stage
        (ordered by stage). Exactly ``m + n - 1`` lists are yielded.

    Raises:
        ValueError: ``num_batches`` or ``num_partitions`` smaller than 1.
    """
    if num_batches < 1 or num_partitions < 1:
        raise ValueError(f"need at least one micro-batch and one stage, got m={num_batches}, n={num_partitions}")
    m, n = num_batches, num_partitions
    # BEGIN ASSIGN5_2_1
    for k in range(m + n - 1):
        yield [(k - j, j) for j in range(max(0, k - m + 1), min(k + 1, n))]
    # END ASSIGN5_2_1


def clock_table(num_batches: int, num_partitions: int) -> list[list[str]]:
    """The schedule as a table for printing: ``table[j][k]`` is ``"F{i}"`` or ``""``.

    Rows are stages ``j``, columns clock cycles ``k`` (see the module docstring).
    """
    cycles = list(_clock_cycles(num_batches, num_partitions))
    table = [["" for _ in cycles] for _ in range(num_partitions)]
    for k, tasks in enumerate(cycles):
        for i, j in tasks:
            table[j][k] = f"F{i}"
    return table


# The public name; ``_clock_cycles`` is the name of assignment 5.2.1 (torchgpipe's).
clock_cycles = _clock_cycles
