"""Repository-wide pytest set-up: notebooks get a longer time limit than unit tests."""
import pytest

NOTEBOOK_TIMEOUT_S = 900  # a whole notebook, executed top to bottom on 2 CPU cores


def pytest_collection_modifyitems(items):
    for item in items:
        if str(item.path).endswith(".ipynb"):
            item.add_marker(pytest.mark.timeout(NOTEBOOK_TIMEOUT_S))
