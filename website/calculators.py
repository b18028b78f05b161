"""The site's calculators page: its tables emitted from the course's Python at build time, its links resolved.

The page (``calculators.md`` of the staged site, from the template ``website/calculators.md``) holds four
calculators written in plain JavaScript (``website/_static/calculators.js``, served with the site; nothing is
fetched): memory per rank as the planner (:mod:`project.planner.memory`) counts it per pipeline stage, the
pipeline bubble of every schedule of the registry, the alpha-beta cost of a collective with the ring /
recursive-doubling crossover, and MFU. There is one source for every number they use:

* **tables emitted here** (:func:`calculator_data`, written into the page as JSON): the planner's model shapes
  (:data:`project.planner.model.MODELS`: GPT-2's and Llama's blocks), Adam's bytes per parameter
  (:data:`memory.accounting.BYTES_PER_PARAMETER`), the planner's devices (:data:`course.hardware.HARDWARE`: peaks,
  memory, links) and choices (:class:`project.planner.config.PlanConfig`'s options), the allocator headroom, the
  GPUs' dense bf16 peaks (:data:`course.hardware.GPU_DATASHEETS`), and the schedule registry
  (:data:`pipeline.schedules.SCHEDULES`: names, titles, sources and each schedule's work per micro-batch ``w(v)``,
  from which the page computes the bubble ``(p - 1) / (w m + p - 1)``; the build fails if a schedule's ``bubble``
  is not that formula, since the page could not show it);
* **formulas written in JavaScript** (the planner's per-stage memory by category and by layer part, the
  micro-batches each schedule holds in flight in closed form, the ring's steps and bytes, recursive doubling's,
  model FLOPs per token): checked against the Python in headless Chromium on random configurations
  (``tests/site/test_calculators.py``).

A schedule added to the registry appears in the bubble calculator at once; the memory calculator offers it
once its in-flight count has a closed form here (:data:`IN_FLIGHT`) and the planner accepts it.

Errors (:class:`website.stage.SiteError`, raised by the caller's type): a notebook section a calculator
links to that is not found, a schedule whose bubble is not the registry's formula.
"""
from __future__ import annotations

import dataclasses
import html
import json
import re
import unicodedata
from pathlib import Path

HERE = Path(__file__).resolve().parent
TEMPLATE = HERE / "calculators.md"
PAGE = "calculators.md"            # staged path (the page is calculators.html at the site's root)
SOURCE = "website/calculators.md"  # the repository file a notebook links to (mapped to the page)
MAX_VIRTUAL_STAGES = 16            # w(v) is emitted for v = 1 .. this

# The calculators' sections (their headings in the template, hence their anchors) by topic.
ANCHORS = {"memory": "memory-per-rank", "bubble": "pipeline-bubble", "alpha_beta": "communication-alpha-beta-cost",
           "mfu": "model-flops-utilisation-mfu"}

# (chunk, micro-batch) pairs a stage holds activations of at the peak, as the planner walks them along the
# schedule's action lists (project.planner.memory.held_until: from F to B, or to W where the list has one), in
# closed form: "count" on stage r; "first" the first stage's pairs of chunk 0 (its embedding's dropout mask) and
# "last" the last stage's pairs of its last chunk (the head's logits) at that same peak ("count": the chunk is
# the only one). The JavaScript implements each name; tests/site/test_calculators.py checks them against the
# walk. q is pipeline.schedules.micro_batches_per_round(p, m).
IN_FLIGHT = {"gpipe": {"count": "m", "first": "count", "last": "count"},
             "1f1b": {"count": "min(p - r, m)", "first": "count", "last": "count"},
             "zb-h1": {"count": "min(p, m)", "first": "count", "last": "count"},
             "interleaved": {"count": "min((v - 1) q + 2 (p - r - 1) + 1, v m)",
                             "first": "min(m, 2 q), or the count when v = 1", "last": "1, or the count when v = 1"}}

# The notebook sections that derive each calculator's formulas: (notebook, the start of the heading's text).
SECTIONS = {
    "memory": [("notebooks/05_memory.ipynb", "2. Model state per rank"),
               ("notebooks/05_memory.ipynb", "6. Activations per layer"),
               ("notebooks/05_memory.ipynb", "5. Activation checkpointing"),
               ("notebooks/05_memory.ipynb", "7. What fits"),
               ("notebooks/02_pipeline_parallel.ipynb", "7. Activation memory of GPipe and 1F1B"),
               ("notebooks/03_tensor_parallel.ipynb", "6. Sequence parallelism"),
               ("notebooks/07_context_parallelism.ipynb", "5. A GPT-2 with context parallelism"),
               ("notebooks/08_mixture_of_experts.ipynb", "1. More parameters, the same FLOPs per token")],
    "bubble": [("notebooks/02_pipeline_parallel.ipynb", "6. A real multi-process run"),
               ("notebooks/02_pipeline_parallel.ipynb", "10. Interleaved 1F1B and zero-bubble ZB-H1")],
    "alpha_beta": [("notebooks/04_communication.ipynb", "2. The α–β model"),
                   ("notebooks/04_communication.ipynb", "4. Where the ring overtakes recursive doubling"),
                   ("notebooks/04_communication.ipynb", "5. Topology")],
    "mfu": [("notebooks/06_3d_parallelism.ipynb", "5. Model FLOPs utilisation"),
            ("notebooks/06_3d_parallelism.ipynb", "MFU on a GPU")],
}

