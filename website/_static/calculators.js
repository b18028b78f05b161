/* The course site's calculators (calculators.html): memory per rank, pipeline bubble, alpha-beta cost, MFU.
 *
 * Plain JavaScript, nothing fetched. Every table (presets, bytes per parameter, devices, links, GPU peaks, the
 * schedule registry with each schedule's work per micro-batch) is the JSON the site's build writes into the page
 * from the course's Python (website/calculators.py). The formulas below are the Python planner's, written again:
 * tests/site/test_calculators.py sets random configurations through this page's inputs in headless Chromium and
 * compares what it shows with project/plan.py, pipeline/schedules.py, communication/ and course/model.py.
 *
 * Each formula names the Python function it follows. window.courseCalculators exposes the pure functions the
 * forms call (for a reader's console); the forms are the interface.
 */
(function () {
  "use strict";

  // ---- the planner's memory per rank (project/plan.py: shape, stage_layout, in_flight, stage_memory) ----------

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

  // In-flight (chunk, micro-batch) pairs of stage r at the peak, in closed form, by the formula's name in the
  // registry's table (website/calculators.py, IN_FLIGHT).
  const IN_FLIGHT = {
    "m": (r, p, m, v) => m,
    "min(p - r, m)": (r, p, m, v) => Math.min(p - r, m),
    "min((v - 1) q + 2 (p - r - 1) + 1, v m)":
      (r, p, m, v) => Math.min((v - 1) * microBatchesPerRound(p, m) + 2 * (p - r - 1) + 1, v * m),
  };

  function modelStateBytes(zero, nParams, dp, precision, data) {  // memory.accounting.model_state_bytes
    const [p, g, k] = data.bytes_per_parameter[precision];
    return {params: p * nParams / (zero >= 3 ? dp : 1), grads: g * nParams / (zero >= 2 ? dp : 1),
            optimizer: k * nParams / (zero >= 1 ? dp : 1)};
  }

  function layerActivationBytes(s, b, h, a, t, o) {  // memory.accounting.layer_activation_bytes
    const e = o.elementBytes, m = o.dropout ? o.maskBytes : 0;
    const sp = o.sequenceParallel ? t : 1;
    const sbh = s * b * h;
    if (o.checkpointing) return e * sbh / sp;
    const norms = sbh * (2 * e + 2 * m) / sp;
    const inputs = 2 * e * sbh / (o.implementation === "korthikanti" ? sp : 1);
    const split = 12 * e * sbh / t + (o.implementation === "course" ? 12 * e * sbh / t : 0);
    const scores = o.attentionScores ? a * s * s * b * (e + (o.dropout ? e + m : 0)) / t : 0;
    return norms + inputs + split + scores;
  }

  function headActivationBytes(s, b, h, V, t, e) {  // memory.accounting.head_activation_bytes (fp32 logits)
    return 2 * e * s * b * h + 4 * s * b * V / t;
  }

  // The configuration's errors, as PlanConfig.check words them (the subset the memory depends on).
  function memoryErrors(c, data) {
    const errors = [];
    const shape = data.presets[c.preset];
    const schedule = data.schedules.find(s => s.name === c.schedule);
    for (const name of ["vocab_size", "model_max_length", "batch_size", "dp", "pp", "tp", "cp", "ep",
                        "micro_batches", "virtual_stages", "num_experts", "moe_every"]) {
      if (!Number.isInteger(c[name]) || c[name] < 1) errors.push(`${name} must be a whole number >= 1`);
    }
    if (errors.length) return errors;
    if (!(c.dropout >= 0 && c.dropout < 1)) errors.push(`dropout must be in [0, 1), not ${c.dropout}`);
    if (c.vocab_size < 300) errors.push(`vocab_size must be >= 300 for a byte-level BPE`);
    if (c.model_max_length < 4) errors.push(`model_max_length must be >= 4`);
    if ((c.dp * c.cp) % c.ep) errors.push(`ep ${c.ep} does not divide dp x cp = ${c.dp * c.cp}`);
    if (shape.n_head % c.tp) errors.push(`tp ${c.tp} does not divide the ${shape.n_head} attention heads`);
    if (shape.n_inner % c.tp) errors.push(`tp ${c.tp} does not divide the MLP width ${shape.n_inner}`);
    if (c.pp > shape.n_layer) errors.push(`pp ${c.pp} is more than the ${shape.n_layer} transformer blocks`);
    if (c.batch_size % c.dp || (c.batch_size / c.dp) % c.micro_batches) {
      errors.push(`batch_size ${c.batch_size} must split into dp ${c.dp} shares of ${c.micro_batches} micro-batches`);
    }
    if (c.model_max_length % c.cp) errors.push(`cp ${c.cp} does not divide the sequence length ${c.model_max_length}`);
    if (c.virtual_stages > 1 && !schedule.chunks) errors.push(`virtual_stages ${c.virtual_stages} needs a schedule ` +
                                                              `with model chunks (interleaved)`);
    if (schedule.chunks && c.pp > 1) {
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

  /* Bytes one rank of every pipeline stage holds: project/plan.py's stage_memory per stage, with "total" (the sum,
   * as plan.predict adds it). c: the planner's options by their names (numbers, booleans, strings). */
  function memoryPerStage(c, data) {
    const errors = memoryErrors(c, data);
    if (errors.length) throw new Error(errors.join("; "));
    const f = data.presets[c.preset];
    const t = c.tp, L = f.n_layer, h = f.n_embd, a = f.n_head, inner = f.n_inner;
    const e = c.precision === "fp32" ? 4 : 2;
    const mask = c.hardware === "cpu" ? e : 1;            // plan.shape: CPU dropout keeps the scaled noise
    const V = Math.ceil(c.vocab_size / t) * t, P = c.model_max_length;
    const s = c.model_max_length / c.cp, b = c.batch_size / (c.dp * c.micro_batches);
    const implementation = c.activation_model || (c.hardware === "cpu" ? "course" : "korthikanti");
    const schedule = data.schedules.find(x => x.name === c.schedule);
    const moe = new Set();
    if (c.num_experts > 1) for (let i = 0; i < L; i++) if (i % c.moe_every === c.moe_every - 1) moe.add(i);
    const layer = {sequenceParallel: c.sequence_parallel, elementBytes: e, dropout: c.dropout > 0, maskBytes: mask,
                   attentionScores: c.cp === 1, implementation: implementation};
    const rows = [];
    for (let stage = 0; stage < c.pp; stage++) {
      // plan.stage_layout
      const blocks = stageBlocks(L, stage, c.pp);
      const nMoe = blocks.filter(i => moe.has(i)).length;
      const attention = (4 * h * h + 3 * h) / t + h + 4 * h;
      const mlp = (2 * h * inner + inner) / t + h;
      let dense = blocks.length * attention + (blocks.length - nMoe) * mlp + nMoe * h * c.num_experts;
      const experts = Math.floor(nMoe * c.num_experts / c.ep) * (2 * h * inner + inner + h);
      if (stage === 0) dense += V * h / t + P * h;
      if (stage === c.pp - 1) dense += 2 * h + (c.pp > 1 ? V * h / t : 0);
      // plan.stage_memory
      const denseState = modelStateBytes(c.zero, dense, c.dp * c.cp, c.precision, data);
      const expertState = modelStateBytes(c.zero, experts, c.dp * c.cp / c.ep, c.precision, data);
      const perLayer = layerActivationBytes(s, b, h, a, t, {...layer, checkpointing: c.activation_checkpointing});
      const unit = blocks.length / c.virtual_stages * perLayer;
      let extra = 0;
      if (stage === 0 && c.dropout > 0) extra += mask * s * b * h / (c.sequence_parallel ? t : 1);
      if (stage === c.pp - 1) extra += headActivationBytes(s, b, h, V, t, e);
      const inFlight = c.pp === 1 ? 1 : IN_FLIGHT[schedule.in_flight](stage, c.pp, c.micro_batches, c.virtual_stages);
      const row = {stage: stage, blocks: blocks.length, in_flight: inFlight,
                   params: denseState.params + expertState.params, grads: denseState.grads + expertState.grads,
                   optimizer: denseState.optimizer + expertState.optimizer,
                   activations: inFlight * unit + extra,
                   recompute: c.activation_checkpointing ? layerActivationBytes(s, b, h, a, t, {...layer, checkpointing: false}) : 0};
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
    if (!schedule.chunks && v !== 1) throw new Error(`${schedule.title} runs one chunk per rank: v must be 1`);
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

  // ---- MFU (course.model.model_flops_per_token; Chowdhery et al. 2022, App. B) ------------------------------

  function modelFlopsPerToken(shape, vocab, seq) {
    const h = shape.n_embd, L = shape.n_layer, inner = shape.n_inner || 4 * h;
    const blocks = L * (4 * h * h + 2 * h * inner), head = vocab * h;
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
  const UNITS = {B: 1, KB: 1024, MB: 1024 ** 2, GB: 1024 ** 3};  // as communication.alpha_beta.readable_bytes

  // 3.4 shown, not 3.4000000000000004: 15 significant digits, within 5e-15 of the value
  function round15(x) { return Number(x.toPrecision(15)); }
  function whole(x) { return Math.round(x).toLocaleString("en-US"); }
  function sig(x, digits) { return Number(x).toPrecision(digits); }
  function bytesShown(x, unit) {
    if (unit === "bytes") return whole(x) + " B";
    if (unit === "GiB") return sig(x / 1024 ** 3, 4) + " GiB";
    return sig(x / 1e9, 4) + " GB";
  }
  function readable(n) {  // communication.alpha_beta.readable_bytes
    for (const [unit, size] of [["GB", 1024 ** 3], ["MB", 1024 ** 2], ["KB", 1024]]) {
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
  function number(id) { return Number($(id).value); }
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

  const MEMORY_FIELDS = ["params", "grads", "optimizer", "activations", "recompute", "total"];

  function memoryConfig() {
    const c = {};
    for (const name of ["vocab_size", "model_max_length", "batch_size", "dp", "pp", "tp", "cp", "ep", "micro_batches",
                        "virtual_stages", "num_experts", "moe_every", "zero"]) c[name] = number("mem-" + name);
    c.dropout = number("mem-dropout");
    for (const name of ["preset", "schedule", "precision", "hardware"]) c[name] = $("mem-" + name).value;
    c.activation_model = $("mem-activation_model").value || null;
    c.activation_checkpointing = $("mem-activation_checkpointing").checked;
    c.sequence_parallel = $("mem-sequence_parallel").checked;
    return c;
  }

  function updateMemory(data) {
    const body = $("mem-rows"), unit = $("mem-unit").value;
    body.textContent = "";
    $("mem-summary").textContent = "";
    let rows;
    try {
      rows = memoryPerStage(memoryConfig(), data);
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
    const c = memoryConfig(), worst = rows.reduce((a, b) => (b.total > a.total ? b : a));
    const device = data.hardware[c.hardware];
    let text = `Largest: stage ${worst.stage}, ${bytesShown(worst.total, unit)} per device`;
    if (device) {
      text += worst.total <= device.memory_bytes ? `: fits in a ${c.hardware}'s ${bytesShown(device.memory_bytes, unit)}.`
                                                 : `: does not fit in a ${c.hardware}'s ${bytesShown(device.memory_bytes, unit)}.`;
    } else {
      text += ".";
    }
    $("mem-summary").textContent = text;
  }

  function updateBubble(data) {
    const name = $("bubble-schedule").value;
    const schedule = data.schedules.find(s => s.name === name);
    $("bubble-v").disabled = !schedule.chunks;
    if (!schedule.chunks) $("bubble-v").value = "1";
    const p = number("bubble-p"), m = number("bubble-m"), v = number("bubble-v");
    let out;
    try {
      out = bubble(name, p, m, v, data);
    } catch (e) {
      showError("bubble-error", e.message);
      for (const id of ["bubble-fraction", "bubble-ratio", "bubble-formula"]) $(id).textContent = "";
      return;
    }
    let warning = "";
    if (schedule.chunks && p > 1) {
      try { microBatchesPerRound(p, m); } catch (e) { warning = "The schedule cannot run this m: " + e.message; }
    }
    showError("bubble-error", warning);
    $("bubble-formula").textContent = `(p − 1) / (w·m + p − 1) with w = ${out.w}: ${out.numerator} / ${out.denominator}`;
    $("bubble-fraction").textContent = sig(out.fraction, 6);
    $("bubble-ratio").textContent = sig(out.fraction / (1 - out.fraction), 6);
    $("bubble-source").textContent = schedule.source;
  }

  function updateAlphaBeta(data) {
    const kind = $("ab-kind").value, p = number("ab-p");
    const n = number("ab-size") * UNITS[$("ab-unit").value];
    const alpha = number("ab-alpha") * 1e-6, beta = 1 / (number("ab-bandwidth") * 1e9), base = number("ab-base") * 1e-6;
    const ids = ["ab-seconds", "ab-steps", "ab-traffic", "ab-ring", "ab-rd", "ab-faster", "ab-crossover"];
    if (!Number.isInteger(p) || p < 1 || !(n >= 0) || !(alpha >= 0) || !(number("ab-bandwidth") > 0) || !(base >= 0)) {
      showError("ab-error", "p must be a whole number >= 1, the size, alpha and base >= 0 and the bandwidth > 0");
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
    return {n_layer: number("mfu-n_layer"), n_embd: number("mfu-n_embd")};
  }

  function updateMfu(data) {
    const shape = mfuShape(data);
    const gpu = $("mfu-gpu").value, precision = $("mfu-precision").value;
    const row = gpu === "custom" ? null : data.gpus[Number(gpu)];
    $("mfu-peak").disabled = gpu !== "custom";
    const fp32 = $("mfu-precision").querySelector('option[value="fp32"]');
    fp32.disabled = !!row && row.fp32 === null;
    let peak;
    if (row) {
      peak = precision === "fp32" && row.fp32 !== null ? row.fp32 : row.bf16;
      if (precision === "fp32" && row.fp32 === null) $("mfu-precision").value = "bf16";
      $("mfu-peak").value = String(round15(peak / 1e12));
    } else {
      peak = number("mfu-peak") * 1e12;
    }
    const vocab = number("mfu-vocab_size"), seq = number("mfu-seq"), tps = number("mfu-tokens_per_s");
    const devices = number("mfu-devices");
    const ids = ["mfu-flops-per-token", "mfu-blocks", "mfu-head", "mfu-attention", "mfu-achieved", "mfu-peak-shown",
                 "mfu-value", "mfu-sparse"];
    const ok = [shape.n_layer, shape.n_embd, vocab, seq, devices].every(x => Number.isInteger(x) && x >= 1) &&
               tps > 0 && peak > 0;
    if (!ok) {
      showError("mfu-error", "layers, width, vocabulary, sequence length and devices must be whole numbers >= 1, " +
                             "tokens/s and the peak > 0");
      for (const id of ids) $(id).textContent = "";
      return;
    }
    showError("mfu-error", "");
    const flops = modelFlopsPerToken(shape, vocab, seq);
    const value = mfu(flops.total, tps, devices, peak);
    $("mfu-flops-per-token").textContent = whole(flops.total);
    $("mfu-blocks").textContent = whole(flops.blocks);
    $("mfu-head").textContent = whole(flops.head);
    $("mfu-attention").textContent = whole(flops.attention);
    $("mfu-achieved").textContent = sig(flops.total * tps / devices / 1e12, 6) + " TFLOP/s";
    $("mfu-peak-shown").textContent = sig(peak / 1e12, 6) + " TFLOP/s";
    $("mfu-value").textContent = sig(100 * value, 6) + " %";
    $("mfu-sparse").textContent = row && precision === "bf16" ?
      `Divided by the 2:4-sparsity figure of the datasheet (${sig(row.sparse_bf16 / 1e12, 6)} TFLOP/s) the same ` +
      `run would read ${sig(100 * mfu(flops.total, tps, devices, row.sparse_bf16), 6)} %: half the true MFU, ` +
      `because dense training does not run at the sparse peak.` : "";
  }

  function setUp(data) {
    for (const id of ["mem-preset", "mfu-preset"]) {
      for (const [name, f] of Object.entries(data.presets)) {
        option($(id), name, `${name} (${f.n_layer} layers, width ${f.n_embd}, ${f.n_head} heads)`);
      }
    }
    option($("mfu-preset"), "custom", "custom shape");
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

    const wire = (prefix, update) => {
      document.querySelectorAll(`[id^="${prefix}-"]`).forEach(el => {
        el.addEventListener("input", () => update(data));
        el.addEventListener("change", () => update(data));
      });
      update(data);
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
