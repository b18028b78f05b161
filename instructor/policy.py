"""The block policy: what the code between an assignment's markers may contain.

The grader (:mod:`instructor.grade`) takes only the code between the BEGIN and END lines of a
key's blocks from a submission, and checks every block against this policy **before** the
key's tests run. A block that breaks a rule scores 0 for its key; the feedback names the rule,
the file and the line, and the instructor's report lists the key for review. Students can run
the same check (``python instructor/grade.py`` does it first).

The assignments are tensor code: ``torch`` (and the parts of it a solution needs), ``math``,
a few pure standard-library helpers, and the course's own packages. Everything that reaches
outside that — other modules, the file system, processes, the interpreter's internals, pytest,
monkeypatching — is refused. The rules work on the syntax tree (:mod:`ast`); where a name is
one the surrounding file imported (``torch``, ``dist``, ``F``), the attribute chain after it is
followed on the real module, so ``torch.nn.functional.torch.os`` is seen to reach ``os``.

This is a wall in front of the grader, not the only one: the grader also runs each key in a
copy that holds no reference solution the key does not need, checks the test files and
pytest's internals after the run, and withholds feedback that quotes reference code
(docs/grading.md, "Threat model").

**Decided, with reasons** (each rule in :data:`RULES` carries its own):

* allowed in a block's ``import``: :data:`STDLIB` (pure helpers: ``math``, ``itertools``,
  ``functools``, ``collections``, ``random``, ...), ``torch`` and its submodules except those that
  load code, touch files or start processes (:data:`TORCH_REFUSED`), the course's part packages
  (their public names) and the course's tensor helpers (:data:`COURSE_MODULES`);
* refused although harmless-looking: ``numpy`` (torch does the same on tensors, and numpy's
  objects reach ``ctypes``, files and source printing: ``array.ctypes``, ``np.load``,
  ``np.info``), ``typing`` (``ForwardRef`` and ``get_type_hints`` evaluate strings as code, and so
  does ``functools.singledispatch`` through them), ``operator`` (``attrgetter`` walks attributes by
  a string built at run time), ``contextlib``/``warnings`` (global state the tests rely on:
  ``redirect_stdout``, ``chdir``, filters), ``string`` (``Formatter`` reads attributes by name);
* allowed from a refused module, by the file's own import only (:data:`ALLOWED_FROM_REFUSED`):
  ``contextlib.ExitStack`` and ``contextlib.nullcontext``, which enter only the context managers the
  block could enter itself (5.5.4's recomputation enters one autocast per device type);
* ``os`` only as ``os.environ`` (reading any variable, setting the rendezvous ones), because
  PyTorch's own tutorial sets ``MASTER_ADDR``/``MASTER_PORT`` that way.
"""
from __future__ import annotations

import ast
import builtins
import importlib
import re
import textwrap
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

from instructor.blocks import marked_spans, scan

# ---- the rules, each with its reason --------------------------------------------------------------

