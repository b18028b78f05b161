"""The block policy (instructor/policy.py): every reference block and a few other correct solutions pass it,
and hostile blocks — each a way out of the assignment we know of — are refused with the rule that catches
them. A refused block scores its key 0 in the grader, names rule, file and line, and is listed for review,
without any test running."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from instructor.blocks import course_files, find_blocks
from instructor.keys import KEYS
from instructor.policy import RULES, check_block, check_scope, reference_blocks, scaffolding_bindings
from instructor.submission import marker_files

REPO = Path(__file__).resolve().parents[2]


def check(file: str, code: str):
    """The violations of ``code`` as a block of ``file`` (with that file's imported names)."""
    return check_block(textwrap.dedent(code), scaffolding_bindings((REPO / file).read_text()), 1)


def test_every_reference_block_passes():
    found = {}
    for name, line, marker, code in reference_blocks(REPO):
        problems = check_block(code, scaffolding_bindings((REPO / name).read_text()), line)
        if problems:
            found[f"{name}:{line} {marker}"] = [p.describe(name) for p in problems]
    assert not found, json.dumps(found, indent=1)
    assert len(list(reference_blocks(REPO))) >= len(KEYS), "every key has blocks"


# Correct solutions written differently from the reference: the policy must not refuse honest code.
OTHER_SOLUTIONS = {
    "partition with random.sample": ("data_parallel/partition.py", """
        order = random.Random(seed).sample(range(len(data)), k=len(data))
        edges = [0]
        for size in sizes:
            edges.append(edges[-1] + size)
        cuts = [min(len(data), round(e * len(data))) for e in edges]
        self.partitions = [order[a:b] for a, b in zip(cuts, cuts[1:])]
    """),
    "partition with torch's generator and itertools": ("data_parallel/partition.py", """
        import itertools

        import torch
        order = torch.randperm(len(data), generator=torch.Generator().manual_seed(seed)).tolist()
        bounds = [round(b * len(data)) for b in itertools.accumulate(sizes, initial=0.0)]
        self.partitions = [order[lo:hi] for lo, hi in itertools.pairwise(bounds)]
    """),
    "process group through init_method, reading the environment": ("data_parallel/process_group.py", """
        addr = master_addr or os.environ.get("MASTER_ADDR")
        os.environ["MASTER_PORT"] = str(master_port)
        dist.init_process_group(backend, init_method=f"tcp://{addr}:{master_port}", rank=rank,
                                world_size=world_size, timeout=datetime.timedelta(seconds=timeout_s))
    """),
    "gradient averaging flattened, with functools and collections": ("data_parallel/gradients.py", """
        import functools
        from collections import defaultdict
        by_dtype = defaultdict(list)
        for p in model.parameters():
            if p.grad is not None:
                by_dtype[p.grad.dtype].append(p)
        size = dist.get_world_size(group)
        for params in by_dtype.values():
            flat = torch.cat([p.grad.reshape(-1) for p in params])
            dist.all_reduce(flat, group=group)
            flat /= size
            offset = functools.reduce(lambda acc, _: acc, [], 0)
            for p in params:
                p.grad.copy_(flat[offset:offset + p.numel()].view_as(p.grad))
                offset += p.numel()
    """),
    "a helper module and autograd function inside the block": ("tensor_parallel/layers.py", """
        import torch.nn.functional as F2
        from tensor_parallel import copy_to_tensor_parallel_region
        from course.collectives import all_reduce

        class Scale(torch.autograd.Function):
            @staticmethod
            def forward(ctx, x):
                return x * 1.0

            @staticmethod
            def backward(ctx, grad):
                return grad

        class Wrap(nn.Module):
            def __init__(self, inner):
                super().__init__()
                self.inner = inner
                setattr(self, "scale", 1.0)

            def forward(self, x):
                return F2.linear(x, self.inner.weight)

        x = Scale.apply(copy_to_tensor_parallel_region(x, self.group))
    """),
    "checkpointing with torch.utils.checkpoint's RNG helpers": ("memory/checkpointing.py", """
        from torch.utils.checkpoint import detach_variable
        with torch.no_grad(), torch.random.fork_rng(devices=[]):
            torch.manual_seed(0)
        ctx.save_for_backward(*detach_variable(tuple(inputs)))
        return run(*inputs)
    """),
    "clock cycles with a generator and math": ("pipeline/clock_cycles.py", """
        import math
        for k in range(m + n - 1):
            first = max(0, k - m + 1)
            yield [(k - j, j) for j in range(first, min(k + 1, n)) if math.isfinite(j)]
    """),
}


@pytest.mark.parametrize("name", sorted(OTHER_SOLUTIONS))
def test_other_correct_solutions_pass(name):
    file, code = OTHER_SOLUTIONS[name]
    assert not check(file, code), [v.describe(file) for v in check(file, code)]


# Hostile blocks: (file whose block it is, code, the rule that must catch it).
HOSTILE = {
    "import os": ("pipeline/clock_cycles.py", "import os\nos.system('true')", "import"),
    "__import__": ("pipeline/clock_cycles.py", "__import__('os').system('true')", "dunder"),
    "importlib": ("pipeline/clock_cycles.py", "import importlib\nimportlib.import_module('os')", "import"),
    "eval": ("pipeline/clock_cycles.py", "eval('1 + 1')", "builtin"),
    "exec": ("pipeline/clock_cycles.py", "exec('x = 1')", "builtin"),
    "compile": ("pipeline/clock_cycles.py", "code = compile('1', 'f', 'eval')", "builtin"),
    "open a file": ("pipeline/clock_cycles.py", "text = open('/etc/passwd').read()", "builtin"),
    "a module's name built from strings": ("data_parallel/gradients.py", "d = getattr(torch, 'di' + 'st')",
                                           "dynamic-attribute"),
    "an attribute name joined at run time": ("data_parallel/gradients.py",
                                             "f = getattr(model, ''.join(['para', 'meters']))", "dynamic-attribute"),
    "getattr passed on": ("data_parallel/gradients.py", "import functools\nfunctools.reduce(getattr, ['x'], model)",
                          "dynamic-attribute"),
    "chained attribute walk to os": ("tensor_parallel/layers.py", "F.torch.os.system('true')", "refused-module"),
    "walk from torch.distributed to sys": ("data_parallel/gradients.py", "dist.sys.modules.clear()", "refused-module"),
    "type(x).__mro__": ("data_parallel/gradients.py", "base = type(model).__mro__[-1]", "dunder"),
    "subclasses of object": ("data_parallel/gradients.py", "classes = ().__class__.__base__.__subclasses__()",
                             "dunder"),
    "a function's globals": ("data_parallel/gradients.py", "g = (lambda: 0).__globals__", "dunder"),
    "__builtins__": ("data_parallel/gradients.py", "b = __builtins__", "dunder"),
    "lambda with a default argument": ("data_parallel/gradients.py", "f = lambda g=globals: g()\nf()", "builtin"),
    "default argument of a def": ("data_parallel/gradients.py", "def helper(x=open):\n    return x\nhelper()",
                                  "builtin"),
    "decorator": ("data_parallel/gradients.py", "@exec\ndef helper():\n    pass", "builtin"),
    "decorator built from a module": ("data_parallel/gradients.py", "@torch.compile\ndef helper(x):\n    return x",
                                      "refused-attribute"),
    "import pytest": ("data_parallel/gradients.py", "import pytest\npytest.skip('done')", "import"),
    "patching _pytest.runner": ("data_parallel/gradients.py", """
        import _pytest.runner as runner
        runner.call_and_report = lambda *a, **k: None
    """, "import"),
    "from _pytest import": ("data_parallel/gradients.py", "from _pytest import reports", "import"),
    "monkeypatching torch": ("data_parallel/gradients.py", "torch.allclose = lambda *a, **k: True", "monkeypatch"),
    "monkeypatching torch.distributed": ("data_parallel/gradients.py", "dist.all_reduce = lambda *a, **k: None",
                                         "monkeypatch"),
    "monkeypatching a torch class": ("data_parallel/gradients.py", "torch.Tensor.equal = lambda a, b: True",
                                     "monkeypatch"),
    "deleting from torch": ("data_parallel/gradients.py", "del torch.allclose", "monkeypatch"),
    "setattr on a module": ("data_parallel/gradients.py", "setattr(torch, 'allclose', max)", "module-value"),
    "a module aliased": ("data_parallel/gradients.py", "t = torch\nt.allclose = max", "module-value"),
    "globals()": ("data_parallel/gradients.py", "globals()['average_gradients'] = None", "builtin"),
    "locals()": ("data_parallel/gradients.py", "print(locals())", "builtin"),
    "vars()": ("data_parallel/gradients.py", "vars(torch)['allclose'] = max", "builtin"),
    "a generator's frame": ("data_parallel/gradients.py", "f = (x for x in ()).gi_frame.f_globals", "refused-attribute"),
    "mro()": ("data_parallel/gradients.py", "base = type(model).mro()[-1]", "refused-attribute"),
    "a format string reading attributes": ("data_parallel/gradients.py", "s = '{0.__globals__}'.format(len)",
                                           "dunder"),
    "a format string built at run time": ("data_parallel/gradients.py",
                                          "s = ('{0.' + '_' * 2 + 'class' + '_' * 2 + '}').format(model)",
                                          "format-string"),
    "a metaclass": ("data_parallel/gradients.py", "class M(type):\n    pass\nclass C(metaclass=M):\n    pass",
                    "metaclass"),
    "__torch_function__": ("data_parallel/gradients.py", """
        class Always(torch.Tensor):
            @classmethod
            def __torch_function__(cls, func, types, args=(), kwargs=None):
                return True
    """, "dunder-method"),
    "__del__": ("data_parallel/gradients.py", "class C:\n    def __del__(self):\n        pass", "dunder-method"),
    "global": ("data_parallel/gradients.py", "global average_gradients\naverage_gradients = None", "global"),
    "torch.load": ("data_parallel/gradients.py", "state = torch.load('/tmp/x.pt')", "refused-attribute"),
    "a file written through numpy": ("data_parallel/gradients.py", "model.weight.detach().numpy().tofile('/tmp/x')",
                                     "refused-attribute"),
    "numpy": ("data_parallel/gradients.py", "import numpy as np\nnp.load('/tmp/x.npy')", "import"),
    "ctypes through a tensor's array": ("data_parallel/gradients.py", "lib = model.weight.numpy().ctypes",
                                        "refused-attribute"),
    "code in a string annotation, evaluated by singledispatch": ("data_parallel/gradients.py", """
        import functools

        @functools.singledispatch
        def f(x):
            return x

        @f.register
        def _(x: "open('/etc/passwd')"):
            return x
    """, "refused-attribute"),
    "typing evaluates strings": ("data_parallel/gradients.py", "import typing\ntyping.ForwardRef('1')", "import"),
    "a file store": ("data_parallel/gradients.py", "dist.FileStore('/tmp/x', 1)", "refused-attribute"),
    "a C++ extension": ("data_parallel/gradients.py", "import torch.utils.cpp_extension", "import"),
    "torch.ops.load_library": ("data_parallel/gradients.py", "torch.ops.load_library('/tmp/x.so')",
                               "refused-module"),
    "private torch internals": ("data_parallel/gradients.py", "state = torch._C._get_tracing_state()",
                                "private-module-attribute"),
    "setting PYTHONPATH": ("data_parallel/process_group.py", "os.environ['PYTHONPATH'] = '/tmp'", "environment"),
    "os beyond environ": ("data_parallel/process_group.py", "os.system('true')", "refused-module"),
    "threads": ("data_parallel/gradients.py", "import threading\nthreading.Thread(target=print).start()", "import"),
    "subprocess": ("data_parallel/gradients.py", "import subprocess\nsubprocess.run(['true'])", "import"),
    "signal through torch.multiprocessing": ("data_parallel/gradients.py", "import torch.multiprocessing as mp",
                                             "import"),
    "the course's launcher": ("data_parallel/gradients.py", "from course.launch import launch", "import"),
    "the site builder (it reads the reference blocks)": ("data_parallel/gradients.py",
                                                         "from website.blocks import reference_blocks", "import"),
    "the instructor tools": ("data_parallel/gradients.py", "from instructor.grade import main", "import"),
    "a relative import": ("data_parallel/gradients.py", "from . import partition", "relative-import"),
    "a private name of a part": ("data_parallel/gradients.py", "from pipeline.clock_cycles import _clock_cycles",
                                 "private-import"),
    "pattern matching on __class__": ("data_parallel/gradients.py", """
        match model:
            case object(__class__=cls):
                pass
    """, "dunder"),
    "contextlib beyond ExitStack: stdout redirected": ("memory/checkpointing.py",
                                                      "with contextlib.redirect_stdout(None):\n    pass",
                                                      "refused-module"),
    "contextlib beyond ExitStack: the working directory": ("memory/checkpointing.py", "contextlib.chdir('/')",
                                                           "refused-module"),
    "an attribute of contextlib.ExitStack": ("memory/checkpointing.py", "f = contextlib.ExitStack.callback",
                                             "refused-module"),
    "contextlib imported by the block": ("memory/checkpointing.py", "import contextlib\ncontextlib.ExitStack()",
                                         "import"),
    "a dunder name in a string": ("data_parallel/gradients.py", "name = '__globals__'", "dunder"),
}


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_hostile_blocks_are_refused_by_their_rule(name):
    file, code, rule = HOSTILE[name]
    assert rule in RULES
    found = check(file, code)
    assert rule in {v.rule for v in found}, (f"{name}: expected rule {rule!r}, got "
                                            f"{[v.describe(file) for v in found] or 'nothing'}")
    assert all(v.line >= 1 for v in found)


def test_code_that_leaves_its_block_is_refused():
    source = (REPO / "pipeline/clock_cycles.py").read_text()
    lines = source.split("\n")
    block = next(b for b in find_blocks(lines, "x") if b.marker == "ASSIGN5_2_1")
    body = lines[block.begin + 1:block.end]
    honest = lines[:block.begin + 1] + body + lines[block.end:]
    first, last = block.begin + 2, block.begin + 1 + len(body)
    assert not check_scope("\n".join(honest), first, last, len(block.indent))
    dedented = body + ["import os", "os.system('true')", "def _after():"]  # module-level code, then a new def
    spliced = lines[:block.begin + 1] + dedented + lines[block.end:]
    assert [v.rule for v in check_scope("\n".join(spliced), first, first + len(dedented) - 1, len(block.indent))] \
        == ["block-scope"]
    unclosed = body + [block.indent + 'x = """']  # a string that swallows the code after the END line
    spliced = lines[:block.begin + 1] + unclosed + lines[block.end:] + ['"""']
    assert check_scope("\n".join(spliced), first, first + len(unclosed) - 1, len(block.indent))


def test_the_grader_scores_a_refused_block_zero_naming_rule_and_line_without_running_it(tmp_path):
    """Graded through the command line: a5_2_1's block imports pytest internals and patches the runner (the
    attack that scored 18.85 points before the policy); the key scores 0 at once, the feedback names the rule
    and the line, and the instructor's report lists it for review."""
    submission = tmp_path / "submission"
    for name in course_files(REPO):
        (submission / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / name, submission / name)
    path = submission / marker_files(REPO, "a5_2_1")[0]
    lines = path.read_text().split("\n")
    block = [b for b in find_blocks(lines, str(path)) if b.marker == "ASSIGN5_2_1"][0]
    attack = ["from _pytest import runner", "runner.call_and_report = lambda *a, **k: None",
              "for k in range(m + n - 1):", "    yield [(k - j, j) for j in range(max(0, k - m + 1), min(k + 1, n))]"]
    lines[block.begin + 1:block.end] = [block.indent + line for line in attack]
    path.write_text("\n".join(lines))
    out = tmp_path / "results.json"
    done = subprocess.run([sys.executable, str(REPO / "instructor" / "grade.py"), "--submission", str(submission),
                           "--keys", "a5_2_1", "--json", str(out)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    result = {t["name"].split(":")[0]: t for t in json.loads(out.read_text())["tests"]}["a5_2_1"]
    assert result["score"] == 0
    first = block.begin + 2
    assert f"pipeline/clock_cycles.py:{first}: import from _pytest" in result["output"], result["output"]
    assert "rule 'import'" in result["output"]
    assert f"pipeline/clock_cycles.py:{first + 1}:" in result["output"], "the patch's line is named too"
    assert "FOR THE INSTRUCTOR TO REVIEW" in done.stdout and "a5_2_1: block policy" in done.stdout
    review = tmp_path / "grading_logs" / "review.txt"
    assert review.is_file() and "block policy" in review.read_text()
