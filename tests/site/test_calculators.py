"""The site's calculators (calculators.html) agree with the course's Python, in headless Chromium.

For each of the four calculators, at least 50 random configurations (seeded) are set through the page's own
inputs — the first few typed key by key as a reader would, the rest set in one script per calculator that
writes each input's value and fires its ``input`` and ``change`` events, the events the page listens to — and
the result the page shows is read back from its text and compared with the Python for the same inputs:

* memory per rank: ``project.planner.memory.stage_memory`` of every stage (its total is the planner's stage
  total), and the bars of the fullest stage by category and by layer part, for GPT-2's and Llama's shapes, a free
  shape, every recomputation policy and attention kernel; where ``PlanConfig`` refuses the configuration, the page
  shows an error instead of numbers;
* the bubble: ``pipeline.schedules.SCHEDULES[name].bubble(p, m, v)`` (what ``plan.predict`` adds to the step) for
  every schedule of the registry;
* alpha-beta: ``communication.alpha_beta.collective_seconds``, ``communication.cost_model.predict_allreduce``
  and ``predicted_crossover`` on the planner's links (``course.hardware``) and on custom ones;
* MFU: ``project.planner.model.ModelShape.model_flops_per_token`` times tokens/s over devices times the dense
  peak of ``course.hardware.GPU_DATASHEETS`` (the planner's MFU with tokens/s = tokens per step / step time), and
  the table of dense and 2:4-sparse peaks; an MFU above 100 % is an error, not a number;
* the page's own rules: every input bounded with a message naming its label (a blank is not 0, 1e30 GPUs is
  refused), and the setup kept in the page's address (a link reproduces it).

**Tolerance.** The page computes in float64 like Python, with the same operations in nearly the same order, so
the two values differ by a few roundings: at most ~100 operations, each off by at most 2^-53 of an
intermediate no more than ~10 times the result, i.e. < 1.2e-13 of the result; a link's figures pass through
the page's inputs at 15 significant digits (each within 5e-15 of the planner's), which moves a time or a
crossover by < 2e-14 more. ``FLOAT`` = 1e-12 relative bounds both. What the page *shows* is then rounded for display, and the tolerance is half a unit in the last
digit shown, read off the shown text itself (``'0.9019 GB'``: 0.00005 GB; ``'1,234 B'``: 0.5 B;
``'1.23457e+8'``: 500): ``|shown - python| <= half_unit(shown) + FLOAT * |python|``. Planted mistakes (the
usual ones: the sparse peak, ZeRO sharding forgotten, a bubble without the schedule's w, the collective's base
left out, the vocabulary not padded) are caught by the same comparison, so the tolerance is not too loose to
see them.

The page comes from the course's site built once per session (the ``course_site`` fixture, shared with the
other site tests); the comparisons here run in one browser session in well under 30 s.
"""
from __future__ import annotations

import json
import math
import random
import re

import pytest
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import Select

from tests.site import browser

SEED = 43
CONFIGS = 50        # random configurations per calculator (valid ones, for memory; refused ones come on top)
TYPED = 3           # of which typed key by key through the inputs
FLOAT = 1e-12       # float64: JavaScript against Python (module docstring)

# ---- reading what the page shows --------------------------------------------------------------------------

_NUMBER = re.compile(r"^\s*(-?[\d,]*\.?\d+(?:e[+-]?\d+)?)\s*(.*)$", re.IGNORECASE)
_SCALE = {"B": 1.0, "GB": 1e9, "GiB": 2.0**30, "µs": 1e-6, "TFLOP/s": 1e12, "%": 1e-2, "": 1.0}


def shown(text: str) -> tuple[float, float]:
    """The value a shown text stands for and half a unit of its last digit, in the text's unit
    (``'0.9019 GB'`` -> (0.9019e9, 0.00005e9); ``'1,234 B'`` -> (1234, 0.5))."""
    match = _NUMBER.match(text)
    assert match, f"the page shows {text!r}, not a number"
    digits, rest = match.group(1).replace(",", ""), match.group(2).strip()
    unit = rest.split()[0] if rest else ""
    scale = _SCALE[unit] if unit in _SCALE else 1.0
    mantissa, _, exponent = digits.lower().partition("e")
    decimals = len(mantissa.partition(".")[2])
    half = 0.5 * 10.0 ** (int(exponent or 0) - decimals)
    return float(digits) * scale, half * scale


def agrees(text: str, want: float) -> bool:
    value, half = shown(text)
    return abs(value - want) <= half + FLOAT * abs(want)


# ---- setting the inputs -----------------------------------------------------------------------------------