RULES: dict[str, str] = {
    "import": "imports are limited to torch (less the parts that load code, touch files or start processes), "
              "math, a few pure standard-library helpers and the course's own packages: any other module "
              "can reach the file system, processes or the grader",
    "relative-import": "a relative or star import pulls in names the policy cannot see",
    "private-import": "only the public names of the course's packages are part of an assignment",
    "builtin": "this built-in reaches outside the assignment (code execution, files, the interpreter's namespaces)",
    "dynamic-attribute": "getattr/setattr/delattr/hasattr need a literal attribute name: a name built at run time "
                         "hides what is reached",
    "dunder": "double-underscore names and attributes (__globals__, __code__, __subclasses__, __builtins__, "
              "__dict__, __mro__, ...) are the interpreter's internals, the way out of any sandbox",
    "dunder-method": "only ordinary special methods may be defined (__init__, __call__, __len__, ...); others "
                     "(__del__, __getattr__, __torch_function__, __reduce__, ...) run code at times the test "
                     "does not control",
    "module-value": "a module may only be used through its attributes (torch.zeros), never passed, stored or "
                    "returned: an alias of a module escapes the checks on its attributes",
    "refused-module": "this name comes from a module blocks may not use (files, processes, the interpreter, "
                      "pytest, ...)",
    "private-module-attribute": "private attributes of modules (torch._C, dist._world) are internals a solution "
                                "does not need",
    "refused-attribute": "this attribute reads or writes files, starts processes or exposes the interpreter's "
                         "frames and code (load, save, tofile, gi_frame, f_globals, mro, ...)",
    "monkeypatch": "assigning to (or deleting) an attribute or item of a module, or of anything reached through "
                   "one, changes torch, torch.distributed or the tests for everyone (monkeypatching)",
    "global": "a `global` statement rebinds names of the module, which the tests and other keys use too",
    "metaclass": "class keywords (metaclass=...) run code when the class is created",
    "format-string": "str.format/format_map with a format string built at run time reads attributes by name",
    "environment": "os.environ: any variable may be read; only the rendezvous variables (MASTER_ADDR, "
                   "MASTER_PORT, WORLD_SIZE, RANK, LOCAL_RANK, LOCAL_WORLD_SIZE) may be set",
    "block-scope": "the code must stay inside the function its block sits in (a dedent would put it at module "
                   "level, outside every rule)",
    "syntax": "the block must parse",
}


@dataclass(frozen=True)
class Violation:
    """One broken rule: ``rule`` (a key of :data:`RULES`), the 1-based ``line`` in the block's file, and what."""

    rule: str
    line: int
    detail: str

    def describe(self, where: str = "") -> str:
        place = f"{where}:{self.line}" if where else f"line {self.line}"
        return f"{place}: {self.detail} [rule '{self.rule}': {RULES[self.rule]}]"


# ---- what is allowed and refused ---------------------------------------------------------------

STDLIB = frozenset({"math", "cmath", "itertools", "functools", "collections", "collections.abc", "dataclasses",
                    "copy", "heapq", "bisect", "random", "datetime", "time", "numbers", "enum", "statistics"})
COURSE_MODULES = frozenset({"course.collectives", "course.mesh", "course.loss"})
# Parts of torch that load or compile code, read or write files, start processes, rewrite torch's
# dispatch, or call other machines. Every submodule below one of these is refused too.
TORCH_REFUSED = ("torch.hub", "torch.utils.cpp_extension", "torch.utils.benchmark", "torch.utils.tensorboard",
                 "torch.utils.bottleneck", "torch.utils.collect_env", "torch.utils.file_baton", "torch.package",
                 "torch.multiprocessing", "torch.distributed.rpc", "torch.distributed.elastic", "torch.distributed.run",
                 "torch.distributed.launch", "torch.distributed.launcher", "torch.distributed.checkpoint",
                 "torch.jit", "torch.onnx", "torch.library", "torch.ops", "torch.classes", "torch.compiler",
                 "torch.export", "torch.serialization", "torch.overrides", "torch.fx", "torch.profiler",
                 "torch.autograd.profiler", "torch.testing._internal")
# Modules whose functions and classes a block may not use, however it reaches them.
REFUSED_ROOTS = frozenset({"os", "sys", "gc", "inspect", "ctypes", "builtins", "subprocess", "signal", "threading",
                           "_thread", "multiprocessing", "concurrent", "asyncio", "importlib", "pathlib", "shutil",
                           "io", "socket", "pickle", "marshal", "types", "code", "codeop", "runpy", "pytest",
                           "_pytest", "pluggy", "tempfile", "atexit", "weakref", "glob", "posix", "pty", "operator",
                           "string", "contextlib", "warnings", "traceback", "linecache", "tokenize", "zipimport",
                           "pkgutil", "site", "sysconfig", "faulthandler", "resource", "fcntl", "mmap", "select",
                           "selectors", "urllib", "http", "json", "shelve", "dbm", "sqlite3", "zipfile", "tarfile",
                           "gzip", "bz2", "lzma", "zlib", "base64", "binascii", "codecs", "platform", "getpass",
                           "logging", "unittest", "doctest", "pdb", "bdb", "dis", "ast", "copyreg", "queue",
                           "typing", "numpy", "transformers", "datasets", "tokenizers", "nbformat", "nbclient", "course.launch",
                           "course.data", "course.checkpoint", "course.results", "course.tree", "course.assignments",
                           "course.rank_watch", "course.cli", "course.config", "course.launch_pool", "instructor", "project",
                           "website", "tests"})
