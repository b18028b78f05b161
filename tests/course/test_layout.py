"""The repository's layout rules (docs/architecture.md), checked on the source.

* Arrows point one way: the shared library (``course``) imports no part, no script and no
  instructor tool; a part imports the shared library and itself — another part only
  through that part's public package (``import tensor_parallel``), never its internals —
  and no script; the instructor tools import the shared library only. Every import counts,
  also the ones inside functions.
* No import cycle between the modules.
* A module's private (underscore) names are its own: no module imports one from another
  (``from course.launch import _free_port``) or reads one through a module it imported
  (``collectives._NAMES``), and no module is handed another module object
  (``sys.modules[__name__]``, or an imported module passed to a call): what a module offers
  another is a public name.
* Library modules leave ``sys.path`` alone; only entry points (a script's
  ``if __name__ == "__main__":`` block, and ``modal_run.py``, which Modal imports) put their
  own tree first.
* Every communication call in a part names its group: ``torch.distributed`` collectives and
  point-to-point calls pass ``group=``, and every call of a function of the course that
  takes a ``group`` passes one.
* One per-epoch routine: only :mod:`course.epoch_runner` trains epochs, evaluates, scores
  BLEU and writes results files.
* The keys are declared once (``instructor/keys.py``): pytest's markers come from there,
  and the README's table lists exactly those keys.
* No alias machinery and no former names: nothing in the tree keeps an old name working or teaches one.
* Each option is declared once: the run configuration's table (``course.config.RunConfig``), the modes'
  configurations, the benchmark harness, the benchmarks and measuring tools, and the planner's command line
  together declare every ``--option`` one time; the others take it from the table.
* No module holds more than about 500 lines: 400 lines of code (docstrings, comments, blank lines and module-level
  data tables left out).
* Each part keeps its notebooks' workers, benchmarks and exercise checks in its ``labs/`` subpackage: no assignment
  block there, none of them outside it, and no module of the part outside ``labs/`` imports it.
"""
from __future__ import annotations

import ast
import re
from functools import lru_cache
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
LIBRARY = "course"
PARTS = ("data_parallel", "pipeline", "tensor_parallel", "communication", "memory", "three_d", "context_parallel", "moe",
         "fault_tolerance")
TOOLS = "instructor"
SCRIPTS = ("project", "modal_run")
SITE = "website"  # the site builder (instructor-side, like the tools; it may import them)
PACKAGES = (LIBRARY, *PARTS, TOOLS, "project", SITE)

COMM_CALLS = {"all_reduce", "all_gather", "reduce_scatter", "broadcast", "barrier", "send", "recv", "isend", "irecv",
              "all_gather_object", "broadcast_object_list", "gather", "scatter", "reduce", "all_to_all",
              "all_to_all_single", "batch_isend_irecv", "P2POp"}


def module_files() -> dict[str, Path]:
    files = {"modal_run": REPO / "modal_run.py"}
    for package in PACKAGES:
        for path in sorted((REPO / package).rglob("*.py")):
            parts = path.relative_to(REPO).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            files[name] = path
    return files


FILES = module_files()
TREES = {name: ast.parse(path.read_text(), filename=str(path)) for name, path in FILES.items()}


def imports_of(name: str) -> set[str]:
    """The course modules ``name`` imports (the most specific one of each import)."""
    found = set()
    for node in ast.walk(TREES[name]):
        if isinstance(node, ast.ImportFrom):
            assert node.level == 0, f"{name}: relative import (use absolute imports)"
            targets = [f"{node.module}.{a.name}" for a in node.names] + [node.module]
            for target in targets:  # `from a.b import c`: module a.b.c if it exists, else a.b
                if target in FILES:
                    found.add(target)
                    break
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name in FILES)
    return found


GRAPH = {name: imports_of(name) for name in FILES}


def top(name: str) -> str:
    return name.split(".")[0]


def test_the_layers_import_downwards_only():
    wrong = []
    for name, targets in GRAPH.items():
        for target in targets:
            src, dst = top(name), top(target)
            if src == dst:
                continue
            if src == LIBRARY:
                wrong.append(f"{name} (shared library) imports {target}")
            elif src in PARTS and (dst in (TOOLS, *SCRIPTS) or (dst in PARTS and target != dst)):
                wrong.append(f"{name} (a part) imports {target}" + (" (another part's internals: use its package)"
                                                                   if dst in PARTS else ""))
            elif src == TOOLS and dst != LIBRARY:
                wrong.append(f"{name} (instructor tools) imports {target}")
    assert not wrong, "imports that point the wrong way:\n" + "\n".join(sorted(wrong))


