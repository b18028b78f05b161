"""Fixtures of the site's tests: the course's site and the demo course's site, each built once per session.

The site is built from the instructor's tree: in the student release, which leaves out
instructor/release.py (the parser of the reference blocks), these tests are not collected.
"""
from __future__ import annotations

import importlib.util
import os
import shutil
from pathlib import Path

import pytest

from tests.site import browser

if importlib.util.find_spec("instructor.release") is None:
    collect_ignore_glob = ["test_*.py"]
else:
    from tests.site.fake_course import FAKE_KEYS, make_course
    from website.build import DEFAULT_OUT, REPO, build

    SCREENSHOTS = DEFAULT_OUT / "screenshots"


@pytest.fixture(scope="session")
def course_site():
    """The course's site, built by the README's command into build/site (what ``python -m website`` does)."""
    return build(REPO, DEFAULT_OUT)


@pytest.fixture(scope="session")
def demo(tmp_path_factory):
    """The demo course (``fake_course.py``, its notebook executed) and its site: (course root, built site)."""
    root = make_course(tmp_path_factory.mktemp("demo_course"))
    return root, build(root, tmp_path_factory.mktemp("demo_site"), FAKE_KEYS)


@pytest.fixture(scope="session")
def chromium(tmp_path_factory):
    """A headless Chromium (skipped where none is installed, saying what to install; CI installs it)."""
    reason = browser.missing()
    if reason:
        if os.environ.get("CI"):
            pytest.fail(f"CI must run the browser test, but {reason}")
        pytest.skip(reason)
    with browser.chromium(tmp_path_factory.mktemp("chromium_profile")) as driver:
        yield driver


@pytest.fixture(scope="session")
def screenshots():
    shutil.rmtree(SCREENSHOTS, ignore_errors=True)
    SCREENSHOTS.mkdir(parents=True)
    return SCREENSHOTS


def pages(html: Path) -> list[str]:
    """Every HTML page of a built site, relative to it (the theme's files aside)."""
    return sorted(p.relative_to(html).as_posix() for p in html.rglob("*.html") if "_static" not in p.parts)
