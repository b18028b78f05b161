"""The GPU tier runs with ``pytest -m gpu`` only: without ``gpu`` in the marker expression, its tests are
deselected (the default ``pytest`` runs pinned to the CPU; see the repository's ``conftest.py``)."""
import re


def pytest_collection_modifyitems(config, items):
    if re.search(r"\bgpu\b", config.getoption("markexpr", "") or ""):
        return  # -m gpu (or an expression naming it): the marker expression selects
    tier = [item for item in items if item.get_closest_marker("gpu")]
    if tier:
        config.hook.pytest_deselected(items=tier)
        items[:] = [item for item in items if not item.get_closest_marker("gpu")]
