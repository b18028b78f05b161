"""Sphinx configuration of the course's site (``python -m website`` passes ``-c website``).

The sources are the staged tree (``website/stage.py``); notebooks are rendered with the outputs
they were committed with (MyST-NB, never executed here). Nothing is fetched, at build time or when
a page is viewed: MathJax is served from the site (``sphinx-mathjax-offline`` ships it), and
notebook outputs that need a script from the web (Jupyter widgets) are shown as their text instead.
"""
import importlib.util
from pathlib import Path

HERE = Path(__file__).resolve().parent
# MathJax 3 as shipped by the sphinx-mathjax-offline package (its static/mathjax folder, served as
# _static/mathjax); its files are used directly, since its extension does not declare parallel builds safe.
MATHJAX = Path(importlib.util.find_spec("sphinx-mathjax-offline").origin).parent / "static"

project = "Training LLMs across many devices"
author = "the course's authors"
html_title = project
html_short_title = "LLMs across devices"

extensions = ["myst_nb", "sphinx.ext.mathjax"]
mathjax_path = "mathjax/tex-chtml.js"
exclude_patterns = ["_student/**", "**/.ipynb_checkpoints"]  # _student/: the notebooks to download
nitpicky = True
# A jump in heading levels (a notebook going from '#' to '###') is style, not a broken page.
suppress_warnings = ["myst.header"]

myst_enable_extensions = ["dollarmath", "amsmath", "colon_fence"]
myst_heading_anchors = 3

nb_execution_mode = "off"            # the committed outputs are what the site shows
nb_merge_streams = True
nb_ipywidgets_js = {}                # no widget scripts from a CDN ...
nb_mime_priority_overrides = [       # ... and widgets fall back to their text (e.g. a finished progress bar)
    ("html", "application/vnd.jupyter.widget-view+json", None),
    ("html", "application/vnd.jupyter.widget-state+json", None),
]

html_theme = "sphinx_book_theme"
html_theme_options = {
    "use_download_button": True,     # each page's source: a notebook page downloads as .ipynb with its outputs
    "use_fullscreen_button": False,
    "home_page_in_toc": True,
    "show_toc_level": 2,
    "navigation_with_keys": False,
}
html_context = {"default_mode": "auto"}  # light or dark as the reader's system says (unset, the theme logs an error)
html_static_path = [str(HERE / "_static"), str(MATHJAX)]
html_css_files = ["course.css"]
html_favicon = str(HERE / "_static" / "favicon.svg")
html_show_sourcelink = False
html_copy_source = True              # the download button serves the staged source
html_last_updated_fmt = None
