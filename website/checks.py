"""Checks of the built site that Sphinx does not make (``python -m website`` fails on any of them).

Sphinx, with warnings as errors, already fails on a broken cross-reference, a missing image or a
page left out of every table of contents. These checks read the built HTML:

* **table of contents**: every notebook of ``notebooks/`` has its page, and the site's navigation
  lists those pages in course order;
* **internal links**: every relative ``href``/``src`` of every page leads to a file of the site,
  and its ``#anchor`` to an element of that page;
* **nothing from the web**: no script, style sheet, image, frame or font is loaded from another
  site (the site is read offline, and a CDN would be a download at view time);
* **no reference solution**: :mod:`website.leaks`.
"""
from __future__ import annotations

import posixpath
from pathlib import Path
from urllib.parse import unquote, urlsplit

from bs4 import BeautifulSoup

from website import leaks

_LOADED = {"script": "src", "img": "src", "iframe": "src", "source": "src", "video": "src", "audio": "src",
           "embed": "src", "object": "data"}


def _pages(site: Path) -> list[Path]:
    return sorted(p for p in site.rglob("*.html") if p.relative_to(site).parts[0] != "_static")


def check_toc(site: Path, notebooks: list[str]) -> list[str]:
    """Problems with the notebooks' pages and their order in the navigation."""
    problems = []
    expected = [n.removesuffix(".ipynb") + ".html" for n in notebooks]
    for page in expected:
        if not (site / page).is_file():
            problems.append(f"{page}: no page for the notebook {page.removesuffix('.html')}.ipynb")
    soup = BeautifulSoup((site / "index.html").read_text(encoding="utf-8"), "html.parser")
    listed = [a["href"] for a in soup.select("nav.bd-docs-nav a[href]") if a["href"].startswith("notebooks/")]
    if listed != expected:
        missing = [p for p in expected if p not in listed]
        problems.append(f"index.html: the navigation lists the notebooks {listed}, expected {expected} "
                        f"(missing: {missing})")
    return problems


def check_links(site: Path) -> list[str]:
    """Broken relative links and anchors, and resources loaded from another site."""
    problems, ids = [], {}

    def ids_of(path: Path) -> set[str]:
        if path not in ids:
            soup = BeautifulSoup(path.read_text(encoding="utf-8"), "html.parser")
            ids[path] = {tag["id"] for tag in soup.find_all(id=True)} | {a["name"] for a in soup.find_all("a", attrs={"name": True})}
        return ids[path]

    for page in _pages(site):
        where = page.relative_to(site).as_posix()
        soup = BeautifulSoup(page.read_text(encoding="utf-8"), "html.parser")
        for tag in soup.find_all(["a", "link", *_LOADED]):
            attribute = _LOADED.get(tag.name, "href")
            url = tag.get(attribute)
            if not url:
                continue
            parts = urlsplit(url)
            loads = tag.name != "a" and not (tag.name == "link" and not {"stylesheet", "icon", "preload", "modulepreload"}
                                              & set(tag.get("rel", [])))
            if parts.scheme or url.startswith("//"):
                if loads:
                    problems.append(f"{where}: <{tag.name}> loads {url} from another site")
                continue
            target = page if not parts.path else (page.parent / unquote(parts.path))
            target = Path(posixpath.normpath(target.as_posix()))
            if target.is_dir():
                target = target / "index.html"
            if not target.is_file():
                problems.append(f"{where}: <{tag.name} {attribute}={url!r}> leads to no file of the site")
            elif parts.fragment and target.suffix == ".html" and unquote(parts.fragment) not in ids_of(target):
                problems.append(f"{where}: <{tag.name} {attribute}={url!r}>: {target.relative_to(site)} has no "
                                f"element with id {parts.fragment!r}")
    return problems


def check_site(site: Path, notebooks: list[str], root: Path) -> list[str]:
    """Every problem of the built site ``site`` of the course tree ``root`` (empty: all is well)."""
    site = Path(site)
    problems = check_toc(site, notebooks) + check_links(site)
    problems += [str(leak) for leak in leaks.find_leaks(site, leaks.secret_lines(root))]
    return problems
