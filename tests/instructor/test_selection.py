"""``pytest -k KEY`` selects exactly the tests marked KEY, for every key of instructor/keys.py.

``-k`` matches a key against every name around a test — its file, folder, class, function, parameters
and markers — so a file named after one key once pulled that key's neighbours' tests in
(``-k a5_5_1`` ran a5_5_2's tests, which fail until 5.5.2 is done). One collection of the whole suite
(``--collect-only``) is checked with pytest's own keyword matching, for every key; new keys and new
test folders are checked the day they appear. ``conftest.py``'s fast path (``pytest -k KEY`` imports
only the files that can hold KEY's tests) is checked to skip no file that holds one.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import may_hold_tests_of
from instructor.keys import KEYS

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def collected(tmp_path_factory) -> dict:
    report = tmp_path_factory.mktemp("selection") / "report.json"
    done = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
                           "-p", "tests.support.selection_report"], cwd=REPO, capture_output=True, text=True,
                          timeout=600, env=dict(os.environ, LLMSYS_SELECTION_REPORT=str(report)))
    assert done.returncode == 0 and report.is_file(), done.stdout[-3000:] + done.stderr[-3000:]
    return json.loads(report.read_text())


def test_every_key_selects_exactly_its_marked_tests(collected):
    wrong = {}
    for key in KEYS:
        selected = {n for n, t in collected.items() if key in t["selected_by"]}
        marked = {n for n, t in collected.items() if key in t["markers"]}
        if selected != marked:
            wrong[key] = {"selected, not marked": sorted(selected - marked)[:5],
                          "marked, not selected": sorted(marked - selected)[:5]}
    assert not wrong, "pytest -k KEY is not exact:\n" + json.dumps(wrong, indent=1)
    assert all(any(key in t["markers"] for t in collected.values()) for key in KEYS), "a key has no tests"


def test_the_fast_path_keeps_every_file_that_holds_a_keys_tests(collected):
    skipped = sorted({f"{t['path']} ({key})" for t in collected.values() for key in t["markers"]
                      if not may_hold_tests_of(Path(t["path"]), {key})})
    assert not skipped, "conftest.py would skip these files under pytest -k KEY:\n" + "\n".join(skipped)


@pytest.mark.parametrize("key", ["a5_5_1", "a5_6_3"], ids=["zero_1", "three_d_step"])  # ids hold no key
def test_pytest_k_runs_only_the_keys_tests(collected, key):
    """End to end, with the fast path on (the key whose file name once held it, and the last key)."""
    done = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
                           "-k", key], cwd=REPO, capture_output=True, text=True, timeout=300)
    ids = {line.strip() for line in done.stdout.splitlines() if "::" in line}
    assert ids == {n for n, t in collected.items() if key in t["markers"]}, done.stdout[-3000:]
