"""Relative links written for the repository still lead somewhere from the site's staged pages."""
from __future__ import annotations

from website.markdown import LinkMap, escape, split_sections


def link_map(tmp_path) -> LinkMap:
    for name in ("docs/grading.md", "course/launch.py", "results/plot.png", "notebooks/01_a.ipynb"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("x")
    pages = {"README.md": "index.md", "docs/grading.md": "docs/grading.md", "notebooks/01_a.ipynb": "notebooks/01_a.ipynb"}
    return LinkMap(tmp_path, pages, {("README.md", "running-on-gpus"): "guides/running-on-gpus.md"})


def test_links_to_pages_follow_the_page(tmp_path):
    links = link_map(tmp_path)
    text = "See [grading](docs/grading.md#threat-model), [GPUs](README.md#running-on-gpus), [01](notebooks/01_a.ipynb)."
    assert links.rewrite(text, "README.md", "guides/layout.md") == (
        "See [grading](../docs/grading.md#threat-model), [GPUs](running-on-gpus.md), [01](../notebooks/01_a.ipynb).")


def test_source_code_is_named_not_linked_and_images_are_copied(tmp_path):
    links = link_map(tmp_path)
    text = "The [launcher](../course/launch.py), [`course/launch.py`](../course/launch.py), ![p](../results/plot.png)"
    assert links.rewrite(text, "docs/x.md", "docs/x.md") == (
        "The launcher (`course/launch.py`), `course/launch.py`, ![p](../results/plot.png)")
    assert links.images == {"results/plot.png"}


def test_broken_links_code_and_web_links_are_left_alone(tmp_path):
    links = link_map(tmp_path)
    text = ("[gone](docs/gone.md) [web](https://pytorch.org) [here](#top) `[c](docs/grading.md)`\n"
            "```\n[c](docs/grading.md)\n```\n")
    assert links.rewrite(text, "README.md", "guides/a.md") == text


def test_readme_sections_and_escaping():
    preamble, sections = split_sections("# T\nintro\n## A b\n```\n## not a heading\n```\n### sub\n## C\nend\n")
    assert preamble == "# T\nintro" and [s.heading for s in sections] == ["A b", "C"]
    assert "## not a heading" in sections[0].body and sections[0].slug == "a-b"
    assert escape("a | b *c* `x|y` $5\nz") == r"a \| b \*c\* `x\|y` \$5 z"