# Names of a refused module a block may still use through the file's own import of the module: they reach
# nothing the block could not reach itself (each is a whole dotted name; their dunder attributes stay refused).
ALLOWED_FROM_REFUSED = frozenset({"contextlib.ExitStack", "contextlib.nullcontext"})
REFUSED_BUILTINS = frozenset({"__import__", "eval", "exec", "compile", "open", "input", "breakpoint", "globals",
                              "locals", "vars", "dir", "help", "exit", "quit", "memoryview", "copyright", "credits",
                              "license"})
ATTRIBUTE_BUILTINS = frozenset({"getattr", "setattr", "delattr", "hasattr"})
REFUSED_ATTRIBUTES = frozenset({
    # the interpreter's frames and code objects
    "gi_frame", "gi_code", "gi_yieldfrom", "cr_frame", "cr_code", "cr_await", "ag_frame", "ag_code", "ag_await",
    "f_globals", "f_locals", "f_builtins", "f_back", "f_code", "f_trace", "tb_frame", "tb_next", "co_code",
    "co_consts", "co_names", "func_globals", "func_code", "mro",
    # files, processes, code loading
    "load", "loads", "save", "savez", "savez_compressed", "loadtxt", "savetxt", "genfromtxt", "fromfile", "tofile",
    "from_file", "memmap", "open_memmap", "dump", "dumps", "DataSource", "load_library", "load_inline",
    "compile", "system", "popen", "spawn", "fork", "kill", "execv", "execve", "environb", "putenv",
    "write_text", "write_bytes", "read_text", "read_bytes", "unlink", "rmtree", "mkdir", "chmod",
    "format_map", "from_pretrained", "save_pretrained", "push_to_hub", "FileStore",
    # ways to C and to code held in strings
    "ctypes", "_ctypes", "numpy", "singledispatch", "singledispatchmethod", "get_type_hints", "ForwardRef",
    "_evaluate", "_getframe", "_current_frames"})
ALLOWED_DUNDER_METHODS = frozenset({"__init__", "__call__", "__len__", "__getitem__", "__iter__", "__next__",
                                    "__repr__", "__str__", "__enter__", "__exit__", "__contains__", "__post_init__"})
ENV_WRITABLE = frozenset({"MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE"})
_DUNDER = re.compile(r"__\w+__")
_MISSING = object()


def _is_dunder(name: str) -> bool:
    return name.startswith("__") and name.endswith("__") and len(name) > 4


def _root_refused(dotted: str) -> bool:
    return any(dotted == r or dotted.startswith(r + ".") for r in REFUSED_ROOTS) or \
        any(dotted == t or dotted.startswith(t + ".") for t in TORCH_REFUSED)


def course_parts(root: Path | None = None) -> frozenset[str]:
    """The course's part packages: the tree's top-level packages other than the shared library, the scripts,
    the instructor tools, the course's site builder and the tests (new parts are taken up automatically)."""
    root = Path(__file__).resolve().parent.parent if root is None else root
    return frozenset(p.name for p in root.iterdir() if (p / "__init__.py").is_file()) - {
        "course", "project", "instructor", "website", "tests"}


def module_allowed(name: str, parts: frozenset[str]) -> bool:
    """Whether a block may import (or reach) the module ``name``."""
    if any(part.startswith("_") for part in name.split(".")) or _root_refused(name):
        return False
    if name in STDLIB or name in COURSE_MODULES:
        return True
    return name == "torch" or name.startswith("torch.") or name.split(".")[0] in parts


