"""A checkout's tests and notebooks stop when its packages would come from another copy of the course."""
from pathlib import Path

import pytest

import course
from course.tree import check_tree, tree_packages

REPO = Path(__file__).resolve().parents[2]


def test_this_checkout_passes():
    assert check_tree(REPO) == REPO
    assert {"course", "data_parallel", "pipeline", "tensor_parallel"} <= set(tree_packages(REPO))


def test_another_checkout_whose_packages_come_from_here_is_stopped(tmp_path):
    """As when the reference is installed in editable mode and a release is run beside it."""
    (tmp_path / "course").mkdir()
    (tmp_path / "course" / "__init__.py").write_text("")
    with pytest.raises(RuntimeError) as info:
        check_tree(tmp_path)
    message = str(info.value)
    assert f"'course' is imported from {Path(course.__file__).parent}, not from this checkout {tmp_path}" in message
    assert f"pip install -e .` in {tmp_path}" in message
