"""A pytest plugin that reports, for every collected test, which keys' ``-k KEY`` select it and which key
markers it carries (used by tests/instructor/test_selection.py; ``pytest -p tests.support.selection_report``).

It evaluates ``-k`` exactly as pytest does (``_pytest.mark``'s keyword matcher and expression), once per
key of ``instructor/keys.py``, on one collection, and writes ``{node id: {"selected_by": [...],
"markers": [...], "path": ...}}`` as JSON to the file named by ``LLMSYS_SELECTION_REPORT``.
"""
from __future__ import annotations

import json
import os

from _pytest.mark import KeywordMatcher
from _pytest.mark.expression import Expression

from instructor.keys import KEYS


def pytest_collection_finish(session):
    path = os.environ.get("LLMSYS_SELECTION_REPORT")
    if not path:
        return
    expressions = {key: Expression.compile(key) for key in KEYS}
    report = {}
    for item in session.items:
        matcher = KeywordMatcher.from_item(item)
        report[item.nodeid] = {"selected_by": sorted(k for k, e in expressions.items() if e.evaluate(matcher)),
                               "markers": sorted({m.name for m in item.iter_markers()} & set(KEYS)),
                               "path": str(item.path)}
    with open(path, "w", encoding="utf-8") as handle:
        json.dump(report, handle)