# Which calculator each notebook's topic is (website/calculator_links.py writes the link into the notebook).
NOTEBOOK_TOPICS = {
    "notebooks/01_data_parallel.ipynb": ("alpha_beta", "the α–β cost of the gradient all-reduce"),
    "notebooks/02_pipeline_parallel.ipynb": ("bubble", "the pipeline bubble of every schedule"),
    "notebooks/03_tensor_parallel.ipynb": ("memory", "memory per rank with tensor and sequence parallelism"),
    "notebooks/04_communication.ipynb": ("alpha_beta", "the α–β cost of a collective and the ring/tree crossover"),
    "notebooks/05_memory.ipynb": ("memory", "memory per rank for ZeRO 0-3 and activation checkpointing"),
    "notebooks/06_3d_parallelism.ipynb": ("mfu", "model FLOPs utilisation"),
    "notebooks/07_context_parallelism.ipynb": ("memory", "memory per rank with context parallelism"),
    "notebooks/08_mixture_of_experts.ipynb": ("memory", "memory per rank with expert parallelism"),
    "notebooks/09_plan_a_large_run.ipynb": ("memory", "memory per rank of a thousand-GPU plan"),
    "notebooks/10_debugging_hangs.ipynb": ("alpha_beta", "how long a healthy collective takes (a timeout far above it "
                                          "marks a hang)"),
    "notebooks/11_training_through_failures.ipynb": ("alpha_beta", "the α–β cost of the all-reduce DDP makes every "
                                                   "step and DiLoCo every H steps"),
}


class CalculatorError(ValueError):
    """The calculators cannot be built from the course's files; the message says what to change."""


def section_id(heading: str) -> str:
    """The HTML id Sphinx gives a section titled ``heading`` (Markdown): docutils' ``make_id`` of its text
    (math, code and emphasis marks dropped; lower case, ASCII letters and digits joined by single dashes,
    starting with a letter)."""
    text = re.sub(r"[`*$]", "", heading)
    text = unicodedata.normalize("NFKD", " ".join(text.lower().split())).encode("ascii", "ignore").decode()
    text = re.sub(r"[^a-z0-9]+", "-", text).strip("-")
    return re.sub(r"^[^a-z]+", "", text)


def _headings(root: Path, notebook: str) -> list[str]:
    nb = json.loads((root / notebook).read_text(encoding="utf-8"))
    found = []
    for cell in nb.get("cells", []):
        if cell["cell_type"] == "markdown":
            source = "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]
            found += [line.lstrip("#").strip() for line in source.split("\n") if re.match(r"#{1,6} ", line)]
    return found


def section_links(root: Path) -> dict[str, list[dict]]:
    """Per calculator, the notebook sections deriving its formulas: ``{"page", "id", "title"}`` (``page``: the
    notebook's page relative to the site's root). Sections of a notebook the tree does not have are left out
    (the demo course of the site's tests); a heading not found in a notebook that is there is an error."""
    out: dict[str, list[dict]] = {}
    for topic, sections in SECTIONS.items():
        out[topic] = []
        for notebook, start in sections:
            if not (root / notebook).is_file():
                continue
            titles = [h for h in _headings(root, notebook) if h.startswith(start)]
            if not titles:
                raise CalculatorError(f"{notebook} has no heading starting with {start!r}, which the {topic} "
                                      f"calculator links to: update website/calculators.py, SECTIONS")
            numbered = re.match(r"(\d+)\.\s+(.*)", titles[0])
            where = f"notebook {int(Path(notebook).name[:2])}" + (f", section {numbered.group(1)}" if numbered else "")
            out[topic].append({"page": notebook.removesuffix(".ipynb") + ".html", "id": section_id(titles[0]),
                               "title": f"{numbered.group(2) if numbered else titles[0]} ({where})"})
    return out


