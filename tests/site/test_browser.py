"""Every page of the site in headless Chromium: its title, every image loaded, math typeset (every notebook has
formulas, and no TeX or $…$ is left as text), wide outputs scroll sideways instead of being cut off, no error logged.

Chromium comes from Debian (``.ci/run`` installs it); where it is not installed the tests are skipped
with a reason that says what to install (under CI, they fail instead). Screenshots of the landing
page and of a notebook page are saved in build/site/screenshots/.
"""
from __future__ import annotations

import time

from selenium.webdriver.common.by import By

from tests.site import browser
from tests.site.conftest import pages
from tests.site.fake_course import NOTEBOOK


# The theme keeps the sidebar's scroll from page to page: the screenshots show it from its top.
SIDEBAR_TO_TOP = "document.querySelectorAll('.bd-sidebar, .bd-sidebar-primary').forEach(e => { e.scrollTop = 0; });"


def problems_of(name: str, page: dict) -> list[str]:
    found = []
    if not page["title"].strip() or not page["h1"]:
        found.append(f"{name}: no title (<title> {page['title']!r}, heading {page['h1']!r})")
    elif not page["title"].startswith(page["h1"]):
        found.append(f"{name}: the title {page['title']!r} does not name the page's heading {page['h1']!r}")
    found += [f"{name}: image {i['src']} did not load" for i in page["images"] if not i["loaded"]]
    if page["typeset_result"] is not True:
        found.append(f"{name}: MathJax failed: {page['typeset_result']}")
    found += [f"{name}: math left as TeX: {m!r}" for m in page["untypeset"]]
    found += [f"{name}: TeX error in math: {m!r}" for m in page["math_errors"]]
    found += [f"{name}: raw {t!r} in the text" for t in page["raw_tex"]]
    found += [f"{name}: math left as text with its dollars: {m!r}" for m in page["raw_dollar"]]
    found += [f"{name}: a wide {w['what']} is cut off (overflow-x {w['overflow']}, {w['content']} px of content in "
              f"{w['box']} px, it does not scroll): {w['text']!r}" for w in page["wide"] if not w["scrolls"]]
    found += [f"{name}: console error: {e}" for e in page["console_errors"]]
    return found


def test_every_page_of_the_site_in_chromium(course_site, chromium, screenshots):
    found, shown = [], {}
    with browser.serve(course_site.html) as base:
        for name in pages(course_site.html):
            shown[name] = browser.inspect(chromium, base + name)
            found += problems_of(name, shown[name])
        for notebook in course_site.notebooks:  # the formulas of every notebook are typeset ($…$), not code spans
            name = notebook.replace(".ipynb", ".html")
            if not shown[name]["typeset"]:
                found.append(f"{name}: no formula typeset (write formulas as $…$ or $$…$$, not as code)")
        chromium.get(base + "index.html")
        chromium.execute_script(SIDEBAR_TO_TOP)
        chromium.save_screenshot(str(screenshots / "landing.png"))
        with_plot = [n for n in course_site.notebooks if shown[n.replace(".ipynb", ".html")]["images"]]
        notebook = (with_plot or course_site.notebooks)[0].replace(".ipynb", ".html")
        chromium.get(base + notebook)
        chromium.execute_script(SIDEBAR_TO_TOP)
        first_output = chromium.find_elements(By.CSS_SELECTOR, ".cell_output img, .cell_output")
        if first_output:
            chromium.execute_script("arguments[0].scrollIntoView({block: 'center'});", first_output[0])
        chromium.save_screenshot(str(screenshots / "notebook.png"))
    assert not found, "\n".join(found)
    assert (screenshots / "landing.png").stat().st_size > 10_000


def test_notebook_outputs_plots_tables_and_math_render_in_chromium(demo, chromium, screenshots):
    _, built = demo
    with browser.serve(built.html) as base:
        page = browser.inspect(chromium, base + NOTEBOOK.replace(".ipynb", ".html"))
        plot = chromium.find_element(By.CSS_SELECTOR, ".cell_output img")
        chromium.execute_script("arguments[0].scrollIntoView({block: 'center'});", plot)
        chromium.save_screenshot(str(screenshots / "demo-notebook-outputs.png"))
    assert not problems_of(NOTEBOOK, page)
    assert page["images"] and all(i["width"] > 100 for i in page["images"]), page["images"]
    assert page["math"] >= 3 and page["typeset"] >= 3, "inline and display math and a LaTeX output are typeset"
    wide = {w["what"]: w for w in page["wide"]}
    assert {"pre", "div with a table"} <= set(wide), f"the wide printed line and the wide DataFrame: {page['wide']}"
    assert all(w["scrolls"] and w["overflow"] in ("auto", "scroll") for w in wide.values()), page["wide"]


def test_a_cut_off_output_or_dollars_left_in_the_text_are_found(demo, chromium):
    # The checks above fail where they should: on the demo's page made to clip its wide outputs (a style that
    # hides the overflow) and given a formula left as text, with its dollars.
    _, built = demo
    with browser.serve(built.html) as base:
        chromium.get(base + NOTEBOOK.replace(".ipynb", ".html"))
        chromium.execute_script(
            "const s = document.createElement('style');"
            "s.textContent = 'div.cell_output .output, div.cell_output pre { overflow-x: hidden !important; }';"
            "document.head.appendChild(s);"
            "const p = document.createElement('p'); p.textContent = 'the bubble $(p-1)/(m+p-1)$ as text';"
            "document.querySelector('article').appendChild(p);")
        broken = chromium.execute_script(browser._WIDE + browser._INSPECT)
    found = problems_of(NOTEBOOK, {**broken, "typeset_result": True, "console_errors": []})
    assert any("is cut off" in f for f in found), found
    assert any("$(p-1)/(m+p-1)$" in f for f in found), found


def test_search_finds_a_notebook(course_site, chromium):
    word = "partition" if "notebooks/01_data_parallel.ipynb" in course_site.notebooks else "parallelism"
    with browser.serve(course_site.html) as base:
        chromium.get(f"{base}search.html?q={word}")
        deadline = time.monotonic() + 30
        links = []
        while time.monotonic() < deadline and not links:
            links = [a.get_attribute("href") for a in chromium.find_elements(By.CSS_SELECTOR, "#search-results a")]
            time.sleep(0.2)
    assert any("/notebooks/" in link for link in links), f"searching {word!r} found {links}"
