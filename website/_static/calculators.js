/* The course site's calculators (calculators.html): memory per rank, pipeline bubble, alpha-beta cost, MFU.
 *
 * Plain JavaScript, nothing fetched. Every table (presets, bytes per parameter, devices, links, GPU peaks, the
 * schedule registry with each schedule's work per micro-batch) is the JSON the site's build writes into the page
 * from the course's Python (website/calculators.py). The formulas below are the Python planner's, written again:
 * tests/site/test_calculators.py sets random configurations through this page's inputs in headless Chromium and
 * compares what it shows with project/planner/, pipeline/schedules.py, communication/ and course/hardware.py.
 *
 * Each formula names the Python function it follows. window.courseCalculators exposes the pure functions the
 * forms call (for a reader's console); the forms are the interface.
 */
(function () {
  "use strict";

  // ---- the planner's memory per rank (project/planner: model, layout, memory) ------------------------------

  function balancedSizes(nLayers, nStages) {  // pipeline.partition.balanced_sizes
    const base = Math.floor(nLayers / nStages), extra = nLayers % nStages;
    return Array.from({length: nStages}, (_, s) => base + (s < extra ? 1 : 0));
  }

  function stageBlocks(nLayer, stage, nStages) {  // three_d.stage.stage_blocks (pipeline.gpt2_balance's split)
    const balance = balancedSizes(nLayer, nStages);
    balance[0] += 1;
    balance[nStages - 1] += 1;
    const before = balance.slice(0, stage).reduce((a, b) => a + b, 0);
    const start = before - (stage > 0 ? 1 : 0);
    const n = balance[stage] - (stage === 0 ? 1 : 0) - (stage === nStages - 1 ? 1 : 0);
    return Array.from({length: n}, (_, i) => start + i);
  }

  function microBatchesPerRound(p, m) {  // pipeline.schedules.micro_batches_per_round
    const rounds = Math.max(1, Math.floor(m / p));
    if (m % rounds) {
      throw new Error(`interleaved 1F1B needs the number of micro-batches (${m}) to be a multiple of the number of ` +
                      `rounds max(1, m // p) = ${rounds}; use micro-batches that are a multiple of the number of ` +
                      `stages (${p}) or fewer than it`);
    }
    return m / rounds;
  }

  // Pairs a stage holds at the peak, by the formula's name in the registry's table (website/calculators.py,
  // IN_FLIGHT): "count" on stage r, "first" / "last" the first / last stage's pairs of its first / last chunk.
  const IN_FLIGHT = {
    "count": (r, p, m, v, count) => count,
    "m": (r, p, m, v) => m,
    "min(p - r, m)": (r, p, m, v) => Math.min(p - r, m),
    "min(p, m)": (r, p, m, v) => Math.min(p, m),
    "min((v - 1) q + 2 (p - r - 1) + 1, v m)":
      (r, p, m, v) => Math.min((v - 1) * microBatchesPerRound(p, m) + 2 * (p - r - 1) + 1, v * m),
    "min(m, 2 q), or the count when v = 1": (r, p, m, v, count) => (v === 1 ? count : Math.min(m, 2 * microBatchesPerRound(p, m))),
    "1, or the count when v = 1": (r, p, m, v, count) => (v === 1 ? count : 1),
  };

  function modelStateBytes(zero, nParams, dp, precision, data) {  // memory.accounting.model_state_bytes
    const [p, g, k] = data.bytes_per_parameter[precision];
    return {params: p * nParams / (zero >= 3 ? dp : 1), grads: g * nParams / (zero >= 2 ? dp : 1),
            optimizer: k * nParams / (zero >= 1 ? dp : 1)};
  }

  // project.planner.model.ModelShape.replace: the preset's shape with the free-shape fields given (null: kept)
  function modelShape(c, data) {
    const base = data.presets[c.preset];
    const shape = {...base};
    for (const name of ["n_layer", "n_embd", "n_head", "n_kv_head", "n_inner", "mlp"]) {
      if (c[name] !== null && c[name] !== undefined) shape[name] = c[name];
    }
    if (c.n_embd !== null && c.n_inner === null && base.mlp === "gelu") shape.n_inner = 4 * c.n_embd;
    if (c.n_head !== null && c.n_kv_head === null && base.n_kv_head === base.n_head) shape.n_kv_head = c.n_head;
    shape.norm_params = shape.norm === "layernorm" ? 2 * shape.n_embd : shape.n_embd;
    return shape;
  }

  // The configuration's errors, as PlanConfig.check and project/planner/rules.py word them (the memory's subset).
  function memoryErrors(c, data) {
    const errors = [];
    const schedule = data.schedules.find(s => s.name === c.schedule);
    for (const name of ["vocab_size", "model_max_length", "batch_size", "dp", "pp", "tp", "cp", "ep",
                        "micro_batches", "virtual_stages", "num_experts", "moe_every"]) {
      if (!Number.isInteger(c[name]) || c[name] < 1) errors.push(`${name} must be a whole number >= 1`);
    }
    for (const name of ["n_layer", "n_embd", "n_head", "n_kv_head", "n_inner"]) {
      if (c[name] !== null && (!Number.isInteger(c[name]) || c[name] < 1)) errors.push(`${name} must be >= 1`);
    }
    if (errors.length) return errors;
    const shape = modelShape(c, data);
    if (shape.n_embd % shape.n_head) errors.push(`the width ${shape.n_embd} does not split into ${shape.n_head} heads`);
    if (shape.n_head % shape.n_kv_head) errors.push(`${shape.n_kv_head} key/value heads do not divide the ${shape.n_head} heads`);
    if (!(c.dropout >= 0 && c.dropout < 1)) errors.push(`dropout must be in [0, 1), not ${c.dropout}`);
    if (c.vocab_size < 300) errors.push(`vocab_size must be >= 300 for a byte-level BPE`);
    if (c.model_max_length < 4) errors.push(`model_max_length must be >= 4`);
    if (c.activation_checkpointing && c.selective_checkpointing !== "none") {
      errors.push("activation checkpointing recomputes every block already: choose no selective recomputation");
    }
    if ((c.dp * c.cp) % c.ep) errors.push(`ep ${c.ep} does not divide dp x cp = ${c.dp * c.cp}`);
    if (c.tp % shape.n_kv_head && shape.n_kv_head % c.tp) {
      errors.push(`tp ${c.tp} and the ${shape.n_kv_head} key/value heads: one must divide the other`);
    }
    if (shape.n_head % c.tp) errors.push(`tp ${c.tp} does not divide the ${shape.n_head} attention heads`);
    if (shape.n_inner % c.tp) errors.push(`tp ${c.tp} does not divide the MLP width ${shape.n_inner}`);
    if (c.pp > shape.n_layer) errors.push(`pp ${c.pp} is more than the ${shape.n_layer} transformer blocks`);
    if (c.batch_size % c.dp || (c.batch_size / c.dp) % c.micro_batches) {
      errors.push(`batch_size ${c.batch_size} must split into dp ${c.dp} shares of ${c.micro_batches} micro-batches`);
    }
    if (c.model_max_length % c.cp) errors.push(`cp ${c.cp} does not divide the sequence length ${c.model_max_length}`);
    if (c.virtual_stages > 1 && !schedule.interleaved) errors.push(`virtual_stages ${c.virtual_stages} needs a schedule ` +
                                                              `with model chunks (interleaved)`);
    if (schedule.interleaved && c.pp > 1) {
      try { microBatchesPerRound(c.pp, c.micro_batches); } catch (e) { errors.push(e.message); }
    }
    if (c.pp * c.virtual_stages > shape.n_layer) {
      errors.push(`pp ${c.pp} x virtual_stages ${c.virtual_stages} is more than the ${shape.n_layer} blocks`);
    }
    if (c.ep > 1 && (c.num_experts < 2 || c.num_experts % c.ep)) {
      errors.push(`ep ${c.ep} shares out the experts: give num_experts, a multiple of ${c.ep}`);
    }
    return errors;
  }

  // project.planner.layout.sizes
  function sizesOf(c, shape) {
    const t = c.tp;
    return {L: shape.n_layer, h: shape.n_embd, a: shape.n_head, kv: shape.n_kv_head, d: shape.n_embd / shape.n_head,
            f: shape.n_inner, V: Math.ceil(c.vocab_size / t) * t,
            P: shape.positions === "learned" ? c.model_max_length : 0, S: c.model_max_length,
            s: c.model_max_length / c.cp, b: c.batch_size / (c.dp * c.micro_batches), t: t,
            e: c.precision === "fp32" ? 4 : 2, mask: c.hardware === "cpu" ? (c.precision === "fp32" ? 4 : 2) : 1,
            a_t: shape.n_head / t, kv_t: Math.max(1, Math.floor(shape.n_kv_head / t)), f_t: shape.n_inner / t,
            V_t: Math.ceil(c.vocab_size / t)};
  }

  function linearLayers(shape, z) {  // project.planner.memory.linear_layers: [K, N] in forward order
    const q = z.a_t * z.d, kv = z.kv_t * z.d;
    if (shape.mlp === "swiglu") return [[z.h, q], [z.h, kv], [z.h, kv], [q, z.h], [z.h, z.f_t], [z.h, z.f_t], [z.f_t, z.h]];
    return [[z.h, q + 2 * kv], [q, z.h], [z.h, z.f_t], [z.f_t, z.h]];
  }

  function recomputePolicy(c) {  // project.planner.memory.recompute_policy
    if (c.activation_checkpointing) return "full";
    return {none: "none", attention: "attention", matmuls: "alternate"}[c.selective_checkpointing];
  }

  // project.planner.memory.layer_activations: one block's bytes for one micro-batch on one tp rank, by part
  function layerActivations(c, shape, z, policy) {
    const e = z.e, t = z.t, sp = c.sequence_parallel ? t : 1;
    const m = c.dropout > 0 ? z.mask : 0, tokens = z.b * z.s, x = tokens * z.h;
    if (policy === "full") return {"kept for recomputation": e * x / sp};
    let mlp;
    if (shape.mlp === "swiglu") mlp = (c.fused_kernels ? 3 : 4) * e * tokens * z.f_t;
    else mlp = (2 + (c.activation_model === "course" ? 3 : 0)) * e * tokens * z.f_t;
    const scores = c.attention_kernel === "eager"
      ? (z.b * z.a_t * z.s * z.S / c.cp) * (e + (c.dropout > 0 ? e + m : 0))
      : 4.0 * z.b * z.a_t * z.s;
    let parts = {"norm inputs": 2 * e * x / sp, "dropout masks": 2 * m * x / sp,
                 "linear inputs": 2 * e * x / (c.activation_model === "korthikanti" ? sp : 1),
                 "q k v": e * tokens * (z.a_t + 2 * z.kv_t) * z.d, "attention output": e * tokens * z.a_t * z.d,
                 "scores": scores, "mlp": mlp};
    if (policy === "attention" && c.attention_kernel === "eager") parts.scores = 0;
    if (policy === "alternate") {
      const kept = linearLayers(shape, z).reduce((sum, [, n], i) => sum + (i % 2 === 0 ? e * tokens * n : 0), 0);
      parts = {"kept for recomputation": e * x / sp + kept, "attention output": parts["attention output"],
               "scores": c.attention_kernel !== "eager" ? scores : 0};
    }
    return parts;
  }

  function resolved(c, data) {  // PlanConfig.resolve's defaults the memory depends on
    const r = {...c};
    r.activation_model = c.activation_model || (c.hardware === "cpu" ? "course" : "korthikanti");
    const kernel = c.attention_kernel === "auto" ? (r.activation_model === "course" ? "eager" : "flash")
                                                 : c.attention_kernel;
    r.attention_kernel = c.cp > 1 ? "flash" : kernel;
    return r;
  }

  /* Bytes one rank of every pipeline stage holds: project.planner.memory.stage_memory per stage, with "total", the
   * pairs held at the peak ("in_flight") and one micro-batch's activations by part ("parts"). c: the planner's
   * options by their names (numbers, booleans, strings; a free-shape field null when not given). */
  function memoryPerStage(input, data) {
    const errors = memoryErrors(input, data);
    if (errors.length) throw new Error(errors.join("; "));
    const c = resolved(input, data), shape = modelShape(c, data), z = sizesOf(c, shape);
    const t = c.tp, h = z.h, policy = recomputePolicy(c);
    const schedule = data.schedules.find(x => x.name === c.schedule);
    const moe = new Set();
    if (c.num_experts > 1) for (let i = 0; i < z.L; i++) if (i % c.moe_every === c.moe_every - 1) moe.add(i);
    const kvRank = z.kv_t * z.d, swiglu = shape.mlp === "swiglu";
    let attention = h * (h / t + 2 * kvRank) + h * h / t + 2 * shape.norm_params;  // layout.block_params_on_rank
    let mlp = (swiglu ? 3 : 2) * h * z.f_t;
    if (shape.bias) { attention += h / t + 2 * kvRank + h; mlp += (swiglu ? 2 : 1) * z.f_t + h; }
    const expert = (swiglu ? 3 : 2) * h * z.f + (shape.bias ? z.f + h : 0);
    const perLayer = layerActivations(c, shape, z, policy);
    const tokens = z.b * z.s, rows = [];
    for (let stage = 0; stage < c.pp; stage++) {
      // layout.stage_layout
      const blocks = stageBlocks(z.L, stage, c.pp);
      const nMoe = blocks.filter(i => moe.has(i)).length;
      let dense = blocks.length * attention + (blocks.length - nMoe) * mlp + nMoe * h * c.num_experts;
      const experts = Math.floor(nMoe * c.num_experts / c.ep) * expert;
      const first = stage === 0, last = stage === c.pp - 1;
      if (first) dense += z.V * h / t + z.P * h;
      if (last) dense += shape.norm_params + (c.pp > 1 || !shape.tied ? z.V * h / t : 0);
      // memory.stage_memory
      const denseState = modelStateBytes(c.zero, dense, c.dp * c.cp, c.precision, data);
      const expertState = modelStateBytes(c.zero, experts, c.dp * c.cp / c.ep, c.precision, data);
      const parts = {};
      const chunks = c.pp > 1 ? c.virtual_stages : 1;  // one stage runs its micro-batches whole
      for (const [k, v] of Object.entries(perLayer)) parts[k] = v * blocks.length / chunks;
      const unit = Object.values(parts).reduce((a, b) => a + b, 0);
      if (first && c.dropout > 0) parts["embedding dropout mask"] = z.mask * tokens * h / (c.sequence_parallel ? t : 1);
      if (last) { parts["head input"] = 2 * z.e * tokens * h; parts["logits (fp32)"] = 4.0 * tokens * z.V_t; }
      let count = 1, firstPairs = 1, lastPairs = 1;
      if (c.pp > 1) {
        const forms = schedule.in_flight;
        count = IN_FLIGHT[forms.count](stage, c.pp, c.micro_batches, c.virtual_stages);
        firstPairs = IN_FLIGHT[forms.first](stage, c.pp, c.micro_batches, c.virtual_stages, count);
        lastPairs = IN_FLIGHT[forms.last](stage, c.pp, c.micro_batches, c.virtual_stages, count);
      }
      const head = (parts["head input"] || 0) + (parts["logits (fp32)"] || 0);
      const activations = count * unit + firstPairs * (parts["embedding dropout mask"] || 0) + lastPairs * head;
      let recompute = 0;
      if (policy === "full" || policy === "alternate") {
        recompute = Object.values(layerActivations(c, shape, z, "none")).reduce((a, b) => a + b, 0);
      } else if (policy === "attention") {
        recompute = layerActivations(c, shape, z, "none").scores;
      }
      const row = {stage: stage, blocks: blocks.length, in_flight: count,
                   params: denseState.params + expertState.params, grads: denseState.grads + expertState.grads,
                   optimizer: denseState.optimizer + expertState.optimizer, activations: activations,
                   recompute: recompute, parts: parts};
      row.total = row.params + row.grads + row.optimizer + row.activations + row.recompute;
      rows.push(row);
    }
    return rows;
  }

  // ---- the pipeline bubble (pipeline.schedules.Schedule.bubble, pipeline.metrics.bubble_fraction) -----------

  function bubble(scheduleName, p, m, v, data) {
    const schedule = data.schedules.find(s => s.name === scheduleName);
    if (!schedule) throw new Error(`unknown schedule ${scheduleName}`);
    for (const [name, x] of [["p", p], ["m", m], ["v", v]]) {
      if (!Number.isInteger(x) || x < 1) throw new Error(`${name} must be a whole number >= 1`);
    }
    if (!schedule.interleaved && v !== 1) throw new Error(`${schedule.title} runs one chunk per rank: v must be 1`);
    if (v > schedule.work.length) throw new Error(`v at most ${schedule.work.length} here`);
    const w = schedule.work[v - 1];
    return {w: w, numerator: p - 1, denominator: w * m + p - 1, fraction: (p - 1) / (w * m + p - 1)};
  }

  // ---- alpha-beta (communication.alpha_beta.collective_seconds, course.collectives, communication.cost_model) ---

  const RING_STEPS = {all_reduce: p => 2 * (p - 1), all_gather: p => p - 1, reduce_scatter: p => p - 1,
                      all_to_all: p => p - 1, send: p => 1};

  function ringTrafficBytes(kind, n, p) {  // course.collectives.ring_traffic_bytes
    if (kind === "send") return n;
    return (kind === "all_reduce" ? 2 : 1) * ((p - 1) / p) * n;
  }

  function collectiveSeconds(kind, n, p, alpha, beta, base) {  // communication.alpha_beta.collective_seconds
    if (p <= 1 && kind !== "send") return 0;
    return base + RING_STEPS[kind](p) * alpha + ringTrafficBytes(kind, n, p) * beta;
  }

  function allreduceSteps(algorithm, p) {  // communication.cost_model.allreduce_steps
    if (algorithm === "ring") return 2 * (p - 1);
    const q = 2 ** Math.floor(Math.log2(p));
    return Math.round(Math.log2(q)) + (q !== p ? 2 : 0);
  }

  function allreduceBytesFactor(algorithm, p) {  // communication.cost_model.allreduce_bytes_factor
    return algorithm === "ring" ? 2 * (p - 1) / p : allreduceSteps(algorithm, p);
  }

  function predictAllreduce(algorithm, n, p, alpha, beta) {  // communication.cost_model.predict_allreduce
    return alpha * allreduceSteps(algorithm, p) + beta * allreduceBytesFactor(algorithm, p) * n;
  }

  function predictedCrossover(p, alpha, beta) {  // communication.cost_model.predicted_crossover (null: none)
    const extraSteps = allreduceSteps("ring", p) - allreduceSteps("recursive_doubling", p);
    const savedBytes = allreduceBytesFactor("recursive_doubling", p) - allreduceBytesFactor("ring", p);
    if (beta === 0 || savedBytes <= 0 || extraSteps <= 0) return null;
    return alpha * extraSteps / (beta * savedBytes);
  }

  // ---- MFU (project.planner.model.ModelShape.model_flops_per_token; Chowdhery et al. 2022, App. B) ----------

  // 6 N + 12 L a d s: N the weights that multiply (blocks: Q, K, V, output and the MLP's two or three matrices;
  // the head V h), attention over the query width a d = h
  function modelFlopsPerToken(shape, vocab, seq) {
    const h = shape.n_embd, L = shape.n_layer, inner = shape.n_inner || 4 * h;
    const kv = (shape.n_kv_head || shape.n_head || 1) * h / (shape.n_head || 1);
    const perBlock = h * (h + 2 * kv) + h * h + (shape.mlp === "swiglu" ? 3 : 2) * h * inner;
    const blocks = L * perBlock, head = vocab * h;
    return {blocks: 6 * blocks, head: 6 * head, attention: 12 * L * h * seq,
            total: 6.0 * (blocks + head) + 12.0 * L * h * seq};
  }

  function mfu(flopsPerToken, tokensPerSecond, devices, peak) {
    return flopsPerToken * tokensPerSecond / (devices * peak);
  }

  window.courseCalculators = {memoryPerStage, bubble, collectiveSeconds, predictAllreduce, predictedCrossover,
                              allreduceSteps, modelFlopsPerToken, mfu};

  // ---- the forms --------------------------------------------------------------------------------------------

  const $ = id => document.getElementById(id);
  // sizes of a message: powers of 1024, named so (KiB, MiB, GiB); memory: GB = 10^9 bytes or GiB = 2^30 bytes
  const UNITS = {B: 1, KiB: 1024, MiB: 1024 ** 2, GiB: 1024 ** 3};
  const PREFIXES = ["mem", "bubble", "ab", "mfu"];

  // 3.4 shown, not 3.4000000000000004: 15 significant digits, within 5e-15 of the value
  function round15(x) { return Number(x.toPrecision(15)); }
  function whole(x) { return Math.round(x).toLocaleString("en-US"); }
  function sig(x, digits) { return Number(x).toPrecision(digits); }
  function bytesShown(x, unit) {
    if (unit === "bytes") return whole(x) + " B";
    if (unit === "GiB") return sig(x / 1024 ** 3, 4) + " GiB";
    return sig(x / 1e9, 4) + " GB";
  }
  function readable(n) {  // communication.alpha_beta.readable_bytes (powers of 1024), named KiB, MiB, GiB here
    for (const [unit, size] of [["GiB", 1024 ** 3], ["MiB", 1024 ** 2], ["KiB", 1024]]) {
      if (Math.abs(n) >= size) return `${Number((n / size).toPrecision(3))} ${unit}`;
    }
    return `${Math.round(n)} B`;
  }
  function option(select, value, text) {
    const o = document.createElement("option");
    o.value = String(value);
    o.textContent = text;
    select.appendChild(o);
  }
  function labelOf(el) {  // the words of the input's own label, without the input's value
    const label = el.closest("label");
    return label ? Array.from(label.childNodes).filter(n => n.nodeType === 3).map(n => n.textContent).join(" ")
      .replace(/\s+/g, " ").trim() : el.id;
  }
  /* The number an input holds, checked against its own bounds (min, max; data-integer for whole numbers): an
   * Error naming the input by its label when it is blank (blank is not 0), not a number, or out of bounds.
   * data-optional: blank is allowed and gives null (e.g. a free-shape field: the preset's value). */
  function number(id) {
    const el = $(id), text = el.value.trim(), name = `“${labelOf(el)}”`;
    if (text === "") {
      if (el.dataset.optional !== undefined) return null;
      throw new Error(`${name} is empty: enter a number (blank is not 0)`);
    }
    const x = Number(text);
    const bound = (text, none) => (text === undefined || text === "" ? none : Number(text));
    const lo = bound(el.min, -Infinity), hi = bound(el.max, Infinity);
    const integer = el.dataset.integer !== undefined;
    const shown = x => (Math.abs(x) >= 1 ? x.toLocaleString("en-US") : String(x));
    const range = hi === Infinity ? `at least ${shown(lo)}` : `from ${shown(lo)} to ${shown(hi)}`;
    if (!Number.isFinite(x) || x < lo || x > hi || (integer && !Number.isInteger(x))) {
      throw new Error(`${name} must be ${integer ? "a whole number" : "a number"} ${range}, not ${text}`);
    }
    return x;
  }
  function showError(id, message) {
    const box = $(id);
    box.textContent = message || "";
    box.hidden = !message;
  }
  function cell(row, text, attributes) {
    const td = document.createElement("td");
    td.textContent = text;
    for (const [k, v] of Object.entries(attributes || {})) td.setAttribute(k, v);
    row.appendChild(td);
    return td;
  }

  // ---- the setup in the page's URL: every input, as ?name=value, so that a link reproduces the page -----------

  function inputs() {
    return Array.from(document.querySelectorAll("input[id], select[id]"))
      .filter(el => PREFIXES.some(p => el.id.startsWith(p + "-")));
  }
  function saveToUrl() {
    const params = new URLSearchParams();
    for (const el of inputs()) params.set(el.id, el.type === "checkbox" ? (el.checked ? "1" : "0") : el.value);
    history.replaceState(null, "", `${location.pathname}?${params.toString()}${location.hash}`);
  }
  function loadFromUrl() {
    const params = new URLSearchParams(location.search);
    for (const el of inputs()) {
      if (!params.has(el.id)) continue;
      if (el.type === "checkbox") el.checked = params.get(el.id) === "1";
      else el.value = params.get(el.id);
    }
  }

  // ---- memory per rank ----------------------------------------------------------------------------------------

  const MEMORY_FIELDS = ["params", "grads", "optimizer", "activations", "recompute", "total"];
  const CATEGORIES = ["params", "grads", "optimizer", "activations", "recompute"];
  const COLOURS = ["#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948", "#b07aa1", "#ff9da7",
                   "#9c755f", "#bab0ac", "#86bcb6"];

  function memoryConfig() {
    const c = {};
    for (const name of ["vocab_size", "model_max_length", "batch_size", "dp", "pp", "tp", "cp", "ep", "micro_batches",
                        "virtual_stages", "num_experts", "moe_every", "zero", "dropout", "n_layer", "n_embd",
                        "n_head", "n_kv_head", "n_inner"]) c[name] = number("mem-" + name);
    for (const name of ["preset", "schedule", "precision", "hardware", "attention_kernel", "selective_checkpointing"]) {
      c[name] = $("mem-" + name).value;
    }
    c.mlp = $("mem-mlp").value || null;
    c.activation_model = $("mem-activation_model").value || null;
    for (const name of ["activation_checkpointing", "sequence_parallel", "fused_kernels"]) c[name] = $("mem-" + name).checked;
    return c;
  }

  function bar(container, title, values, unit, key) {  // a stacked bar: one segment per entry, widths by bytes
    const total = Object.values(values).reduce((a, b) => a + b, 0);
    const wrap = document.createElement("div");
    wrap.className = "course-calculator-bar";
    const heading = document.createElement("div");
    heading.textContent = `${title}: ${bytesShown(total, unit)}`;
    wrap.appendChild(heading);
    const row = document.createElement("div");
    row.style.cssText = "display:flex;height:1.4em;width:100%;border:1px solid #999;";
    const legend = document.createElement("div");
    legend.style.cssText = "display:flex;flex-wrap:wrap;gap:0.2em 1em;font-size:0.85em;";
    Object.entries(values).forEach(([name, bytes], i) => {
      if (!(bytes > 0)) return;
      const segment = document.createElement("div");
      segment.style.cssText = `width:${100 * bytes / total}%;background:${COLOURS[i % COLOURS.length]};`;
      segment.title = `${name}: ${bytesShown(bytes, unit)}`;
      segment.dataset[key] = name;
      segment.dataset.bytes = String(bytes);
      row.appendChild(segment);
      const item = document.createElement("span");
      item.innerHTML = `<span style="display:inline-block;width:0.8em;height:0.8em;background:${COLOURS[i % COLOURS.length]}"></span> `;
      item.appendChild(document.createTextNode(`${name} ${bytesShown(bytes, unit)} (${sig(100 * bytes / total, 3)} %)`));
      legend.appendChild(item);
    });
    wrap.appendChild(row);
    wrap.appendChild(legend);
    container.appendChild(wrap);
  }

  function updateMemory(data) {
    const body = $("mem-rows"), unit = $("mem-unit").value, bars = $("mem-bars");
    body.textContent = "";
    bars.textContent = "";
    $("mem-summary").textContent = "";
    let rows, c;
    try {
      c = memoryConfig();
      rows = memoryPerStage(c, data);
    } catch (e) {
      showError("mem-error", e.message);
      return;
    }
    showError("mem-error", "");
    for (const r of rows) {
      const tr = document.createElement("tr");
      cell(tr, String(r.stage));
      cell(tr, `${r.blocks} (${r.in_flight})`);
      for (const field of MEMORY_FIELDS) cell(tr, bytesShown(r[field], unit), {"data-stage": r.stage, "data-field": field});
      body.appendChild(tr);
    }
    const worst = rows.reduce((a, b) => (b.total > a.total ? b : a));
    bar(bars, `stage ${worst.stage} per device, by category`, Object.fromEntries(CATEGORIES.map(k => [k, worst[k]])),
        unit, "category");
    bar(bars, `stage ${worst.stage}, one micro-batch's activations by layer part (its ${worst.blocks} blocks and its ` +
        "embedding or head)", worst.parts, unit, "part");
    const device = data.hardware[c.hardware];
    let text = `Largest: stage ${worst.stage}, ${bytesShown(worst.total, unit)} per device`;
    if (device) {
      const usable = device.memory_bytes * (1 - data.headroom);
      text += `: ${worst.total <= usable ? "fits in" : "does not fit in"} the ${bytesShown(usable, unit)} a ` +
              `${c.hardware} leaves usable (${bytesShown(device.memory_bytes, unit)} less ${sig(100 * data.headroom, 2)} % ` +
              "for the allocator, the CUDA context and the communication buffers).";
    } else {
      text += ".";
    }
    $("mem-summary").textContent = text;
  }

  function updateBubble(data) {
    const name = $("bubble-schedule").value;
    const schedule = data.schedules.find(s => s.name === name);
    $("bubble-v").disabled = !schedule.interleaved;
    if (!schedule.interleaved) $("bubble-v").value = "1";
    let out, p, m;
    try {
      p = number("bubble-p");
      m = number("bubble-m");
      out = bubble(name, p, m, number("bubble-v"), data);
    } catch (e) {
      showError("bubble-error", e.message);
      for (const id of ["bubble-fraction", "bubble-ratio", "bubble-formula"]) $(id).textContent = "";
      return;
    }
    let warning = "";
    if (schedule.interleaved && p > 1) {
      try { microBatchesPerRound(p, m); } catch (e) { warning = "The schedule cannot run this m: " + e.message; }
    }
    showError("bubble-error", warning);
    $("bubble-formula").textContent = `(p − 1) / (w·m + p − 1) with w = ${out.w}: ${out.numerator} / ${out.denominator}`;
    $("bubble-fraction").textContent = sig(out.fraction, 6);
    $("bubble-ratio").textContent = sig(out.fraction / (1 - out.fraction), 6);
    $("bubble-source").textContent = schedule.source;
  }

  const KIND_NAMES = {all_reduce: "all-reduce", all_gather: "all-gather", reduce_scatter: "reduce-scatter",
                      all_to_all: "all-to-all", send: "send"};

  function updateAlphaBeta(data) {
    const kind = $("ab-kind").value, name = KIND_NAMES[kind];
    $("ab-seconds-label").textContent = `time of the ring ${name}`;
    $("ab-steps-label").textContent = `steps of the ${name}`;
    $("ab-traffic-label").textContent = `bytes each rank sends in the ${name}`;
    const ids = ["ab-seconds", "ab-steps", "ab-traffic", "ab-ring", "ab-rd", "ab-faster", "ab-crossover"];
    let p, n, alpha, beta, base;
    try {
      p = number("ab-p");
      n = number("ab-size") * UNITS[$("ab-unit").value];
      alpha = number("ab-alpha") * 1e-6;
      beta = 1 / (number("ab-bandwidth") * 1e9);
      base = number("ab-base") * 1e-6;
    } catch (e) {
      showError("ab-error", e.message);
      for (const id of ids) $(id).textContent = "";
      return;
    }
    showError("ab-error", "");
    const steps = p <= 1 && kind !== "send" ? 0 : RING_STEPS[kind](p);
    $("ab-seconds").textContent = sig(collectiveSeconds(kind, n, p, alpha, beta, base) * 1e6, 6) + " µs";
    $("ab-steps").textContent = String(steps);
    $("ab-traffic").textContent = whole(p <= 1 && kind !== "send" ? 0 : ringTrafficBytes(kind, n, p)) + " B";
    if (p < 2) {
      for (const id of ["ab-ring", "ab-rd", "ab-faster"]) $(id).textContent = "—";
      $("ab-crossover").textContent = "none: an all-reduce needs p ≥ 2 ranks";
      return;
    }
    const ring = predictAllreduce("ring", n, p, alpha, beta), rd = predictAllreduce("recursive_doubling", n, p, alpha, beta);
    $("ab-ring").textContent = sig(ring * 1e6, 6) + " µs";
    $("ab-rd").textContent = sig(rd * 1e6, 6) + " µs";
    $("ab-faster").textContent = ring < rd ? "the ring" : rd < ring ? "recursive doubling" : "neither (equal)";
    const x = predictedCrossover(p, alpha, beta);
    if (x === null) {
      $("ab-crossover").textContent = beta === 0 ? "none: beta is 0, the ring has no bytes to save" :
        `none: at p = ${p} recursive doubling sends no more bytes than the ring, in ` +
        `${allreduceSteps("recursive_doubling", p)} step(s) to its ${allreduceSteps("ring", p)}`;
    } else {
      $("ab-crossover").textContent = `${whole(x)} B (${readable(x)}): the ring is faster above it`;
    }
  }

  function chooseLink(data) {
    const i = $("ab-link").value;
    if (i === "custom") return;
    const link = data.links[Number(i)];
    $("ab-alpha").value = String(round15(link.alpha * 1e6));
    $("ab-bandwidth").value = String(round15(1 / link.beta / 1e9));
    $("ab-base").value = String(round15(link.base * 1e6));
  }

  function mfuShape(data) {
    const preset = $("mfu-preset").value;
    const custom = preset === "custom";
    $("mfu-n_layer").disabled = !custom;
    $("mfu-n_embd").disabled = !custom;
    if (!custom) {
      $("mfu-n_layer").value = String(data.presets[preset].n_layer);
      $("mfu-n_embd").value = String(data.presets[preset].n_embd);
      return data.presets[preset];
    }
    const L = number("mfu-n_layer"), h = number("mfu-n_embd");
    return {n_layer: L, n_embd: h, n_head: 1, n_kv_head: 1, n_inner: 4 * h, mlp: "gelu"};  // GPT-2's block
  }

  function updateMfu(data) {
    const gpu = $("mfu-gpu").value, precision = $("mfu-precision").value;
    const row = gpu === "custom" ? null : data.gpus[Number(gpu)];
    $("mfu-peak").disabled = gpu !== "custom";
    const fp32 = $("mfu-precision").querySelector('option[value="fp32"]');
    fp32.disabled = !!row && row.fp32 === null;
    if (row) {
      const peak = precision === "fp32" && row.fp32 !== null ? row.fp32 : row.bf16;
      if (precision === "fp32" && row.fp32 === null) $("mfu-precision").value = "bf16";
      $("mfu-peak").value = String(round15(peak / 1e12));
    }
    const ids = ["mfu-flops-per-token", "mfu-blocks", "mfu-head", "mfu-attention", "mfu-achieved", "mfu-peak-shown",
                 "mfu-value", "mfu-sparse"];
    let shape, vocab, seq, tps, devices, peak;
    try {
      shape = mfuShape(data);
      vocab = number("mfu-vocab_size");
      seq = number("mfu-seq");
      tps = number("mfu-tokens_per_s");
      devices = number("mfu-devices");
      peak = row ? (precision === "fp32" && row.fp32 !== null ? row.fp32 : row.bf16) : number("mfu-peak") * 1e12;
    } catch (e) {
      showError("mfu-error", e.message);
      for (const id of ids) $(id).textContent = "";
      return;
    }
    const flops = modelFlopsPerToken(shape, vocab, seq);
    const value = mfu(flops.total, tps, devices, peak);
    $("mfu-flops-per-token").textContent = whole(flops.total);
    $("mfu-blocks").textContent = whole(flops.blocks);
    $("mfu-head").textContent = whole(flops.head);
    $("mfu-attention").textContent = whole(flops.attention);
    $("mfu-achieved").textContent = sig(flops.total * tps / devices / 1e12, 6) + " TFLOP/s";
    $("mfu-peak-shown").textContent = sig(peak / 1e12, 6) + " TFLOP/s";
    if (value > 1) {  // more model FLOPs per second than the devices can do: an input is wrong, not the MFU
      showError("mfu-error", `MFU would be ${sig(100 * value, 4)} %, above 100 %: no device runs faster than its ` +
                             "peak — check “tokens/s (whole run)”, “devices n” and the peak");
      $("mfu-value").textContent = "";
      $("mfu-sparse").textContent = "";
      return;
    }
    showError("mfu-error", "");
    $("mfu-value").textContent = sig(100 * value, 6) + " %";
    $("mfu-sparse").textContent = row && precision === "bf16" ?
      `Divided by the 2:4-sparsity figure of the datasheet (${sig(row.sparse_bf16 / 1e12, 6)} TFLOP/s) the same ` +
      `run would read ${sig(100 * mfu(flops.total, tps, devices, row.sparse_bf16), 6)} %: half the true MFU, ` +
      `because dense training does not run at the sparse peak.` : "";
  }

  function setUp(data) {
    for (const id of ["mem-preset", "mfu-preset"]) {
      for (const [name, f] of Object.entries(data.presets)) {
        const kv = f.n_kv_head === f.n_head ? "" : `, ${f.n_kv_head} key/value heads`;
        option($(id), name, `${name} (${f.n_layer} layers, width ${f.n_embd}, ${f.n_head} heads${kv}, ${f.mlp})`);
      }
    }
    option($("mfu-preset"), "custom", "custom shape (GPT-2 block)");
    for (const s of data.schedules) {
      option($("bubble-schedule"), s.name, s.title);
      if (s.in_flight && data.planner.schedule.includes(s.name)) option($("mem-schedule"), s.name, s.title);
    }
    for (const z of data.planner.zero) option($("mem-zero"), z, z === 0 ? "0 (plain data parallelism)" : String(z));
    for (const p of data.planner.precision) {
      option($("mem-precision"), p, p === "fp32" ? "fp32 (4 + 4 + 8 bytes per parameter)" :
                                                    "bf16 mixed precision (2 + 2 + 12 bytes per parameter)");
    }
    for (const hw of data.planner.hardware) option($("mem-hardware"), hw, hw);
    option($("mem-activation_model"), "", "the planner's default (course on the CPU, korthikanti on GPUs)");
    for (const a of data.planner.activation_model) option($("mem-activation_model"), a, a);
    for (const a of data.planner.attention_kernel) {
      option($("mem-attention_kernel"), a, a === "auto" ? "auto (eager for the course's blocks, else flash)" : a);
    }
    for (const a of data.planner.selective_checkpointing) option($("mem-selective_checkpointing"), a, a);
    option($("mem-mlp"), "", "the preset's");
    for (const a of ["gelu", "swiglu"]) option($("mem-mlp"), a, a);
    data.links.forEach((l, i) => option($("ab-link"), i, `${l.name} (${l.hardware.join(", ")}; ${l.where}): ` +
      `α ${sig(l.alpha * 1e6, 3)} µs, ${sig(1 / l.beta / 1e9, 3)} GB/s, base ${sig(l.base * 1e6, 3)} µs`));
    option($("ab-link"), "custom", "custom α, bandwidth and base");
    data.gpus.forEach((g, i) => option($("mfu-gpu"), i, `${g.model}: ${sig(g.bf16 / 1e12, 4)} TFLOP/s bf16 dense` +
      (g.fp32 ? `, ${sig(g.fp32 / 1e12, 4)} fp32` : "")));
    option($("mfu-gpu"), "custom", "custom peak");

    const table = $("mfu-gpu-table");
    for (const g of data.gpus) {
      const tr = document.createElement("tr");
      cell(tr, g.model);
      cell(tr, sig(g.bf16 / 1e12, 4), {"data-gpu": g.model, "data-field": "dense"});
      cell(tr, sig(g.sparse_bf16 / 1e12, 4), {"data-gpu": g.model, "data-field": "sparse"});
      cell(tr, g.fp32 ? sig(g.fp32 / 1e12, 4) : "—");
      cell(tr, g.source);
      table.appendChild(tr);
    }
    // defaults: a GPT-2 XL on 8 H100s
    $("mem-preset").value = "gpt2-xl";
    $("mfu-preset").value = "gpt2";
    $("mem-schedule").value = "1f1b";
    $("mem-precision").value = "bf16";
    $("mem-hardware").value = "h100";
    const h100 = data.gpus.findIndex(g => g.planner === "h100");
    if (h100 >= 0) $("mfu-gpu").value = String(h100);
    chooseLink(data);
    loadFromUrl();

    const wire = (prefix, update) => {
      const fields = Array.from(document.querySelectorAll(`[id^="${prefix}-"]`));
      const state = () => fields.map(el => (el.type === "checkbox" ? String(el.checked) : el.value)).join("\u0000");
      let shown = null;
      const edited = () => {  // an edit fires input and then change: the calculator runs once per new setup
        const now = state();
        if (now === shown) return;
        shown = now;
        update(data);
        saveToUrl();
      };
      fields.forEach(el => { el.addEventListener("input", edited); el.addEventListener("change", edited); });
      update(data);
      shown = state();
    };
    $("ab-link").addEventListener("change", () => chooseLink(data));
    for (const id of ["ab-alpha", "ab-bandwidth", "ab-base"]) {
      $(id).addEventListener("input", () => { $("ab-link").value = "custom"; });
    }
    wire("mem", updateMemory);
    wire("bubble", updateBubble);
    wire("ab", updateAlphaBeta);
    wire("mfu", updateMfu);
  }

  function start() {
    const element = document.getElementById("calculator-data");
    if (!element) return;
    setUp(JSON.parse(element.textContent));
  }

  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", start);
  else start();
})();