def _schedules() -> list[dict]:
    from pipeline.metrics import bubble_fraction
    from pipeline.schedules import SCHEDULES

    rows = []
    for s in SCHEDULES.values():
        vs = range(1, MAX_VIRTUAL_STAGES + 1) if s.interleaved else (1,)
        work = [s.work_per_micro(v) for v in vs]
        for v, w in zip(vs, work):
            for p in range(1, 9):
                for m in range(1, 9):
                    if abs(s.bubble(p, m, v) - bubble_fraction(p, w * m)) > 1e-15:
                        raise CalculatorError(f"schedule {s.name!r}: bubble({p}, {m}, {v}) = {s.bubble(p, m, v)} is not "
                                              f"(p - 1) / (w m + p - 1) with w = work_per_micro({v}) = {w}; give the "
                                              "bubble calculator its formula (website/_static/calculators.js)")
        rows.append({"name": s.name, "title": s.title, "interleaved": s.interleaved, "source": s.source, "work": work,
                     "in_flight": IN_FLIGHT.get(s.name)})
    return rows


def _choices(config_class, name: str) -> list:
    """The values ``--name`` takes in ``config_class``'s command line: its own choices, else the table's."""
    own = config_class.choices.get(name)
    return list(own if own is not None else
                next(f for f in dataclasses.fields(config_class) if f.name == name).metadata["choices"])


def calculator_data(root: Path) -> dict:
    """Everything the calculators take from the Python, as JSON-able values (see the module)."""
    from course.hardware import GPU_DATASHEETS, HARDWARE, datasheet_bf16_peak
    from memory.accounting import ACTIVATION_MODELS, BYTES_PER_PARAMETER
    from project.planner.config import PlanConfig
    from project.planner.memory import ALLOCATOR_HEADROOM
    from project.planner.model import MODELS

    presets = {name: dataclasses.asdict(shape) for name, shape in MODELS.items()}
    hardware, links = {}, {}
    for name, hw in HARDWARE.items():
        hardware[name] = {"peak_flops": dict(hw.peak_flops), "memory_bytes": hw.memory_bytes,
                          "devices_per_node": hw.devices_per_node, "source": hw.source}
        found = [(hw.intra, "between the GPUs of a node"), (hw.notes.get("pcie"), "between the GPUs of a node"),
                 (hw.inter, "between nodes")]
        for link, where in found:
            if link is None:
                continue
            key = (link.name, link.alpha, link.beta, link.base)
            entry = links.setdefault(key, {"name": link.name, "alpha": link.alpha, "beta": link.beta,
                                           "base": link.base, "where": where, "hardware": [], "source": link.source})
            entry["hardware"].append(name)
    gpus = []
    planner = {}
    for name, hw in HARDWARE.items():  # the planner's devices: their row of the datasheet table, with fp32
        row = datasheet_bf16_peak(name)
        if row is None:
            raise CalculatorError(f"course.hardware: HARDWARE[{name!r}] has no row in GPU_DATASHEETS: add one")
        if row["flops"] == hw.peak_flops["bf16"]:  # a profile with another peak (h100-96gb) is not a datasheet's
            planner.setdefault(row["model"], name)
    for _, model, flops, source in GPU_DATASHEETS:
        name = planner.get(model)
        gpus.append({"model": model, "bf16": flops, "sparse_bf16": 2 * flops, "source": source, "planner": name,
                     "fp32": HARDWARE[name].peak_flops["fp32"] if name else None})
    return {
        "presets": presets,
        "bytes_per_parameter": {k: list(v) for k, v in BYTES_PER_PARAMETER.items()},
        "activation_models": list(ACTIVATION_MODELS),
        "hardware": hardware,
        "planner": {name: _choices(PlanConfig, name) for name in ("hardware", "schedule", "zero", "precision",
                                                                   "activation_model", "attention_kernel",
                                                                   "selective_checkpointing", "cp_comm")},
        "headroom": ALLOCATOR_HEADROOM,
        "schedules": _schedules(),
        "links": list(links.values()),
        "gpus": gpus,
        "sections": section_links(root),
    }


def _section_list(sections: list[dict]) -> str:
    items = [f'<a href="{s["page"]}#{s["id"]}">{html.escape(s["title"])}</a>' for s in sections]
    return "; ".join(items) if items else "the course's notebooks"


def page_markdown(root: Path) -> str:
    """The calculators page (MyST Markdown with raw HTML) for the course tree ``root``."""
    data = calculator_data(root)
    text = TEMPLATE.read_text(encoding="utf-8")
    # The JSON sits in a <script type="application/json">: nothing in it may close that element.
    payload = json.dumps(data, sort_keys=True).replace("</", "<\\/")
    text = text.replace("{{data}}", payload)
    for topic, sections in data["sections"].items():
        text = text.replace("{{sections:" + topic + "}}", _section_list(sections))
    left = re.findall(r"\{\{[^}]*\}\}", text)
    if left:
        raise CalculatorError(f"website/calculators.md: unknown placeholder(s) {left}")
    return text


def stage_page(root: Path, src: Path) -> str:
    """Write the calculators page into the staged sources ``src``; returns its docname (for the toctree)."""
    (src / PAGE).write_text(page_markdown(root), encoding="utf-8")
    return PAGE.removesuffix(".md")