def test_no_import_cycles():
    index, low, stack, on_stack, cycles = {}, {}, [], set(), []

    def visit(v):  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in GRAPH[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1 or v in GRAPH[v]:
                cycles.append(sorted(component))

    for v in GRAPH:
        if v not in index:
            visit(v)
    assert not cycles, f"import cycles: {cycles}"


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _module_names(name: str) -> dict[str, str]:
    """The names a module binds to course modules by its imports (any level): ``{"L": "course.launch", ...}``."""
    bound = {}
    for node in _nodes(name):
        if isinstance(node, ast.ImportFrom) and node.module:
            bound.update({a.asname or a.name: f"{node.module}.{a.name}" for a in node.names
                          if f"{node.module}.{a.name}" in FILES})
        elif isinstance(node, ast.Import):
            bound.update({a.asname: a.name for a in node.names if a.asname and a.name in FILES})
            bound.update({a.name.split(".")[0]: a.name.split(".")[0] for a in node.names
                          if not a.asname and a.name.split(".")[0] in FILES})
    return bound


def _dotted(node) -> str | None:
    """``a.b.c`` for an attribute chain on a name, else None."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    return ".".join([node.id, *reversed(parts)]) if isinstance(node, ast.Name) else None


def _course_module(dotted: str | None, bound: dict[str, str]) -> str | None:
    """The course module an expression such as ``collectives`` or ``course.collectives`` stands for, if any."""
    if dotted is None:
        return None
    head, _, rest = dotted.partition(".")
    target = bound[head] + (f".{rest}" if rest else "") if head in bound else None
    return target if target in FILES else None


@lru_cache(maxsize=None)
def _nodes(name: str) -> tuple:
    return tuple(ast.walk(TREES[name]))


def test_no_module_uses_another_modules_private_names():
    wrong = []
    for name in TREES:
        bound = _module_names(name)
        for node in _nodes(name):
            if isinstance(node, ast.ImportFrom) and node.module in FILES:
                wrong += [f"{FILES[name].relative_to(REPO)}:{node.lineno} from {node.module} import {a.name}"
                          for a in node.names if _private(a.name) and f"{node.module}.{a.name}" not in FILES]
            elif isinstance(node, ast.Attribute) and _private(node.attr):
                owner = _course_module(_dotted(node.value), bound)
                if owner is not None and owner != name:
                    wrong.append(f"{FILES[name].relative_to(REPO)}:{node.lineno} {_dotted(node)}")
    assert not wrong, "private names used across modules (give the owner a public name):\n" + "\n".join(wrong)


def test_no_module_is_handed_another_module():
    wrong = []
    for name in TREES:
        bound = _module_names(name)
        for node in _nodes(name):
            if isinstance(node, ast.Subscript) and _dotted(node.value) == "sys.modules":
                wrong.append(f"{FILES[name].relative_to(REPO)}:{node.lineno} {ast.unparse(node)}")
            elif isinstance(node, ast.Call):
                for arg in [*node.args, *(k.value for k in node.keywords)]:
                    if _course_module(_dotted(arg), bound) is not None:
                        wrong.append(f"{FILES[name].relative_to(REPO)}:{node.lineno} {ast.unparse(node)[:80]}")
    assert not wrong, "module objects handed to code (hand over public functions or an object instead):\n" + \
        "\n".join(wrong)


def _is_main_guard(node) -> bool:
    return (isinstance(node, ast.If) and isinstance(node.test, ast.Compare)
            and isinstance(node.test.left, ast.Name) and node.test.left.id == "__name__"
            and any(isinstance(c, ast.Constant) and c.value == "__main__" for c in node.test.comparators))


def test_only_entry_points_touch_sys_path():
    wrong = []
    for name, tree in TREES.items():
        guarded = {id(n) for g in ast.walk(tree) if _is_main_guard(g) for n in ast.walk(g)}
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and node.attr == "path" and getattr(node.value, "id", "") == "sys":
                if name != "modal_run" and id(node) not in guarded:
                    wrong.append(f"{FILES[name].relative_to(REPO)}:{node.lineno}")
    assert not wrong, "sys.path used outside an `if __name__ == '__main__':` entry point: " + ", ".join(wrong)


def _functions_with_group() -> dict[str, int]:
    """Names of the course's functions/classes that take ``group``: name -> its positional index."""
    found = {}
    for name, tree in TREES.items():
        if top(name) not in (LIBRARY, *PARTS):
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                init = next((n for n in node.body if isinstance(n, ast.FunctionDef) and n.name == "__init__"), None)
                args = [a.arg for a in init.args.args[1:]] if init else []
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and not node.name.startswith("_"):
                args = [a.arg for a in node.args.args]
                if args and args[0] in ("self", "cls", "ctx"):
                    continue  # methods are called on objects that already hold their group
            else:
                continue
            if "group" in args:
                found[node.name] = args.index("group")
    return found


def test_every_communication_in_the_parts_names_its_group():
    takes_group = _functions_with_group()
    assert {"all_reduce", "average_gradients", "StageRunner", "ColumnParallelLinear"} <= set(takes_group)
    wrong = []
    for name, tree in TREES.items():
        if top(name) not in PARTS:
            continue
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call):
                continue
            func = node.func
            called = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
            via_dist = isinstance(func, ast.Attribute) and getattr(func.value, "id", "") in ("dist", "distributed")
            keywords = {k.arg for k in node.keywords}
            if isinstance(func, ast.Attribute) and getattr(func.value, "id", "") == "self":
                continue  # a method of an object that holds its group (e.g. StageRunner.recv)
            if via_dist and called in COMM_CALLS:
                ok = "group" in keywords
            elif not via_dist and called in takes_group:
                ok = "group" in keywords or len(node.args) > takes_group[called] or any(
                    isinstance(a, ast.Starred) for a in node.args)
            else:
                continue
            if not ok:
                wrong.append(f"{FILES[name].relative_to(REPO)}:{node.lineno} {called}(...)")
    assert not wrong, "communication without an explicit group:\n" + "\n".join(wrong)


