"""Repository-wide pytest set-up: markers from the one table of keys, longer time limits for notebooks."""
import pytest

from instructor.keys import marker_lines

NOTEBOOK_TIMEOUT_S = 900  # a whole notebook, executed top to bottom on 2 CPU cores


def pytest_configure(config):
    for line in marker_lines():
        config.addinivalue_line("markers", line)


def pytest_collection_modifyitems(items):
    for item in items:
        if str(item.path).endswith(".ipynb"):
            item.add_marker(pytest.mark.timeout(NOTEBOOK_TIMEOUT_S))