# Set each (id, value) through the element as the page's listeners see it: the value (or checkbox), then the
# input and change events; then read the texts of the given ids (a selector ending in '*' reads every element
# with that data attribute prefix). One call runs a whole batch of configurations.
_BATCH = """
const [batch, reads] = arguments;
const set = (id, value) => {
  const el = document.getElementById(id);
  if (!el) throw new Error('no input ' + id);
  if (el.type === 'checkbox') el.checked = !!value; else el.value = String(value);
  el.dispatchEvent(new Event('input', {bubbles: true}));
  el.dispatchEvent(new Event('change', {bubbles: true}));
};
return batch.map(pairs => {
  pairs.forEach(([id, value]) => set(id, value));
  const out = {};
  reads.forEach(id => { out[id] = document.getElementById(id).textContent; });
  out.cells = Array.from(document.querySelectorAll('#mem-rows td[data-field]'))
                   .map(td => [Number(td.dataset.stage), td.dataset.field, td.textContent]);
  out.bars = Array.from(document.querySelectorAll('#mem-bars [data-bytes]'))
                  .map(el => [el.dataset.category ? 'category' : 'part', el.dataset.category || el.dataset.part,
                              Number(el.dataset.bytes)]);
  out.error_shown = !document.getElementById('mem-error').hidden;
  return out;
});
"""


def type_in(driver, pairs):
    """Set each (id, value) as a reader does: choose the option, tick the box, or clear and type."""
    for id_, value in pairs:
        element = driver.find_element(By.ID, id_)
        if element.get_attribute("type") != "checkbox" and element.get_attribute("value") == str(value):
            continue  # already so: a reader leaves it
        if not element.is_enabled():  # e.g. v for a schedule without chunks: the page has set it already
            assert element.get_attribute("value") == str(value), (id_, element.get_attribute("value"), value)
        elif element.tag_name == "select":
            Select(element).select_by_value(str(value))
        elif element.get_attribute("type") == "checkbox":
            if element.is_selected() != bool(value):
                element.click()
        else:
            element.clear()
            element.send_keys(str(value))


def run(driver, batches, reads, typed=TYPED):
    """Set every configuration (the first ``typed`` by typing) and read the page after each."""
    out = []
    for pairs in batches[:typed]:
        type_in(driver, pairs)
        out += driver.execute_script(_BATCH, [[]], reads)
    return out + driver.execute_script(_BATCH, batches[typed:], reads)


@pytest.fixture(scope="module")
def page(course_site, chromium, screenshots):
    """The calculators page loaded in Chromium: (driver, the tables the page was built with). A screenshot of
    it as first shown goes to build/site/screenshots/calculators.png."""
    with browser.serve(course_site.html) as base:
        report = browser.inspect(chromium, base + "calculators.html")
        assert report["console_errors"] == [], report["console_errors"]
        chromium.execute_script("document.getElementById('memory-calculator').scrollIntoView();")
        chromium.save_screenshot(str(screenshots / "calculators.png"))
        data = json.loads(chromium.find_element(By.ID, "calculator-data").get_attribute("textContent"))
        yield chromium, data


# ---- memory per rank --------------------------------------------------------------------------------------

MEMORY_FIELDS = ("params", "grads", "optimizer", "activations", "recompute", "total")


FREE_SHAPE = ("n_layer", "n_embd", "n_head", "n_kv_head", "n_inner", "mlp")