_RESOLVED: dict[str, object] = {}


def _resolve(dotted: str, parts: frozenset[str]) -> object:
    """The object a dotted name stands for, when its root is a module a block may import (never imports any
    other module); :data:`_MISSING` when it cannot be told."""
    if dotted in _RESOLVED:
        return _RESOLVED[dotted]
    names = dotted.split(".")
    found = _MISSING
    for n in range(len(names), 0, -1):  # the longest importable prefix, then attributes
        prefix = ".".join(names[:n])
        if not module_allowed(prefix, parts):
            continue
        try:
            obj = importlib.import_module(prefix)
        except Exception:  # noqa: BLE001 - not a module (or not importable): try a shorter prefix
            continue
        for attr in names[n:]:
            obj = getattr(obj, attr, _MISSING)
            if obj is _MISSING:
                break
        found = obj
        break
    _RESOLVED[dotted] = found
    return found


def _refused_object(obj: object, parts: frozenset[str]) -> str | None:
    """Why a block may not use ``obj`` (None if it may)."""
    if isinstance(obj, ModuleType):
        return None if module_allowed(obj.__name__, parts) else f"the module {obj.__name__}"
    for name in REFUSED_BUILTINS | ATTRIBUTE_BUILTINS:
        if obj is getattr(builtins, name, None):
            return f"the built-in {name}"
    module = getattr(obj, "__module__", None)
    if isinstance(module, str) and _root_refused(module):
        return f"{getattr(obj, '__qualname__', obj)!s} of {module}"
    return None


# ---- the scaffolding's names ---------------------------------------------------------------------

def scaffolding_bindings(source: str) -> dict[str, str]:
    """Names the file binds by ``import`` statements outside its blocks, module or function level:
    ``{"dist": "torch.distributed", "F": "torch.nn.functional", "Path": "pathlib.Path", ...}``.
    A block may use them as long as what they stand for is allowed."""
    kept = source.split("\n")
    for block in marked_spans(kept):  # the block's code is left out; a `pass` keeps its function's body valid
        kept[block.begin:block.end + 1] = [block.indent + "pass"] + [""] * (block.end - block.begin)
    tree = ast.parse("\n".join(kept))  # the instructor's file: it parses
    bound: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                bound[alias.asname or alias.name.split(".")[0]] = alias.name if alias.asname else alias.name.split(".")[0]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                bound[alias.asname or alias.name] = f"{node.module}.{alias.name}"
    return bound


# ---- the check ---------------------------------------------------------------------------------

