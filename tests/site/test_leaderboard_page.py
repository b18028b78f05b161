"""The leaderboard page is built from the entries committed under leaderboard/ (website/leaderboard.py)."""
from __future__ import annotations

import json
import shutil

import pytest
from bs4 import BeautifulSoup

from instructor.leaderboard import EntryError
from instructor.performance import PERF_KEYS
from tests.site.fake_course import FAKE_KEYS
from website.build import REPO, build
from website.leaderboard import page_markdown
from website.stage import SiteError, stage


def test_the_page_builds_from_the_committed_entries(demo, tmp_path):
    root = tmp_path / "course"
    shutil.copytree(demo[0], root)
    shutil.copytree(REPO / "leaderboard", root / "leaderboard")
    built = build(root, tmp_path / "site", FAKE_KEYS)
    page = BeautifulSoup((built.html / "leaderboard.html").read_text(encoding="utf-8"), "html.parser")
    rows = [[td.get_text(" ", strip=True) for td in tr.find_all("td")] for tr in page.find_all("table")[0].find_all("tr")]
    entry = json.loads((REPO / "leaderboard" / "reference.json").read_text())
    first = rows[1]
    assert first[0].startswith(entry["label"]) and "(reference)" in first[0]
    for name, cell in zip(PERF_KEYS, first[1:]):
        assert cell.startswith(f"{entry['keys'][name]['ratio']:.3f}") and cell.endswith(entry["keys"][name]["verdict"])
    assert entry["commit"][:10] in first[-1]
    nav = [a["href"] for a in BeautifulSoup((built.html / "index.html").read_text(encoding="utf-8"),
                                            "html.parser").select("nav.bd-docs-nav a[href]")]
    assert "leaderboard.html" in nav


def test_a_rejected_entry_fails_the_build_and_no_entry_means_no_page(demo, tmp_path):
    root = tmp_path / "course"
    shutil.copytree(demo[0], root)
    assert page_markdown(root) is None
    (root / "leaderboard").mkdir()
    entry = json.loads((REPO / "leaderboard" / "reference.json").read_text())
    entry["keys"]["perf_1f1b"]["machine"]["conditions"] = "loaded"
    (root / "leaderboard" / "reference.json").write_text(json.dumps(entry))
    with pytest.raises(EntryError, match="loaded"):
        page_markdown(root)
    with pytest.raises(SiteError, match="(?s)leaderboard/: .*loaded"):
        stage(root, tmp_path / "src", FAKE_KEYS)