def memory_configs(data, rng):
    """Random planner configurations: ``CONFIGS`` that PlanConfig accepts and up to 15 it refuses; a fifth of them
    with a free shape (blank fields: the preset's)."""
    from course.config import ConfigError
    from project.planner.config import PlanConfig

    schedules = [s["name"] for s in data["schedules"] if s["in_flight"] and s["name"] in data["planner"]["schedule"]]
    presets = [p for p in data["presets"] if p not in ("llama3-405b",)]  # 126 layers: drawn below, rarely
    valid, refused = [], []
    while len(valid) < CONFIGS:
        schedule = rng.choice(schedules)
        chunked = next(s for s in data["schedules"] if s["name"] == schedule)["interleaved"]
        dp, m = rng.choice([1, 2, 3, 4, 8]), rng.randint(1, 12)
        full = rng.random() < 0.3
        c = dict(preset=rng.choice(presets + ["llama3-405b"] * (rng.random() < 0.1)), vocab_size=rng.randint(300, 130000),
                 model_max_length=rng.choice([64, 128, 256, 512, 1024, 2048, 8192]), dp=dp,
                 pp=rng.choice([1, 1, 2, 3, 4, 8]), tp=rng.choice([1, 1, 2, 4, 5, 8]), cp=rng.choice([1, 1, 2, 4]),
                 ep=rng.choice([1, 1, 2, 4]), micro_batches=m, virtual_stages=rng.choice([1, 2, 3]) if chunked else 1,
                 schedule=schedule, zero=rng.choice(data["planner"]["zero"]),
                 precision=rng.choice(data["planner"]["precision"]), hardware=rng.choice(data["planner"]["hardware"]),
                 activation_model=rng.choice([None, *data["planner"]["activation_model"]]),
                 attention_kernel=rng.choice(data["planner"]["attention_kernel"]),
                 selective_checkpointing="none" if full else rng.choice(data["planner"]["selective_checkpointing"]),
                 dropout=rng.choice([0.0, 0.1]), num_experts=rng.choice([1, 1, 2, 4, 8]), moe_every=rng.randint(1, 3),
                 activation_checkpointing=full, sequence_parallel=rng.random() < 0.4,
                 fused_kernels=rng.random() < 0.4,
                 batch_size=dp * m * rng.randint(1, 4) if rng.random() < 0.9 else rng.randint(1, 100))
        c |= {k: None for k in FREE_SHAPE}
        if rng.random() < 0.2:
            heads = rng.choice([4, 8, 16])
            c |= dict(n_layer=rng.randint(2, 16), n_embd=heads * rng.choice([16, 32, 64]), n_head=heads,
                      n_kv_head=rng.choice([None, heads, heads // 2, 1]), n_inner=rng.choice([None, 256, 1024]),
                      mlp=rng.choice([None, "gelu", "swiglu"]))
        try:
            config = PlanConfig.for_test(**{k: v for k, v in c.items() if v is not None or k not in FREE_SHAPE})
        except ConfigError:
            if len(refused) < 15:
                refused.append((c, None))
            continue
        valid.append((c, config))
    return valid, refused


def memory_inputs(c, unit):
    pairs = [(f"mem-{k}", "" if v is None else (int(v) if isinstance(v, bool) else v)) for k, v in c.items()]
    return pairs + [("mem-unit", unit)]


def planner_memory(config):
    """Per stage the planner's categories and total, and the stage's parts of one micro-batch."""
    from project.planner.memory import stage_memory

    rows = []
    for stage in range(config.pp):
        memory = stage_memory(config, stage)
        rows.append(memory.categories() | {"total": memory.total, "parts": dict(memory.parts)})
    return rows


def memory_mismatches(readings, expected):
    """Every (configuration, stage, field) where the page and ``expected`` rows disagree: the table, and the bars of
    the fullest stage (its categories and one micro-batch's parts, each value exact to the float tolerance)."""
    bad = []
    for i, (reading, rows) in enumerate(zip(readings, expected)):
        cells = {(stage, field): text for stage, field, text in reading["cells"]}
        if len(cells) != len(rows) * len(MEMORY_FIELDS):
            bad.append((i, "stages", len(cells) // len(MEMORY_FIELDS), len(rows)))
            continue
        for stage, row in enumerate(rows):
            for field in MEMORY_FIELDS:
                if not agrees(cells[stage, field], row[field]):
                    bad.append((i, stage, field, cells[stage, field], row[field]))
        worst = max(rows, key=lambda r: r["total"])
        want = {("category", k): worst[k] for k in MEMORY_FIELDS[:-1] if worst[k] > 0}
        want |= {("part", k): v for k, v in worst["parts"].items() if v > 0}
        got = {(kind, name): value for kind, name, value in reading["bars"]}
        if set(got) != set(want) or any(not math.isclose(got[k], want[k], rel_tol=FLOAT) for k in want):
            bad.append((i, "bars", got, want))
    return bad


@pytest.mark.needs_solution  # the planner's in-flight count runs the schedules' reference action lists
def test_memory_per_rank_agrees_with_the_planner(page):
    driver, data = page
    rng = random.Random(SEED)
    valid, refused = memory_configs(data, rng)
    assert any(c["preset"].startswith("llama3") for c, _ in valid) and any(c["n_layer"] for c, _ in valid)
    units = ["bytes"] * 38 + ["GB"] * 6 + ["GiB"] * 6
    batches = [memory_inputs(c, units[i]) for i, (c, _) in enumerate(valid)]
    readings = run(driver, batches, ["mem-error"], typed=1)  # 27 inputs a configuration: one typed key by key
    expected = [planner_memory(config) for _, config in valid]
    bad = memory_mismatches(readings, expected)
    assert not bad, f"{len(bad)} values differ from project/planner/, e.g. {bad[:3]} for {valid[bad[0][0]][0]}"
    assert all(not r["error_shown"] for r in readings)

    # what PlanConfig refuses, the page refuses too (an error, no numbers)
    shown_refused = driver.execute_script(_BATCH, [memory_inputs(c, "bytes") for c, _ in refused], ["mem-error"])
    assert refused, "the random configurations include some the planner refuses"
    for (c, _), reading in zip(refused, shown_refused):
        assert reading["error_shown"] and reading["mem-error"] and not reading["cells"], (c, reading)

    # planted mistakes are caught at this tolerance: ZeRO sharding forgotten, the vocabulary not padded to a
    # multiple of tp, one micro-batch in flight, ZB-H1's micro-batches let go at B (not at W), SwiGLU's saved
    # tensors counted as GeLU's
    from unittest import mock

    import memory.accounting as accounting
    import project.planner.layout as layout
    import project.planner.memory as planner_memory_module

    real_state, real_sizes, real_held = accounting.model_state_bytes, layout.sizes, planner_memory_module.held_until

    def padded_not(config):
        from dataclasses import replace

        return replace(real_sizes(config), V=config.vocab_size)

    def let_go_at_b(actions):
        return [(s, k) for s, k in real_held([a for a in actions if a[0] != "W"])]

    plants = {
        "ZeRO sharding forgotten": [mock.patch.object(
            accounting, "model_state_bytes", lambda stage, n, dp, precision="fp32": real_state(0, n, dp, precision))],
        "vocabulary not padded": [mock.patch.object(layout, "sizes", padded_not),
                                  mock.patch.object(planner_memory_module, "sizes", padded_not)],
        "one micro-batch in flight": [mock.patch.object(planner_memory_module, "in_flight_bytes",
                                                        lambda config, stage, unit: (max(unit.values()), 1))],
        "ZB-H1 lets go at B": [mock.patch.object(planner_memory_module, "held_until", let_go_at_b)],
    }
    for name, patches in plants.items():
        for patch in patches:
            patch.start()
        try:
            wrong = [planner_memory(config) for _, config in valid]
        finally:
            for patch in patches:
                patch.stop()
        assert memory_mismatches(readings, wrong), f"the planted mistake {name!r} passed the comparison"


# ---- the bubble -------------------------------------------------------------------------------------------

def test_bubble_of_every_schedule_agrees_with_the_registry(page):
    from pipeline.schedules import SCHEDULES

    driver, data = page
    assert [s["name"] for s in data["schedules"]] == list(SCHEDULES), "every schedule of the registry is offered"
    rng = random.Random(SEED + 1)
    configs = []
    names = list(SCHEDULES)
    for i in range(max(CONFIGS, 3 * len(names))):
        name = names[i % len(names)] if i < 2 * len(names) else rng.choice(names)
        v = rng.randint(1, 8) if SCHEDULES[name].interleaved else 1
        configs.append((name, rng.randint(1, 16), rng.randint(1, 64), v))
    batches = [[("bubble-schedule", n), ("bubble-p", p), ("bubble-m", m), ("bubble-v", v)] for n, p, m, v in configs]
    readings = run(driver, batches, ["bubble-fraction", "bubble-ratio", "bubble-formula", "bubble-source"])

    def mismatches(bubble_of):
        bad = []
        for (name, p, m, v), r in zip(configs, readings):
            want = bubble_of(name, p, m, v)
            numerator, denominator = map(int, re.findall(r"(\d+) / (\d+)$", r["bubble-formula"])[0])
            if not (agrees(r["bubble-fraction"], want) and agrees(r["bubble-ratio"], want / (1 - want))
                    and math.isclose(numerator / denominator, want, rel_tol=FLOAT, abs_tol=0)):
                bad.append(((name, p, m, v), r, want))
        return bad

    bad = mismatches(lambda name, p, m, v: SCHEDULES[name].bubble(p, m, v))
    assert not bad, f"{len(bad)} bubbles differ from the registry's, e.g. {bad[:3]}"
    assert all(r["bubble-source"] == SCHEDULES[n].source for (n, *_), r in zip(configs, readings))
    # planted: every schedule with GPipe's bubble (w = 1)
    assert mismatches(lambda name, p, m, v: SCHEDULES["gpipe"].bubble(p, m, 1))


# ---- alpha-beta -------------------------------------------------------------------------------------------

def test_alpha_beta_cost_and_crossover_agree_with_the_cost_model(page):
    from communication.alpha_beta import collective_seconds
    from communication.cost_model import predict_allreduce, predicted_crossover
    from course.collectives import RING_STEPS, ring_traffic_bytes

    driver, data = page
    rng = random.Random(SEED + 2)
    units = {"B": 1, "KiB": 1024, "MiB": 1024**2, "GiB": 1024**3}
    configs, batches = [], []
    for i in range(CONFIGS):
        kind = rng.choice(["all_reduce", "all_gather", "reduce_scatter", "all_to_all", "send"])
        p = rng.choice([1, 2, 3, 4, 5, 6, 7, 8, 12, 16, 24, 32, 64, 100, 128])
        unit = rng.choice(["B", "B", "KiB", "MiB", "GiB"])
        size = rng.randint(0, 10**10) // units[unit] if unit != "B" else int(10 ** rng.uniform(0, 10))
        pairs = [("ab-kind", kind), ("ab-p", p), ("ab-size", size), ("ab-unit", unit)]
        if i % 2 == 0:
            j = rng.randrange(len(data["links"]))
            link = data["links"][j]
            alpha, beta, base = link["alpha"], link["beta"], link["base"]
            pairs.append(("ab-link", j))
        else:
            a_us, bandwidth, base_us = rng.uniform(0.5, 50), rng.uniform(1, 900), rng.choice([0, rng.uniform(0, 20)])
            alpha, beta, base = a_us * 1e-6, 1 / (bandwidth * 1e9), base_us * 1e-6
            pairs += [("ab-alpha", repr(a_us)), ("ab-bandwidth", repr(bandwidth)), ("ab-base", repr(base_us))]
        configs.append((kind, p, size * units[unit], alpha, beta, base))
        batches.append(pairs)
    reads = ["ab-seconds", "ab-steps", "ab-traffic", "ab-ring", "ab-rd", "ab-crossover", "ab-link",
             "ab-seconds-label", "ab-steps-label", "ab-traffic-label"]
    readings = run(driver, batches, reads)

    def mismatches(seconds_of):
        bad = []
        for (kind, p, n, alpha, beta, base), r in zip(configs, readings):
            name = kind.replace("_", "-")  # each row names the collective chosen
            ok = all(name in r[label] for label in ("ab-seconds-label", "ab-steps-label", "ab-traffic-label"))
            ok &= agrees(r["ab-seconds"], seconds_of(kind, n, p, alpha, beta, base))
            ok &= int(r["ab-steps"]) == (RING_STEPS[kind](p) if p > 1 or kind == "send" else 0)
            ok &= agrees(r["ab-traffic"], ring_traffic_bytes(kind, n, p) if p > 1 or kind == "send" else 0.0)
            if p >= 2:
                ok &= agrees(r["ab-ring"], predict_allreduce("ring", n, p, alpha, beta))
                ok &= agrees(r["ab-rd"], predict_allreduce("recursive_doubling", n, p, alpha, beta))
                x = predicted_crossover(p, alpha, beta)
                ok &= r["ab-crossover"].startswith("none") if x is None else agrees(r["ab-crossover"], x)
            else:
                ok &= r["ab-crossover"].startswith("none")
            if not ok:
                bad.append(((kind, p, n, alpha, beta, base), r))
        return bad

    bad = mismatches(collective_seconds)
    assert not bad, f"{len(bad)} differ from communication/, e.g. {bad[:3]}"
    assert any(not r["ab-crossover"].startswith("none") for r in readings)
    # planted: the collective's base latency left out
    assert mismatches(lambda kind, n, p, alpha, beta, base: collective_seconds(kind, n, p, alpha, beta, 0.0))


# ---- MFU --------------------------------------------------------------------------------------------------

def test_mfu_agrees_with_the_model_flops_and_the_dense_peaks(page):
    from course.hardware import GPU_DATASHEETS, HARDWARE
    from project.planner.model import MODELS

    driver, data = page
    # the table of peaks: every GPU of the datasheet table, dense, and the sparse figure twice it
    cells = {(td.get_attribute("data-gpu"), td.get_attribute("data-field")): td.text
             for td in driver.find_elements(By.CSS_SELECTOR, "#mfu-gpu-table td[data-gpu]")}
    for _, model, flops, _ in GPU_DATASHEETS:
        assert agrees(cells[model, "dense"] + " TFLOP/s", flops), model
        assert agrees(cells[model, "sparse"] + " TFLOP/s", 2 * flops), model

    rng = random.Random(SEED + 3)
    configs, batches = [], []
    while len(configs) < CONFIGS:
        preset = rng.choice([*MODELS, "custom"])
        shape = {} if preset != "custom" else {"n_layer": rng.randint(1, 96), "n_embd": 64 * rng.randint(1, 128)}
        vocab, seq = rng.randint(300, 256000), rng.choice([64, 128, 512, 1024, 2048, 4096, 8192, 32768])
        tps, devices = float(f"{10 ** rng.uniform(2, 7):.6g}"), rng.randint(1, 4096)
        pairs = [("mfu-preset", preset), *[(f"mfu-{k}", v) for k, v in shape.items()], ("mfu-vocab_size", vocab),
                 ("mfu-seq", seq), ("mfu-tokens_per_s", repr(tps)), ("mfu-devices", devices)]
        if len(configs) % 5 == 4:
            peak_tflops = float(f"{rng.uniform(10, 2000):.6g}")
            pairs += [("mfu-gpu", "custom"), ("mfu-peak", repr(peak_tflops))]
            peak, sparse = peak_tflops * 1e12, None
        else:
            j = rng.randrange(len(GPU_DATASHEETS))
            planner = data["gpus"][j]["planner"]
            precision = rng.choice(["bf16", "fp32"]) if planner else "bf16"
            pairs += [("mfu-gpu", j), ("mfu-precision", precision)]
            peak = HARDWARE[planner].peak_flops["fp32"] if precision == "fp32" else GPU_DATASHEETS[j][2]
            sparse = 2 * GPU_DATASHEETS[j][2] if precision == "bf16" else None
        # the page's custom shape is GPT-2's block of width h with its attention one head of width h (a d = h)
        model = MODELS[preset].replace(**shape) if preset != "custom" else MODELS["gpt2"].replace(**shape, n_head=1)
        flops = model.model_flops_per_token(vocab, seq)
        if flops * tps / (devices * peak) > 1:
            continue  # above the peak: the page's refusal is checked below
        configs.append((flops, tps, devices, peak, sparse))
        batches.append(pairs)
    reads = ["mfu-flops-per-token", "mfu-value", "mfu-peak-shown", "mfu-achieved", "mfu-sparse"]
    readings = run(driver, batches, reads)

    def mismatches(peak_of):
        bad = []
        for (flops, tps, devices, peak, sparse), r in zip(configs, readings):
            used = peak_of(peak, sparse)
            ok = agrees(r["mfu-flops-per-token"], flops) and agrees(r["mfu-value"], flops * tps / (devices * used))
            ok &= agrees(r["mfu-peak-shown"], used) and agrees(r["mfu-achieved"], flops * tps / devices)
            if sparse is not None:  # the sentence names the sparse peak and the (wrong) MFU it would give
                numbers = re.findall(r"\(([\d.e+-]+) TFLOP/s\).* ([\d.e+-]+) %", r["mfu-sparse"])
                ok &= bool(numbers) and agrees(numbers[0][0] + " TFLOP/s", sparse)
                ok &= bool(numbers) and agrees(numbers[0][1] + " %", flops * tps / (devices * sparse))
            if not ok:
                bad.append(((flops, tps, devices, peak), r))
        return bad

    bad = mismatches(lambda peak, sparse: peak)
    assert not bad, f"{len(bad)} differ from project/planner/model.py and course/hardware.py, e.g. {bad[:3]}"
    # planted: the datasheet's sparse figure taken as the peak
    assert mismatches(lambda peak, sparse: sparse or peak)


# ---- the page's own rules: bounded inputs, the setup in the address --------------------------------------------

READ_ERRORS = """
return Object.fromEntries(['mem-error', 'bubble-error', 'ab-error', 'mfu-error', 'mfu-value', 'mem-rows']
  .map(id => [id, document.getElementById(id).hidden ? '' : document.getElementById(id).textContent]));
"""


def test_bad_inputs_are_refused_with_the_fields_own_label(page):
    """A blank field is not 0, a number out of its bounds (1e30 GPUs) is refused, and an MFU above 100 % is an
    error, not a number: each message names the input by the words of its label on the page."""
    driver, _ = page
    cases = [([("mem-dp", "")], "mem-error", "“dp” is empty"),
             ([("mem-dp", "1e30")], "mem-error", "“dp” must be a whole number from 1 to 1,000,000, not 1e30"),
             ([("mem-dp", "2.5")], "mem-error", "“dp” must be a whole number"),
             ([("mem-dropout", "1.5")], "mem-error", "“dropout” must be a number from 0 to 0.99"),
             ([("bubble-p", "")], "bubble-error", "“stages p” is empty"),
             ([("ab-bandwidth", "0")], "ab-error", "“bandwidth per direction (GB/s)” must be a number"),
             ([("mfu-devices", "1e30")], "mfu-error", "“devices n” must be a whole number from 1 to 10,000,000"),
             ([("mfu-preset", "gpt2"), ("mfu-gpu", "custom"), ("mfu-peak", "1"), ("mfu-tokens_per_s", "1e9"),
               ("mfu-devices", "1")], "mfu-error", "above 100 %")]
    driver.get(driver.current_url.split("?")[0])  # a fresh page: its defaults
    for pairs, box, message in cases:
        before = driver.execute_script("return arguments[0].map(([id]) => [id, document.getElementById(id).value]);",
                                       pairs)
        driver.execute_script(_BATCH, [pairs], [])  # sets the inputs and fires their events
        errors = driver.execute_script(READ_ERRORS)
        assert message in errors[box], (pairs, errors[box])
        if box == "mfu-error":
            assert errors["mfu-value"] == "", "an MFU above 100 % shows no number"
        if box == "mem-error":
            assert errors["mem-rows"] == "", "a refused configuration shows no rows"
        driver.execute_script(_BATCH, [before], [])  # the defaults again, and no error left
        assert driver.execute_script(READ_ERRORS)[box] == "", (pairs, "the error stays after the input is mended")


def test_the_setup_is_kept_in_the_address(page):
    """Set inputs of every calculator, take the page's address, open it afresh: the same inputs, the same
    results."""
    driver, _ = page
    driver.get(driver.current_url.split("?")[0])
    pairs = [("mem-preset", "llama3-8b"), ("mem-tp", 4), ("mem-dp", 2), ("mem-batch_size", 32),
             ("mem-micro_batches", 4), ("mem-selective_checkpointing", "matmuls"), ("mem-attention_kernel", "flash"),
             ("mem-vocab_size", 128256), ("bubble-schedule", "interleaved"), ("bubble-v", 3), ("ab-kind", "all_gather"),
             ("ab-p", 16), ("mfu-preset", "llama3-70b"), ("mfu-devices", 64), ("mem-unit", "GiB")]
    reads = ["mem-summary", "bubble-fraction", "ab-seconds", "ab-seconds-label", "mfu-value"]
    first = driver.execute_script(_BATCH, [pairs], reads)[0]
    url = driver.current_url
    assert "mem-preset=llama3-8b" in url and "ab-kind=all_gather" in url
    driver.get(url)
    again = driver.execute_script(_BATCH, [[]], reads)[0]
    for id_, value in pairs:
        element = driver.find_element(By.ID, id_)
        assert element.get_attribute("value") == str(value), (id_, element.get_attribute("value"))
    assert {k: again[k] for k in reads} == {k: first[k] for k in reads} and first["mem-summary"]


# ---- what the page is built from --------------------------------------------------------------------------

@pytest.mark.needs_solution  # runs the schedules' reference action lists
def test_every_planner_schedule_has_its_in_flight_count_in_closed_form():
    """The memory calculator's in-flight counts (website/calculators.py, IN_FLIGHT, written in JavaScript) are the
    planner's walk along the schedule's action lists (``project.planner.memory.held_until``: a pair held from its
    F to its B, or to its W) on every small pipeline: the count on each stage, and at that same peak the first
    stage's pairs of chunk 0 and the last stage's of its last chunk (the peaks coincide, so the stage's peak bytes
    are the count's units plus those chunks' extras)."""
    from pipeline.schedules import SCHEDULES, all_actions, micro_batches_per_round
    from project.planner.config import PlanConfig
    from project.planner.memory import held_until
    from website.calculators import IN_FLIGHT

    planner = PlanConfig.choices["schedule"]
    missing = [s for s in planner if s not in IN_FLIGHT]
    assert not missing, (f"the planner's schedule(s) {missing} have no closed-form in-flight count: add one to "
                         "website/calculators.py, IN_FLIGHT, and to website/_static/calculators.js")
    q = micro_batches_per_round
    formulas = {"m": lambda r, p, m, v: m, "min(p - r, m)": lambda r, p, m, v: min(p - r, m),
                "min(p, m)": lambda r, p, m, v: min(p, m),
                "min((v - 1) q + 2 (p - r - 1) + 1, v m)":
                    lambda r, p, m, v: min((v - 1) * q(p, m) + 2 * (p - r - 1) + 1, v * m),
                "min(m, 2 q), or the count when v = 1": lambda r, p, m, v, n: n if v == 1 else min(m, 2 * q(p, m)),
                "1, or the count when v = 1": lambda r, p, m, v, n: n if v == 1 else 1, "count": lambda r, p, m, v, n: n}
    for name in planner:
        forms = IN_FLIGHT[name]
        for p in range(2, 7):
            for m in range(1, 13):
                if SCHEDULES[name].interleaved and m % max(1, m // p):
                    continue
                for v in (range(1, 4) if SCHEDULES[name].interleaved else (1,)):
                    lists = all_actions(name, p, m, v)
                    for r in range(p):
                        special = 0 if r == 0 else v - 1
                        held = chunk = 0
                        points = []
                        for sign, (c, _) in held_until(lists[r]):
                            held += sign
                            chunk += sign if c == special else 0
                            points.append((held, chunk))
                        count = max(h for h, _ in points)
                        assert formulas[forms["count"]](r, p, m, v) == count, (name, r, p, m, v)
                        for end, key in ((0, "first"), (p - 1, "last")):
                            if r == end:
                                want = formulas[forms[key]](r, p, m, v, count)
                                assert (count, want) in points, (name, key, r, p, m, v, points)


def test_a_schedule_whose_bubble_the_page_cannot_show_or_a_lost_section_fails_the_build(monkeypatch):
    from pipeline.schedules import SCHEDULES, Schedule

    from website import calculators
    from website.build import REPO

    class Odd(Schedule):
        def bubble(self, n_stages, micro_batches, virtual_stages=1):
            return (n_stages - 1) / (2 * micro_batches + n_stages)

    monkeypatch.setitem(SCHEDULES, "odd", Odd("odd", "Odd", SCHEDULES["1f1b"].actions, lambda v: 1, False, "none"))
    with pytest.raises(calculators.CalculatorError, match="'odd'.*give the bubble calculator its formula"):
        calculators.calculator_data(REPO)
    monkeypatch.delitem(SCHEDULES, "odd")
    monkeypatch.setitem(calculators.SECTIONS, "mfu", [("notebooks/06_3d_parallelism.ipynb", "9. No such section")])
    with pytest.raises(calculators.CalculatorError, match="no heading starting with '9. No such section'"):
        calculators.calculator_data(REPO)


def test_each_notebook_gets_one_link_cell_to_its_calculator(tmp_path):
    import nbformat

    from website.build import REPO
    from website.calculator_links import CELL_ID, update
    from website.calculators import ANCHORS, NOTEBOOK_TOPICS

    assert set(NOTEBOOK_TOPICS) == {p.relative_to(REPO).as_posix() for p in (REPO / "notebooks").glob("*.ipynb")}
    assert update(REPO, check=True) == [], "a notebook's link cell is missing or old: run python website/calculator_links.py"
    names = ["notebooks/01_data_parallel.ipynb", "notebooks/03_tensor_parallel.ipynb"]
    (tmp_path / "notebooks").mkdir()
    without = {}
    for name in names:  # the committed notebook without its link cell: what the script finds the first time
        nb = nbformat.read(REPO / name, as_version=4)
        nb.cells = [c for c in nb.cells if c.get("id") != CELL_ID]
        nbformat.write(nb, tmp_path / name)
        without[name] = nbformat.read(tmp_path / name, as_version=4)
    assert update(tmp_path, check=True) == names and update(tmp_path) == names
    written = {name: (tmp_path / name).read_text(encoding="utf-8") for name in names}
    assert update(tmp_path) == [] and update(tmp_path, check=True) == [], "a second run changes nothing"
    for name in names:
        assert (tmp_path / name).read_text(encoding="utf-8") == written[name]
        before, after = without[name], nbformat.read(tmp_path / name, as_version=4)
        [index] = [i for i, c in enumerate(after.cells) if c.get("id") == CELL_ID]
        assert index == 1 and after.cells[0] == before.cells[0] and after.cells[2:] == before.cells[1:]
        assert f"(../website/calculators.md#{ANCHORS[NOTEBOOK_TOPICS[name][0]]})" in after.cells[1].source
    # an older text is replaced where it is, not added to
    nb = nbformat.read(tmp_path / names[0], as_version=4)
    nb.cells[1].source = "an older link"
    nbformat.write(nb, tmp_path / names[0])
    assert update(tmp_path) == [names[0]]
    assert (tmp_path / names[0]).read_text(encoding="utf-8") == written[names[0]]


def test_each_calculator_links_to_the_sections_deriving_it_and_the_navigation_lists_the_page(course_site):
    from bs4 import BeautifulSoup

    from website.build import REPO
    from website.calculators import ANCHORS, section_links

    html = BeautifulSoup((course_site.html / "calculators.html").read_text(encoding="utf-8"), "html.parser")
    for topic, sections in section_links(REPO).items():
        heading = html.find(id=ANCHORS[topic])
        assert heading is not None, f"no section {ANCHORS[topic]!r} on the page"
        hrefs = {a["href"] for a in heading.select("a[href]")}
        assert sections and {f"{s['page']}#{s['id']}" for s in sections} <= hrefs, (topic, hrefs)
    nav = BeautifulSoup((course_site.html / "index.html").read_text(encoding="utf-8"), "html.parser")
    assert "calculators.html" in [a["href"] for a in nav.select("nav.bd-docs-nav a[href]")]