class _Checker(ast.NodeVisitor):
    def __init__(self, bindings: dict[str, str], parts: frozenset[str], offset: int):
        self.bindings = dict(bindings)          # name -> dotted target (scaffolding's and the block's imports)
        self.parts = parts
        self.offset = offset
        self.found: list[Violation] = []
        self.parents: dict[ast.AST, ast.AST] = {}
        self.class_depth = 0

    def refuse(self, rule: str, node: ast.AST, detail: str) -> None:
        self.found.append(Violation(rule, getattr(node, "lineno", 1) + self.offset, detail))

    # -- chains of names and attributes --
    def chain(self, node: ast.AST) -> tuple[str, list[str]] | None:
        """``("torch", ["nn", "functional"])`` for ``torch.nn.functional``; None if not rooted at a name."""
        attrs = []
        while isinstance(node, ast.Attribute):
            attrs.append(node.attr)
            node = node.value
        return (node.id, attrs[::-1]) if isinstance(node, ast.Name) else None

    def is_module_rooted(self, node: ast.AST) -> bool:
        while isinstance(node, (ast.Attribute, ast.Subscript)):
            node = node.value
        if not isinstance(node, ast.Name) or node.id not in self.bindings:
            return False
        target = self.bindings[node.id]
        return isinstance(_resolve(target, self.parts), ModuleType) or _root_refused(target)

    def outermost(self, node: ast.AST) -> ast.AST:
        while isinstance(self.parents.get(node), ast.Attribute) and self.parents[node].value is node:
            node = self.parents[node]
        return node

    def check_chain(self, name: ast.Name) -> None:
        """Follow ``name.a.b...`` on the real objects when ``name`` is an imported name."""
        top = self.outermost(name)
        root, attrs = self.chain(top)
        target = self.bindings[root]
        if target == "os" or target.startswith("os."):
            self.check_environ(name, target, attrs)
            return
        if ".".join([target, *attrs[:1]]) in ALLOWED_FROM_REFUSED and len(attrs) == 1:
            return
        if _root_refused(target):
            self.refuse("refused-module", name, f"'{root}' is {target}")
            return
        obj = _resolve(target, self.parts)
        if obj is _MISSING:  # not importable here: the scaffolding's course modules pass, anything else is refused
            if target.split(".")[0] != "course" and not module_allowed(target.split(".")[0], self.parts):
                self.refuse("refused-module", name, f"'{root}' is {target}")
            return
        for i in range(len(attrs) + 1):
            why = _refused_object(obj, self.parts)
            if why:
                self.refuse("refused-module", name, f"'{'.'.join([root, *attrs[:i]])}' is {why}")
                return
            if i == len(attrs):
                break
            if isinstance(obj, ModuleType) and attrs[i].startswith("_"):
                self.refuse("private-module-attribute", name, f"'{'.'.join([root, *attrs[:i + 1]])}'")
                return
            obj = getattr(obj, attrs[i], _MISSING)
            if obj is _MISSING:
                return
        if isinstance(obj, ModuleType):
            parent = self.parents.get(top)
            if not isinstance(parent, ast.Attribute):
                self.refuse("module-value", name, f"the module '{'.'.join([root, *attrs])}' is used as a value")

    def check_environ(self, name: ast.Name, target: str, attrs: list[str]) -> None:
        if target != "os" or attrs[:1] not in (["environ"], ["getenv"]):
            self.refuse("refused-module", name, f"'{name.id}' is {target}: only os.environ may be used")
            return
        if attrs == ["getenv"] or attrs == ["environ", "get"]:
            if isinstance(self.parents.get(self.outermost(name)), ast.Call):
                return
        top = self.outermost(name)
        parent = self.parents.get(top)
        if attrs == ["environ"] and isinstance(parent, ast.Subscript) and parent.value is top:
            key = parent.slice
            if not (isinstance(key, ast.Constant) and isinstance(key.value, str)):
                self.refuse("environment", name, "os.environ needs a literal variable name")
            elif isinstance(parent.ctx, (ast.Store, ast.Del)) and key.value not in ENV_WRITABLE:
                self.refuse("environment", name, f"os.environ[{key.value!r}] may not be set")
            return
        self.refuse("environment", name, f"'{'.'.join([name.id, *attrs])}' is not a read of os.environ "
                                         "or a write of a rendezvous variable")

    # -- nodes --
    def generic_visit(self, node):
        for child in ast.iter_child_nodes(node):
            self.parents[child] = node
        super().generic_visit(node)

    def visit_Import(self, node):
        for alias in node.names:
            if not module_allowed(alias.name, self.parts) or (
                    not alias.asname and not module_allowed(alias.name.split(".")[0], self.parts)):
                self.refuse("import", node, f"import of {alias.name}")
            # bound either way: the uses of a refused module are named too
            self.bindings[alias.asname or alias.name.split(".")[0]] = \
                alias.name if alias.asname else alias.name.split(".")[0]
        self.generic_visit(node)

    def visit_ImportFrom(self, node):
        if node.level or any(a.name == "*" for a in node.names):
            self.refuse("relative-import", node, f"from {'.' * node.level}{node.module or ''} import "
                                                 f"{', '.join(a.name for a in node.names)}")
        elif not module_allowed(node.module, self.parts):
            self.refuse("import", node, f"import from {node.module}")
            for alias in node.names:  # bound: the uses of what a refused import brought are named too
                self.bindings[alias.asname or alias.name] = f"{node.module}.{alias.name}"
        else:
            for alias in node.names:
                dotted = f"{node.module}.{alias.name}"
                if alias.name.startswith("_"):
                    self.refuse("private-import", node, f"from {node.module} import {alias.name}")
                    continue
                obj = _resolve(dotted, self.parts)
                why = _refused_object(obj, self.parts) if obj is not _MISSING else None
                if why or (isinstance(obj, ModuleType) and not module_allowed(obj.__name__, self.parts)):
                    self.refuse("import", node, f"from {node.module} import {alias.name} ({why})")
                    continue
                self.bindings[alias.asname or alias.name] = dotted
        self.generic_visit(node)

    def visit_Name(self, node):
        if _is_dunder(node.id):
            self.refuse("dunder", node, f"the name {node.id}")
        elif node.id in REFUSED_BUILTINS and node.id not in self.bindings:
            self.refuse("builtin", node, f"{node.id}")
        elif node.id in ATTRIBUTE_BUILTINS:
            parent = self.parents.get(node)
            if not (isinstance(parent, ast.Call) and parent.func is node):
                self.refuse("dynamic-attribute", node, f"{node.id} used as a value")
        elif node.id in self.bindings:
            self.check_chain(node)
        self.generic_visit(node)

    def visit_Attribute(self, node):
        if _is_dunder(node.attr):
            call = node.value
            if not (node.attr in ALLOWED_DUNDER_METHODS and isinstance(call, ast.Call)
                    and isinstance(call.func, ast.Name) and call.func.id == "super"):
                self.refuse("dunder", node, f"the attribute .{node.attr}")
        elif node.attr in REFUSED_ATTRIBUTES:
            self.refuse("refused-attribute", node, f"the attribute .{node.attr}")
        elif node.attr == "format" and not (isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)):
            self.refuse("format-string", node, ".format on a string that is not a literal")
        if isinstance(node.ctx, (ast.Store, ast.Del)) and self.is_module_rooted(node):
            if not self.is_environ(node):
                self.refuse("monkeypatch", node, f"assignment to '{ast.unparse(node)}'")
        self.generic_visit(node)

    def is_environ(self, node) -> bool:
        return False  # os.environ itself is never assigned; its items are checked in check_environ

    def visit_Subscript(self, node):
        if isinstance(node.ctx, (ast.Store, ast.Del)) and self.is_module_rooted(node):
            root = self.chain(node.value)
            if not (root and self.bindings.get(root[0]) == "os" and root[1] == ["environ"]):
                self.refuse("monkeypatch", node, f"assignment to '{ast.unparse(node)}'")
        self.generic_visit(node)

    def visit_Call(self, node):
        if isinstance(node.func, ast.Name) and node.func.id in ATTRIBUTE_BUILTINS and node.func.id not in self.bindings:
            name = node.args[1] if len(node.args) > 1 else None
            if not (isinstance(name, ast.Constant) and isinstance(name.value, str)):
                self.refuse("dynamic-attribute", node, f"{node.func.id} with an attribute name that is not a literal")
            elif _is_dunder(name.value) or name.value in REFUSED_ATTRIBUTES:
                self.refuse("dunder" if _is_dunder(name.value) else "refused-attribute", node,
                            f"{node.func.id}(..., {name.value!r})")
        self.generic_visit(node)

    def visit_Constant(self, node):
        if isinstance(node.value, (str, bytes)):
            text = node.value if isinstance(node.value, str) else node.value.decode("latin-1")
            found = _DUNDER.search(text)
            if found:
                self.refuse("dunder", node, f"the string {found.group(0)!r}")
        self.generic_visit(node)

    def visit_Global(self, node):
        self.refuse("global", node, f"global {', '.join(node.names)}")
        self.generic_visit(node)

    def visit_ClassDef(self, node):
        if node.keywords:
            self.refuse("metaclass", node, f"class {node.name}({', '.join(ast.unparse(k) for k in node.keywords)})")
        if _is_dunder(node.name):
            self.refuse("dunder", node, f"class {node.name}")
        self.class_depth += 1
        self.generic_visit(node)
        self.class_depth -= 1

    def visit_FunctionDef(self, node):
        if _is_dunder(node.name):
            if not (self.class_depth and node.name in ALLOWED_DUNDER_METHODS):
                self.refuse("dunder-method", node, f"def {node.name}")
        depth, self.class_depth = self.class_depth, 0  # a class nested in a function starts again
        self.check_arguments(node.args, node)
        self.generic_visit(node)
        self.class_depth = depth

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_Lambda(self, node):
        self.check_arguments(node.args, node)
        self.generic_visit(node)

    def check_arguments(self, args: ast.arguments, node) -> None:
        for arg in args.posonlyargs + args.args + args.kwonlyargs + [a for a in (args.vararg, args.kwarg) if a]:
            if _is_dunder(arg.arg):
                self.refuse("dunder", node, f"the argument {arg.arg}")

    def visit_MatchClass(self, node):
        for attr in node.kwd_attrs:
            if _is_dunder(attr) or attr in REFUSED_ATTRIBUTES:
                self.refuse("dunder" if _is_dunder(attr) else "refused-attribute", node, f"pattern attribute {attr}")
        self.generic_visit(node)

    def visit_alias(self, node):
        if node.asname and _is_dunder(node.asname):
            self.refuse("dunder", node, f"import as {node.asname}")


