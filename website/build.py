"""Build the course's site: ``python -m website`` (or ``python website/build.py``).

    python -m website                 # -> build/site/html/index.html
    python -m website --out /tmp/site

Three steps, each of which fails the build with a message saying what to change:

1. stage the course's files for Sphinx (``website/stage.py``): notebooks in course order with their
   committed outputs and no reference solution, the README's sections, ``docs/``, the packages;
2. Sphinx with MyST-NB (``website/conf.py``), warnings as errors (``-W -n``): a broken link or
   cross-reference, a missing image, a page outside the table of contents fails the build;
3. the checks of the built HTML that Sphinx does not make (``website/checks.py``): every notebook
   in the navigation in course order, every relative link and anchor, nothing loaded from another
   site, and no line of a reference solution on any page (``website/leaks.py``).

The notebooks are not executed: the site shows the outputs they were committed with.
"""
from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

if __name__ == "__main__":  # run as a file: import the packages of the tree this script sits in
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from instructor.keys import KEYS, Key  # noqa: E402
from instructor.blocks import ReleaseError  # noqa: E402
from website.checks import check_site  # noqa: E402
from website.stage import SiteError, stage  # noqa: E402

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
DEFAULT_OUT = REPO / "build" / "site"


@dataclass
class Built:
    html: Path          # the site: open html / "index.html"
    notebooks: list[str]
    seconds: float


def build(root: Path = REPO, out: Path = DEFAULT_OUT, keys: dict[str, Key] = KEYS, jobs: int = 2) -> Built:
    """Build the site of the course tree ``root`` into ``out`` (``out/html``; ``out/src`` holds the staged
    sources). Raises :class:`SiteError` naming every problem."""
    start = time.perf_counter()
    out = Path(out).resolve()
    try:
        staged = stage(root, out / "src", keys)
    except ReleaseError as exc:
        raise SiteError(f"a reference block's markers: {exc}") from None
    html, doctrees = out / "html", out / "doctrees"
    for folder in (html, doctrees):
        shutil.rmtree(folder, ignore_errors=True)
    command = [sys.executable, "-m", "sphinx", "-b", "html", "-c", str(HERE), "-W", "--keep-going", "-n", "-q",
               "-j", str(jobs), "-d", str(doctrees), str(staged.src), str(html)]
    env = {**os.environ, "PYTHONWARNINGS": "ignore::DeprecationWarning"}
    run = subprocess.run(command, capture_output=True, text=True, env=env)
    if run.returncode != 0:
        raise SiteError(f"Sphinx failed (exit {run.returncode}); its warnings are errors here:\n"
                        f"{run.stderr.strip()}\n(sources as staged: {staged.src})")
    problems = check_site(html, staged.notebooks, Path(root).resolve())
    if problems:
        raise SiteError(f"the built site has {len(problems)} problem(s):\n  " + "\n  ".join(problems))
    return Built(html, staged.notebooks, time.perf_counter() - start)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description="Build the course's website (notebooks with their committed "
                                                 "outputs, guides, docs) into a folder git ignores.")
    parser.add_argument("--out", default=str(DEFAULT_OUT), help="output folder (default: build/site; the site is "
                                                                "OUT/html/index.html)")
    parser.add_argument("--jobs", type=int, default=2, help="Sphinx's parallel processes (default 2)")
    args = parser.parse_args(argv)
    try:
        built = build(out=Path(args.out), jobs=args.jobs)
    except SiteError as exc:
        print(f"site build failed: {exc}", file=sys.stderr)
        return 1
    print(f"site built in {built.seconds:.1f} s: {built.html / 'index.html'} "
          f"({len(built.notebooks)} notebooks, in course order)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
