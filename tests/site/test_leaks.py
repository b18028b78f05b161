"""No line of a reference solution is on the site, and the check finds one that is planted."""
from __future__ import annotations

import json
import shutil

import pytest

from instructor.blocks import reference_blocks
from tests.site.fake_course import CELL_SECRET, NOTEBOOK, PACKAGE_SECRET
from website.build import REPO
from website.checks import check_site
from website.leaks import MIN_CHARS, find_leaks, secret_lines

BEGIN, END = "# " + "BEGIN ASSIGN5_1_1", "# " + "END ASSIGN5_1_1"


@pytest.fixture(scope="module")
def course_secrets():
    """The secret lines of this tree (none in a student release, whose blocks hold only stubs)."""
    blocks = reference_blocks(REPO)
    assert blocks, "no reference block found in the course: the tree or the block finder is broken"
    if all(len(b.body) == 1 and "NotImplementedError" in b.body[0] for b in blocks):
        pytest.skip("a student release: its blocks hold only stubs, there is no solution to hide")
    secrets = secret_lines(REPO)
    assert secrets, "reference blocks with code but no secret line: the rule is broken"
    return secrets


def test_no_line_of_a_reference_solution_is_on_the_site(course_site, course_secrets):
    leaks = find_leaks(course_site.html, course_secrets)
    assert not leaks, "\n".join(map(str, leaks))


def test_the_rule_keeps_long_lines_the_release_does_not_show(tmp_path):
    (tmp_path / "part").mkdir()
    (tmp_path / "part" / "code.py").write_text(
        "def f(values):\n"
        "    total = compute_everything(values)\n"
        f"    {BEGIN}\n"
        "    total = compute_everything(values)\n"       # the release shows it: public
        "    partial_sums = running_total(values, 3)\n"  # secret
        "    if total:\n"                                  # too short to say anything
        "        return x\n"
        "    y = [\n"
        "        total,\n"
        "    ]\n"
        f"    {END}\n"
        "    return total\n")
    assert [s.line for s in secret_lines(tmp_path)] == ["partial_sums = running_total(values, 3)"]
    assert MIN_CHARS > len("return x")


def test_a_planted_leak_is_found_wherever_it_is(demo, tmp_path):
    root, built = demo
    secrets = secret_lines(root)
    assert {PACKAGE_SECRET, CELL_SECRET} <= {s.line for s in secrets}
    copy = shutil.copytree(built.html, tmp_path / "html")
    assert find_leaks(copy, secrets) == []
    page = copy / NOTEBOOK.replace(".ipynb", ".html")
    code = "".join(f'<span class="n">{word}</span> ' for word in CELL_SECRET.split())  # highlighted code
    page.write_text(page.read_text().replace("</article>", f'<div class="highlight"><pre>{code}</pre></div></article>', 1))
    guide = copy / "docs" / "guide.html"
    wrapped = PACKAGE_SECRET.replace(" for ", "\n   for ").replace(">", "&gt;")   # prose, wrapped over lines
    guide.write_text(guide.read_text().replace("</article>", f"<p>{wrapped}</p></article>", 1))
    download = next(copy.glob("_downloads/*/01_demo.ipynb"))
    nb = json.loads(download.read_text())
    nb["cells"][0]["source"] = ["    " + CELL_SECRET + "\n"]
    download.write_text(json.dumps(nb))
    found = {(leak.page, leak.secret.line) for leak in find_leaks(copy, secrets)}
    assert found == {(page.relative_to(copy).as_posix(), CELL_SECRET), ("docs/guide.html", PACKAGE_SECRET),
                     (download.relative_to(copy).as_posix(), CELL_SECRET)}
    assert any("reference solution" in p for p in check_site(copy, built.notebooks, root)), "the build fails on it"


def test_a_near_miss_is_not_a_leak(demo, tmp_path):
    root, built = demo
    copy = shutil.copytree(built.html, tmp_path / "html")
    guide = copy / "docs" / "guide.html"
    guide.write_text(guide.read_text().replace("</article>", f"<p>my{CELL_SECRET}</p></article>", 1))
    assert find_leaks(copy, secret_lines(root)) == []


def test_a_line_of_the_course_planted_in_a_page_is_found(course_site, course_secrets, tmp_path):
    secrets = course_secrets
    secret = max(secrets, key=lambda s: len(s.line))
    page = tmp_path / "page.html"
    page.write_text((course_site.html / "index.html").read_text().replace(
        "</article>", f"<pre>    {secret.line}</pre></article>", 1))
    assert [leak.secret for leak in find_leaks(tmp_path, secrets)] == [secret]