def check_block(code: str, bindings: dict[str, str] | None = None, first_line: int = 1,
                parts: frozenset[str] | None = None) -> list[Violation]:
    """The rules ``code`` (one block's body, any indentation) breaks, with line numbers counted from
    ``first_line`` (the block's first line in its file). ``bindings``: the file's imported names
    (:func:`scaffolding_bindings`)."""
    parts = course_parts() if parts is None else parts
    try:
        tree = ast.parse(textwrap.dedent(code))
    except SyntaxError as exc:
        return [Violation("syntax", (exc.lineno or 1) + first_line - 1, f"does not parse: {exc.msg}")]
    checker = _Checker(bindings or {}, parts, first_line - 1)
    checker.visit(tree)
    return sorted(set(checker.found), key=lambda v: (v.line, v.rule, v.detail))


def check_scope(spliced_source: str, first: int, last: int, indent: int) -> list[Violation]:
    """The student's lines ``first``..``last`` (1-based) of the spliced file stay inside the block: every
    statement starts at least ``indent`` columns in (the BEGIN marker's indentation, so it sits in the
    block's function), and the code ends there — no bracket, string or statement left open that would
    take in the instructor's code after the END line.

    Raises nothing; returns the ``block-scope`` violation, if any.
    """
    if last < first:
        return []
    import io
    import tokenize

    skip = {tokenize.NL, tokenize.COMMENT, tokenize.INDENT, tokenize.DEDENT, tokenize.ENCODING}
    line_start, last_kind = True, None
    try:
        for tok in tokenize.generate_tokens(io.StringIO(spliced_source).readline):
            if tok.type in skip:
                continue
            row, col = tok.start
            if first <= row <= last:
                if tok.end[0] > last or (line_start and col < indent):
                    return [Violation("block-scope", row, "the code leaves its block: check the indentation of "
                                                          "every line, and close every bracket and string")]
                last_kind = tok.type
            line_start = tok.type == tokenize.NEWLINE
            if row > last:
                break
    except (tokenize.TokenError, IndentationError, SyntaxError) as exc:
        return [Violation("block-scope", first, f"the code does not tokenize: {exc}")]
    if last_kind not in (None, tokenize.NEWLINE):
        return [Violation("block-scope", last, "the block's last statement is not finished (an open bracket, "
                                               "string or line continuation)")]
    return []


def reference_blocks(root: Path):
    """``(file, first line, marker, code)`` of every block of the tree ``root``'s Python files (instructor-only
    files left out; :func:`instructor.blocks.scan`)."""
    for block in scan(root, python_only=True)[0]:
        yield block.file, block.line + 1, block.marker, "\n".join(block.body)