def test_one_per_epoch_routine():
    owner = "course.epoch_runner"
    routine = {"write_results", "corpus_bleu", "evaluate_loss", "train_epoch", "translate"}
    wrong = []
    for name, tree in TREES.items():
        if name == owner:
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
                if node.func.id in routine:
                    called = node.func.id
                    wrong.append(f"{FILES[name].relative_to(REPO)}:{node.lineno} {called}")
    assert not wrong, "per-epoch work outside course.epoch_runner (use run_epochs):\n" + "\n".join(wrong)


def test_keys_are_declared_once_and_the_readme_lists_them(pytestconfig):
    from instructor.keys import KEYS

    registered = {line.split(":")[0] for line in pytestconfig.getini("markers")}
    assert set(KEYS) <= registered, "conftest.py must register a marker per key of instructor/keys.py"
    readme = (REPO / "README.md").read_text()
    listed = set(re.findall(r"^\| (a5_\d+_\d+) \|", readme, flags=re.M))
    assert listed == set(KEYS), (f"README's key table differs from instructor/keys.py: missing "
                                 f"{sorted(set(KEYS) - listed)}, unknown {sorted(listed - set(KEYS))}")
    pyproject = (REPO / "pyproject.toml").read_text()
    assert not re.search(r"^\s*\"a5_\d", pyproject, flags=re.M), "keys are listed again in pyproject.toml"


@pytest.mark.parametrize("name", sorted(n for n in FILES if top(n) != "modal_run"))
def test_docs_cited_by_the_code_exist(name):
    text = FILES[name].read_text()
    assert "COURSE_DESIGN" not in text, f"{name} cites a document outside the repository"
    for doc in re.findall(r"docs/[\w/]+\.md", text):
        assert (REPO / doc).is_file(), f"{name} cites {doc}, which does not exist"


@pytest.mark.parametrize("package", [p.parent.name for p in sorted(REPO.glob("*/__init__.py"))
                                     if p.parent.name not in ("tests", "project", "instructor")])
def test_each_package_exports_only_public_names_that_exist(package):
    """A package's ``__all__`` is its public surface: no private (underscore) name, every name defined."""
    import importlib

    module = importlib.import_module(package)
    names = getattr(module, "__all__", [])
    assert not [n for n in names if n.startswith("_")], f"{package} exports private names"
    assert not [n for n in names if not hasattr(module, n)], f"{package}.__all__ names what it does not define"


# ---- one name, declared once ----------------------------------------------------------------------------------

FORMER = re.compile("|".join(["renamed" + "_keywords", "old" + "_name", "OLD" + "_OPTIONS", "Old" + "Name",
                              "n" + "_chunk", "n" + "_micro", "tp" + "_size"]))
TEXT = (".py", ".md", ".ipynb", ".toml", ".txt", ".sbatch", ".js", ".cfg", ".yml", ".yaml")


def test_no_alias_machinery_and_no_former_names():
    """Nothing keeps a former name working (a decorator, an option alias, a table of old options) and nothing
    teaches one: the course is unreleased, a rename changes every caller."""
    skip = {".git", "workdir", "shared", "data", "build", "__pycache__", ".ipynb_checkpoints", "node_modules"}
    found = []
    for path in sorted(REPO.rglob("*")):
        relative = path.relative_to(REPO)
        if skip & set(relative.parts) or not path.name.endswith(TEXT) or not path.is_file():
            continue
        for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            if FORMER.search(line):
                found.append(f"{relative}:{number}: {line.strip()[:100]}")
    assert not found, "alias machinery or former names:\n" + "\n".join(found)


