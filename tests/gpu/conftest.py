"""The GPU tier runs with ``pytest -m gpu`` only: without ``gpu`` in the marker expression, its tests are
deselected (the default ``pytest`` runs pinned to the CPU; see the repository's ``conftest.py``).

Each GPU test is bounded by pytest's timeout: one that names none gets ``tests.gpu.support.TEST_TIMEOUT`` (two
launches of up to 8 ranks, each bounded by the launcher, can take longer than the suite's 300 s)."""
import re

import pytest


def pytest_collection_modifyitems(config, items):
    from tests.gpu.support import TEST_TIMEOUT

    for item in items:
        if item.get_closest_marker("gpu") and item.get_closest_marker("timeout") is None:
            item.add_marker(pytest.mark.timeout(TEST_TIMEOUT))
    if re.search(r"\bgpu\b", config.getoption("markexpr", "") or ""):
        return  # -m gpu (or an expression naming it): the marker expression selects
    tier = [item for item in items if item.get_closest_marker("gpu")]
    if tier:
        config.hook.pytest_deselected(items=tier)
        items[:] = [item for item in items if not item.get_closest_marker("gpu")]
