"""Headless Chromium for the site's tests: a local HTTP server for the built site, a driver, and
what a page shows once it has loaded (title, images, math, wide outputs, errors in the console).

Chromium and its driver come from Debian (``apt-get install -y chromium chromium-driver``), the
driver's client from PyPI (``selenium``); nothing is downloaded when the test runs, and the
browser is started with everything that would reach the network turned off.
"""
from __future__ import annotations

import functools
import shutil
import threading
from contextlib import contextmanager
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

CHROMIUM_ARGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run", "--window-size=1280,900")
INSTALL = ("install headless Chromium and its driver from Debian (as root: apt-get install -y chromium "
           "chromium-driver) and selenium (pip install -r requirements.txt); .ci/run does both")


def missing() -> str | None:
    """Why the browser tests cannot run here (None: they can)."""
    try:
        import selenium  # noqa: F401
    except ImportError:
        return f"selenium is not installed: {INSTALL}"
    absent = [name for name in ("chromium", "chromedriver") if shutil.which(name) is None]
    return f"{' and '.join(absent)} not found: {INSTALL}" if absent else None


class _QuietHandler(SimpleHTTPRequestHandler):
    def log_message(self, format, *args):  # noqa: A002 - the base class's name
        pass


@contextmanager
def serve(folder: Path):
    """Serve ``folder`` on 127.0.0.1 (a free port) while the block runs; yields the base URL."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(_QuietHandler, directory=str(folder)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


@contextmanager
def chromium(profile: Path):
    """A headless Chromium driven by chromedriver, with a fresh profile in ``profile``."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = shutil.which("chromium")
    for argument in (*CHROMIUM_ARGS, f"--user-data-dir={profile}"):
        options.add_argument(argument)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(executable_path=shutil.which("chromedriver")), options=options)
    driver.set_page_load_timeout(60)
    driver.set_script_timeout(60)
    try:
        yield driver
    finally:
        driver.quit()


_TYPESET = """
const done = arguments[arguments.length - 1];
const mathjax = window.MathJax && window.MathJax.startup && window.MathJax.startup.promise;
Promise.resolve(mathjax).then(() => document.fonts.ready).then(() => done(true), (e) => done(String(e)));
"""

_INSPECT = """
const body = document.body.cloneNode(true);
body.querySelectorAll('pre, code, script, style, textarea, mjx-container, .highlight').forEach(e => e.remove());
const prose = body.textContent;
const h1 = Array.from(document.querySelectorAll('h1')).find(h => h.textContent.trim());
return {
  title: document.title,
  h1: h1 ? Array.from(h1.childNodes).filter(n => !(n.classList && n.classList.contains('headerlink')))
                .map(n => n.textContent).join('').trim() : null,
  images: Array.from(document.images).map(i => ({src: i.getAttribute('src'), loaded: i.complete && i.naturalWidth > 0,
                                                  width: i.naturalWidth})),
  math: document.querySelectorAll('.math').length,
  untypeset: Array.from(document.querySelectorAll('.math')).filter(e => !e.querySelector('mjx-container'))
                  .map(e => e.textContent.slice(0, 80)),
  typeset: document.querySelectorAll('mjx-container').length,
  math_errors: Array.from(document.querySelectorAll('mjx-merror')).map(e => e.textContent.slice(0, 80)),
  raw_tex: ['$$', '\\\\(', '\\\\['].filter(s => prose.includes(s)),
  // inline math MyST did not turn into a formula: $x$ or $a + b$ left in the text
  raw_dollar: (prose.match(/\\$[^\\s$](?:[^$\\n]*[^\\s$])?\\$/g) || []).slice(0, 5),
  wide: wideBoxes(),
};
"""

# Every box of a notebook's output, and every code block, whose content is wider than the box: whether the reader
# can scroll it sideways (overflow-x auto or scroll, and scrollLeft moves), or it is cut off (hidden) or spills over
# the page (visible). A box that wraps its lines is not wide.
_WIDE = """
function wideBoxes() {
  const found = [];
  document.querySelectorAll('div.cell_output .output, div.cell_output pre, article div.highlight pre').forEach(e => {
    if (e.scrollWidth <= e.clientWidth + 1) return;
    const overflow = getComputedStyle(e).overflowX;
    const before = e.scrollLeft;
    e.scrollLeft = before + 40;  // a script can scroll a box that hides its overflow: the reader cannot
    const scrolls = e.scrollLeft > before && (overflow === 'auto' || overflow === 'scroll');
    e.scrollLeft = before;
    found.push({what: e.tagName.toLowerCase() + (e.querySelector('table') ? ' with a table' : ''),
                text: e.textContent.trim().slice(0, 60), overflow: overflow,
                content: e.scrollWidth, box: e.clientWidth, scrolls: scrolls});
  });
  return found;
}
"""


def inspect(driver, url: str) -> dict:
    """Load ``url``, wait for MathJax and the fonts, and report what the page shows and logged."""
    driver.get(url)
    typeset = driver.execute_async_script(_TYPESET)
    page = driver.execute_script(_WIDE + _INSPECT)
    page["typeset_result"] = typeset
    page["console_errors"] = [entry["message"] for entry in driver.get_log("browser") if entry["level"] == "SEVERE"]
    return page