def _option_files() -> list[str]:
    """The modules whose command lines are counted: the table, the modes' configurations, the entry point, the
    harness, every part's labs (notebook workers, benchmarks), the measuring tools and the planner."""
    tools = ("project.tools.benchmark", "project.tools.gpu_report", "project.tools.parity", "project.tools.performance")
    return sorted(name for name in FILES
                  if name in ("course.config", "course.benchmarking", "project.train", *tools)
                  or name.startswith(("project.options.", "project.planner"))
                  or (top(name) in PARTS and ".labs." in f"{name}."))


def option_declarations() -> dict[str, list[str]]:
    """``{--option: [where it is declared]}``: a dataclass field made by ``option(...)`` (a configuration's) or an
    ``add_argument("--option", ...)`` with the name written out."""
    found: dict[str, list[str]] = {}
    for name in _option_files():
        where = FILES[name].relative_to(REPO)
        for node in _nodes(name):
            if (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and isinstance(node.value, ast.Call)
                    and getattr(node.value.func, "id", None) == "option"):
                found.setdefault(node.target.id, []).append(f"{where}:{node.lineno}")
            elif (isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "add_argument"
                  and any(isinstance(a, ast.Constant) and str(a.value).startswith("--") for a in node.args)):
                flag = next(a.value for a in node.args if isinstance(a, ast.Constant) and str(a.value).startswith("--"))
                found.setdefault(flag[2:], []).append(f"{where}:{node.lineno}")
    return found


def test_each_option_is_declared_once():
    declared = option_declarations()
    assert {"micro_batches", "schedule", "dp", "out", "steps", "repeats"} <= set(declared)
    twice = {name: places for name, places in declared.items() if len(places) > 1}
    assert not twice, "options declared more than once (take them from the table, course.config.RunConfig, or " \
                      "the harness, course.benchmarking):\n" + "\n".join(f"--{n}: {', '.join(p)}"
                                                                        for n, p in sorted(twice.items()))


MAX_CODE_LINES = 400  # about 500 lines with their docstrings


def code_lines(name: str) -> int:
    """Lines of code of a module: docstrings, comments, blank lines and module-level data tables (an assignment
    of a literal list, tuple, set or dict) left out."""
    import io
    import tokenize

    tree, source = TREES[name], FILES[name].read_text()
    left_out: set[int] = set()
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and body and \
                isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) and \
                isinstance(body[0].value.value, str):
            left_out.update(range(body[0].lineno, body[0].end_lineno + 1))
    for node in tree.body:
        if isinstance(node, (ast.Assign, ast.AnnAssign)) and isinstance(node.value, (ast.Dict, ast.List, ast.Tuple,
                                                                                     ast.Set)):
            left_out.update(range(node.lineno, node.end_lineno + 1))
    lines: set[int] = set()
    skip = (tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT, tokenize.ENDMARKER)
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type not in skip:
            lines.update(n for n in range(token.start[0], token.end[0] + 1) if n not in left_out)
    return len(lines)


def test_no_module_is_over_about_500_lines():
    big = {name: n for name in FILES if (n := code_lines(name)) > MAX_CODE_LINES}
    assert not big, (f"modules over {MAX_CODE_LINES} lines of code (split them by concept):\n"
                     + "\n".join(f"{FILES[n].relative_to(REPO)}: {c}" for n, c in sorted(big.items())))


LAB_NAMES = re.compile(r"(^experiments|^checks|^exercises|_benchmark|_experiment|_workers)$")


def test_each_part_keeps_its_labs_apart():
    """A part's notebook workers, benchmarks and exercise checks are in ``<part>/labs/``, which holds no assignment
    block; no module of a part outside its labs imports them (the labs use the part, never the other way)."""
    from course.blocks import marked_spans

    wrong = []
    for name, path in FILES.items():
        if top(name) not in PARTS:
            continue
        in_labs = ".labs." in f"{name}."
        if in_labs and marked_spans(path.read_text().splitlines()):
            wrong.append(f"{path.relative_to(REPO)} holds an assignment block (graded code is no lab)")
        if not in_labs and LAB_NAMES.search(name.rsplit(".", 1)[-1]):
            wrong.append(f"{path.relative_to(REPO)} is a notebook worker, benchmark or exercise check outside labs/")
        if not in_labs:
            wrong += [f"{path.relative_to(REPO)} imports {target}" for target in GRAPH[name]
                      if ".labs." in f"{target}."]
    assert not wrong, "\n".join(wrong)

