"""A small course tree for the site's tests: one notebook executed by Jupyter (a plot, a table, math,
printed text, a progress-bar widget, a printed line and a table wider than the page), a guide with math, a
README, and a package and a notebook cell holding a reference block.

It proves what the real course cannot show until its notebooks are committed with outputs: that the
outputs Jupyter writes (PNG plots, HTML tables, LaTeX) reach the page and render. The markers are
spelled apart here so that this file holds no block of its own.
"""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path


from instructor.keys import KEYS

BEGIN, END = "# " + "BEGIN ASSIGN5_1_1", "# " + "END ASSIGN5_1_1"
NOTEBOOK = "notebooks/01_demo.ipynb"
KEY = dataclasses.replace(KEYS["a5_1_1"], notebook=NOTEBOOK)
FAKE_KEYS = {KEY.key: KEY}
# Lines of the reference solutions below: the site must not show them.
PACKAGE_SECRET = "squares_of_values = [value * value for value in values]"
CELL_SECRET = "hidden_total = sum(v * 3 for v in range(7))"

README = """# Demo course

## Set up and check

```bash
pip install -r requirements.txt
```

## For students: grade yourself

```bash
pytest -k a5_1_1
```

## Running on GPUs

Read [the guide](docs/guide.md) and [the solver](demo/solve.py).
"""

GUIDE = """# A guide

The α–β model: $t(n) = \\alpha + \\beta n$, and for a ring

$$t_{ring} = 2 (p - 1) \\left(\\alpha + \\frac{n}{p} \\beta\\right)$$

Back to [the notebook](../notebooks/01_demo.ipynb).
"""

SOLVE = f'''"""Demo part: the file where assignment 5.1.1 of the demo is solved."""


def solve(values):
    """The sum of the squares of ``values``."""
    {BEGIN}
    {PACKAGE_SECRET}
    return sum(squares_of_values)
    {END}
'''

CELLS = [
    ("markdown", "# 1. A demo part\n\nInline math $g = \\frac{1}{p} \\sum_r g_r$ and a display:\n\n"
                 "$$\\text{bus bandwidth} = \\frac{2 (p - 1)}{p} \\cdot \\frac{n}{t}$$\n"),
    ("code", "print('measured on this machine')"),
    ("code", "%matplotlib inline\nimport matplotlib.pyplot as plt\nplt.plot([1, 2, 4], [1.0, 1.8, 3.1], marker='o')\n"
             "plt.title('a measured curve')\nplt.show()"),
    ("code", "import pandas as pd\npd.DataFrame({'ranks': [2, 4], 'seconds': [0.25, 0.5]})"),
    ("code", "from IPython.display import Math, display\ndisplay(Math(r'\\alpha + \\beta n'))"),
    ("code", "from tqdm.auto import tqdm\nfor _ in tqdm(range(3), desc='steps'):\n    pass"),  # a Jupyter widget
    ("code", "print('  '.join(f'column {i:2d}' for i in range(40)))"),  # a printed line wider than the page
    ("code", "pd.DataFrame({f'a long column name {i}': [i, 2 * i] for i in range(16)})"),  # a wide table
    ("code", f"{BEGIN}\n{CELL_SECRET}\n{END}\nprint('cell ran')"),
    ("markdown", "See [the guide](../docs/guide.md) and [the solver](../demo/solve.py)."),
]


def make_course(root: Path, readme: str = README, guide: str = GUIDE) -> Path:
    """Write the demo course into ``root`` and execute its notebook there; returns ``root``."""
    (root / "notebooks").mkdir(parents=True)
    (root / "docs").mkdir()
    (root / "demo").mkdir()
    (root / "README.md").write_text(readme)
    (root / "docs" / "guide.md").write_text(guide)
    (root / "demo" / "__init__.py").write_text('"""Demo part: the package of the demo\'s assignment."""\n')
    (root / "demo" / "solve.py").write_text(SOLVE)
    import nbformat  # here, not at the top: collecting the tests (``pytest -k KEY``) should not pay for it
    from nbclient import NotebookClient

    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_markdown_cell(s) if kind == "markdown" else nbformat.v4.new_code_cell(s)
                for kind, s in CELLS]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    NotebookClient(nb, timeout=120, kernel_name="python3", resources={"metadata": {"path": str(root)}}).execute()
    (root / NOTEBOOK).write_text(json.dumps(nb, indent=1))
    return root
