"""The planner beside published training runs: each row set up as its source ran it, compared in its own unit.

    python -m project.planner.published_runs               # the table: unit, source, published, predicted, error
    python -m project.planner.published_runs --mechanisms  # and each mechanism's effect on every row's error

No constant of the planner is fitted to these rows (every constant names its source where it is defined:
:mod:`course.hardware`, :mod:`project.planner.pricing`, :mod:`project.planner.kernels`); what each row states about
its run is set as the run had it, and what its source leaves unsaid is an assumption written beside the row.

* **Narayanan et al. 2021** ("Efficient Large-Scale Language Model Training on GPU Clusters Using Megatron-LM", SC21,
  arXiv:2104.04473), **Table 1**, its rows from 1.7B to 1T parameters on 32 to 3072 A100 80 GB (Selene: DGX A100,
  NVLink 3, 8 HDR InfiniBand ports per node), sequence 2048, vocabulary 51,200, fp16 mixed precision, activation
  recomputation, Megatron-LM's GPT (learned positions, LayerNorm, GeLU 4h) with its fused kernels and the unfused
  attention of 2021. Unit: achieved teraFLOP/s per GPU counted by the paper's formula (Sec. 5.1: ``96 B s l h^2
  (1 + s/6h + V/16lh)``, which counts the recomputed forward: hardware FLOPs). Assumed (the table does not say):
  one sequence per micro-batch, the 1F1B schedule where pp > 1, and the gradient all-reduce after the backward
  pass (Megatron-LM's ``--DDP-impl local`` of 2021).
* **torchtitan** (github.com/pytorch/torchtitan, ``benchmarks/llama3_h100_202412_torchtitan.md``), Llama 3.1 8B with
  FSDP (ZeRO-3), local batch 2 x 8192, selective activation checkpointing (its ``op`` policy: every other matrix
  product recomputed), bf16: **Table 1** (8 H100: 5,762 tokens/s per GPU, and 6,667 with torch.compile) and
  **Table 3** (128 H100: 5,605 and 6,514). The H100s are Grand Teton's SXM parts with 96 GB HBM2e at 2.4 TB/s held
  to a 500 W power limit (``--hardware h100-96gb``). As its commit of the table (9dec370, 2024-12-26) runs it: the
  gradients reduce-scattered in fp32 (``training.mixed_precision_reduce``, float32 its only choice), the RMSNorm
  written as PyTorch operations (``models/norms.py``; compiled with the blocks under torch.compile), rotary
  embeddings through fp32 complex numbers, the 8B preset's ``selective_ac_option = 'op'``. Unit: tokens/s per GPU.
* **The Ultra-Scale Playbook** (Hugging Face 2025): its TP + SP scaling figure (``tp_sp_scaling``), whose runs are
  listed in nanotron's ``scaling_benchmarks.py`` (github.com/huggingface/nanotron): a 3B Llama (28 x 3072, MLP 8192,
  32 heads, no GQA, tied embeddings, vocabulary 131,072), sequence 4096, dp 1, TP 2 to 32 with the largest
  micro-batch that fit (3, 9, 18, 40, 90 sequences), sequence parallelism (``REDUCE_SCATTER``), FlashAttention, ZeRO
  0, no recomputation, H100 nodes of 8 (AWS p5, EFA); nanotron's Llama runs its norms as one Triton kernel
  (``TritonRMSNorm``: ``--norm_kernel fused``). Unit: tokens/s per GPU.
* **MosaicML's llm-foundry** (github.com/mosaicml/llm-foundry, ``scripts/train/benchmarking/README.md``, table
  "H100 80GB BF16"): MPT-7B on 8 H100 (sequence 2048, micro-batch 6, global batch 48, no checkpointing: 10,643
  tokens/s per GPU) and MPT-13B on 64 H100 (micro-batch 2, global batch 128: 4,800), both FSDP ``FULL_SHARD``,
  published 2023-10-19 (llm-foundry #543). As the benchmark's ``submit_benchmarks.py`` and ``mpt-13b.yaml`` of that
  commit set it up: GPT-2's block (learned positions, GeLU 4h, biases: ``no_bias`` left at False), a low-precision
  LayerNorm (one kernel), vocabulary 50,368, ``attn_impl: triton`` (the Triton FlashAttention, priced as
  FlashAttention-2: no published H100 figure of it), Composer's ``DEFAULT`` mixed precision (bf16 parameters; its
  gradients reduced in bf16 before Composer's 2023-10-10 change, fp32 after — which the runs had is not said:
  bf16 planned). Unit: tokens/s per GPU.
"""
from __future__ import annotations

import statistics
import sys
from dataclasses import dataclass, field, replace

NARAYANAN = "Narayanan et al. 2021, Megatron-LM (SC21), Table 1"
TORCHTITAN = "torchtitan, benchmarks/llama3_h100_202412_torchtitan.md"
PLAYBOOK = "Ultra-Scale Playbook (Hugging Face 2025), TP + SP scaling figure; runs: nanotron scaling_benchmarks.py"
MOSAIC = "MosaicML llm-foundry, scripts/train/benchmarking/README.md, table 'H100 80GB BF16'"
TARGET, MEDIAN_TARGET = 0.15, 0.08  # the bounds: every row within 15 %, the median within 8 %

# Table 1: (parameters in billions, heads, hidden, layers, tp, pp, GPUs, batch, teraFLOP/s per GPU)
MEGATRON_ROWS = [
    (1.7, 24, 2304, 24, 1, 1, 32, 512, 137), (3.6, 32, 3072, 30, 2, 1, 64, 512, 138),
    (7.5, 32, 4096, 36, 4, 1, 128, 512, 142), (18.4, 48, 6144, 40, 8, 1, 256, 1024, 135),
    (39.1, 64, 8192, 48, 8, 2, 512, 1536, 138), (76.1, 80, 10240, 60, 8, 4, 1024, 1792, 140),
    (145.6, 96, 12288, 80, 8, 8, 1536, 2304, 148), (310.1, 128, 16384, 96, 8, 16, 1920, 2160, 155),
    (529.6, 128, 20480, 105, 8, 35, 2520, 2520, 163), (1008.0, 160, 25600, 128, 8, 64, 3072, 3072, 163),
]
# Table 1 and Table 3: (GPUs, torch.compile, tokens/s per GPU)
TORCHTITAN_ROWS = [(8, False, 5762.0), (8, True, 6667.0), (128, False, 5605.0), (128, True, 6514.0)]
# (tp, micro-batch size, tokens/s per GPU)
PLAYBOOK_ROWS = [(2, 3, 14167.25), (4, 9, 13460.16), (8, 18, 10888.53), (16, 40, 6159.3), (32, 90, 3609.73)]
# (model, layers, width, heads, GPUs, micro-batch, global batch, tokens/s per GPU)
MOSAIC_ROWS = [("MPT-7B", 32, 4096, 32, 8, 6, 48, 10643.0), ("MPT-13B", 40, 5120, 40, 64, 2, 128, 4800.0)]


@dataclass
class Row:
    """One published figure beside the planner's: ``error = predicted / published - 1``."""

    source: str
    run: str
    unit: str
    published: float
    predicted: float
    config: object = None
    prediction: object = None
    assumed: str = ""
    notes: dict = field(default_factory=dict)
    figure: object = None  # prediction -> the row's figure in its unit (for predictions of changed set-ups)

    @property
    def error(self) -> float:
        return self.predicted / self.published - 1


def plan(**values):
    from project.planner.config import PlanConfig

    return PlanConfig.for_test(**values)


def predicted(config):
    from course.hardware import HARDWARE
    from project.planner.step import predict

    return predict(config, HARDWARE[config.hardware])


def tokens_per_gpu(prediction, gpus: int) -> float:
    """Tokens/s per GPU of a predicted step."""
    return prediction.tokens / prediction.step_s / gpus


def megatron_rows() -> list[Row]:
    """Narayanan et al. 2021, Table 1: teraFLOP/s per GPU, the paper's FLOP count of the predicted step."""
    from three_d.choosing import megatron_flops_per_step

    rows = []
    for size, heads, hidden, layers, tp, pp, gpus, batch, tflops in MEGATRON_ROWS:
        dp = gpus // (tp * pp)
        micro = batch // dp                                  # one sequence per micro-batch
        config = plan(preset="gpt2", n_layer=layers, n_embd=hidden, n_head=heads, hardware="a100", vocab_size=51200,
                      model_max_length=2048, batch_size=batch, dp=dp, pp=pp, tp=tp, micro_batches=micro,
                      activation_checkpointing=True, precision="bf16", attention_kernel="eager", fused_kernels=True,
                      dropout=0.1, dp_overlap="off", n_devices=gpus)
        out = predicted(config)
        flops = megatron_flops_per_step(batch, 2048, layers, hidden, 51200, recomputation=True)

        def figure(prediction, flops=flops, gpus=gpus):
            return flops / prediction.step_s / gpus / 1e12

        rows.append(Row(NARAYANAN, f"GPT {size}B, {gpus} A100 (tp {tp}, pp {pp}, dp {dp}), batch {batch}",
                        "teraFLOP/s per GPU (paper's count)", float(tflops), figure(out), config, out,
                        "one sequence per micro-batch" + (", 1F1B" if pp > 1 else "") +
                        "; all-reduce after the backward", figure=figure))
    return rows


def torchtitan_rows() -> list[Row]:
    """torchtitan's Llama 3.1 8B with FSDP: tokens/s per GPU, eager and with torch.compile, 8 and 128 H100."""
    rows = []
    for gpus, compiled, tps in TORCHTITAN_ROWS:
        config = plan(preset="llama3-8b", hardware="h100-96gb", model_max_length=8192, batch_size=2 * gpus, dp=gpus,
                      zero=3, micro_batches=1, selective_checkpointing="matmuls", attention_kernel="flash",
                      fused_kernels=compiled, precision="bf16", reduce_dtype="fp32", n_devices=gpus)
        out = predicted(config)
        table = "Table 1" if gpus == 8 else "Table 3"
        rows.append(Row(f"{TORCHTITAN}, {table}", f"Llama 3.1 8B, FSDP on {gpus} H100 (96 GB, 500 W)"
                        + (", torch.compile" if compiled else ""), "tokens/s per GPU", tps,
                        tokens_per_gpu(out, gpus), config, out,
                        "FlashAttention-2 in SDPA; the 700 W H100's products at the clock a 500 W limit holds",
                        figure=lambda prediction, gpus=gpus: tokens_per_gpu(prediction, gpus)))
    return rows


def playbook_rows() -> list[Row]:
    """The Ultra-Scale Playbook's TP + SP runs: tokens/s per GPU at TP 2 to 32."""
    rows = []
    for tp, micro, tps in PLAYBOOK_ROWS:
        config = plan(preset="llama3.2-3b", n_head=32, n_kv_head=32, vocab_size=131072, hardware="h100",
                      model_max_length=4096, batch_size=micro, tp=tp, sequence_parallel=True, attention_kernel="flash",
                      norm_kernel="fused", precision="bf16", n_devices=tp)
        out = predicted(config)
        rows.append(Row(PLAYBOOK, f"3B Llama, TP + SP {tp} on H100 nodes of 8, micro-batch {micro}"
                        + (" (across nodes)" if tp > 8 else ""), "tokens/s per GPU", tps,
                        tokens_per_gpu(out, tp), config, out,
                        "tp communication exposed (nanotron overlaps part of it: tp_linear_async_communication)",
                        figure=lambda prediction, tp=tp: tokens_per_gpu(prediction, tp)))
    return rows


def mosaic_rows() -> list[Row]:
    """MosaicML llm-foundry's MPT on H100 with FSDP FULL_SHARD: tokens/s per GPU."""
    rows = []
    for name, layers, width, heads, gpus, micro, batch, tps in MOSAIC_ROWS:
        config = plan(preset="gpt2", n_layer=layers, n_embd=width, n_head=heads, vocab_size=50368, hardware="h100",
                      model_max_length=2048, batch_size=batch, dp=gpus, zero=3, micro_batches=batch // (gpus * micro),
                      attention_kernel="flash", precision="bf16", n_devices=gpus)
        out = predicted(config)
        rows.append(Row(MOSAIC, f"{name}, FSDP on {gpus} H100, micro-batch {micro}", "tokens/s per GPU", tps,
                        tokens_per_gpu(out, gpus), config, out,
                        "its Triton FlashAttention priced as FlashAttention-2; gradients reduced in bf16",
                        figure=lambda prediction, gpus=gpus: tokens_per_gpu(prediction, gpus)))
    return rows


def table() -> list[Row]:
    """Every row (module docstring), in the order of the sources."""
    return megatron_rows() + torchtitan_rows() + playbook_rows() + mosaic_rows()


def summary(rows: list[Row]) -> dict:
    """``{"rows", "within" (rows within 15 %), "median" (median absolute error), "worst" (the row with the largest
    absolute error), "target_met"}``."""
    errors = [abs(r.error) for r in rows]
    median = statistics.median(errors)
    within = sum(e <= TARGET for e in errors)
    return {"rows": len(rows), "within": within, "median": median, "worst": max(rows, key=lambda r: abs(r.error)),
            "target_met": within == len(rows) and median <= MEDIAN_TARGET}


# The mechanisms and set-up facts the planner adds beyond the kernels' roofline, each as the change that takes it out
# of a row's prediction: (name, where it comes from, change of the configuration or None, change of the hardware or
# None). A change that leaves a row's set-up as it was does not concern that row. The last two are set-up checks, not
# mechanisms: nanotron's norms are one Triton kernel, where --norm_kernel auto would have run them as eight, and MPT's
# GeLU is torch's one kernel, where the course's GPT-2 blocks (transformers') run eight.
MECHANISMS = (
    ("SMs held by hidden collectives", "NCCL's CTAs: 24 of an H100's 132 SMs (pricing.contention_seconds)",
     None, lambda hw: replace(hw, comm_sms=0)),
    ("clock under a power limit", "cube root of the power ratio, 500 of 700 W (pricing.clock_factor)",
     None, lambda hw: replace(hw, power_w=hw.reference_power_w)),
    ("RMSNorm as 8 eager kernels", "torchtitan's models/norms.py (kernels.norm_bytes)",
     {"norm_kernel": "fused"}, None),
    ("gradients reduced in fp32", "torchtitan's training.mixed_precision_reduce",
     {"reduce_dtype": "bf16"}, None),
    ("nanotron's fused RMSNorm", "nanotron's TritonRMSNorm, where --norm_kernel auto would run 8 kernels",
     {"norm_kernel": "composite"}, None),
    ("GeLU as one kernel", "llm-foundry's nn.GELU, where the course's GPT-2 blocks run transformers' 8 operations",
     {"activation_model": "course"}, None),
)


def with_change(row: Row, config_change: dict | None, hardware_change) -> float | None:
    """The row's figure predicted with one change (:data:`MECHANISMS`), or None where the change leaves the row's
    set-up as it was (or, for a norm run as eight kernels, where the row's norm is not an eager RMSNorm)."""
    from course.hardware import HARDWARE
    from project.planner.config import PlanConfig
    from project.planner.step import predict

    config, hardware = row.config, HARDWARE[row.config.hardware]
    if config_change:
        if all(getattr(config, k) == v for k, v in config_change.items()):
            return None
        if config_change.get("norm_kernel") == "composite" and (config.model.norm != "rmsnorm" or config.fused_kernels
                                                                or config.norms == "composite"):
            return None
        if config_change.get("norm_kernel") == "fused" and config.norms == "fused":
            return None
        if config_change.get("reduce_dtype") == "bf16" and config.gradient_bytes == 2:
            return None
        if "activation_model" in config_change and (config.model.mlp != "gelu" or config.fused_kernels):
            return None
        config = PlanConfig.for_test(**(config.record() | config_change))
    if hardware_change:
        changed = hardware_change(hardware)
        if changed == hardware:
            return None
        hardware = changed
    return row.figure(predict(config, hardware))


def mechanism_effects(rows: list[Row]) -> list[dict]:
    """Per row, each mechanism's effect on its error: ``{"run", "error", <mechanism name>: the error with it
    minus the error without it (None: not in this row's set-up)}``, in the order of :data:`MECHANISMS`."""
    out = []
    for r in rows:
        entry = {"run": r.run, "error": r.error}
        for name, _, config_change, hardware_change in MECHANISMS:
            without = with_change(r, config_change, hardware_change)
            entry[name] = None if without is None else r.error - (without / r.published - 1)
        out.append(entry)
    return out


def format_effects(effects: list[dict]) -> str:
    """:func:`mechanism_effects` as text: one column per mechanism, in points of error (``.``: not in the row)."""
    names = [m[0] for m in MECHANISMS]
    width = max(len(e["run"]) for e in effects)
    lines = ["each mechanism's effect on the error (points; the error with it minus without it):",
             f"{'run':{width}} {'error':>7} " + " ".join(f"{n[:14]:>14}" for n in names)]
    for e in effects:
        cells = " ".join(f"{'.':>14}" if e[n] is None else f"{e[n]:>+14.1%}" for n in names)
        lines.append(f"{e['run']:{width}} {e['error']:>+7.1%} {cells}")
    lines += [f"  {n}: {src}" for n, src, _, _ in MECHANISMS]
    return "\n".join(lines)


def gemm_efficiency_needed(row: Row) -> tuple[float, float]:
    """``(the planner's, the needed)``: the fraction of the peak the row's matrix products run at in the planner's
    critical stage (their FLOPs over their seconds), and the fraction they would have to run at for the predicted
    step to equal the published one with everything else as predicted (a diagnostic of the error, not a fit)."""
    from project.planner.kernels import stage_kernels

    p, stage = row.prediction, row.prediction.critical_stage
    flops = sum(k.flops * k.count for k in stage_kernels(row.config, stage) if k.kind == "gemm")
    flops *= row.config.micro_batches
    seconds = p.compute_by_class["gemm"]
    planner = flops / (seconds * p.peak_flops)
    published_step = p.step_s * (1 + row.error)  # the published step, in the predicted step's units
    needed = flops / ((seconds + published_step - p.step_s) * p.peak_flops)
    return planner, needed


def where_time_goes(row: Row) -> str:
    """The prediction's three largest parts of the step, as shares."""
    from project.planner.report import CLASS_NAMES

    shares = sorted(row.prediction.shares().items(), key=lambda kv: -kv[1])[:3]
    return ", ".join(f"{CLASS_NAMES.get(k, k)} {v:.0%}" for k, v in shares)


def format_table(rows: list[Row]) -> str:
    """The table as text: each row's run, unit, published and predicted figures and error under its source, then
    the verdict against the issue's bounds and, for the largest errors, where the predicted step goes and the
    matrix-product efficiency the published figure implies (:func:`gemm_efficiency_needed`)."""
    width = max(len(r.run) for r in rows)
    lines = [f"{'run':{width}} {'unit':34} {'published':>10} {'predicted':>10} {'error':>7}"]
    source = None
    for r in rows:
        if r.source != source:
            source = r.source
            lines.append(f"-- {source}")
        lines.append(f"{r.run:{width}} {r.unit[:34]:34} {r.published:>10.4g} {r.predicted:>10.4g} {r.error:>+7.1%}")
    s = summary(rows)
    fast = sum(r.error > 0 for r in rows)
    lines += ["", f"{s['within']} of {s['rows']} rows within ±{TARGET:.0%}; median absolute error {s['median']:.1%} "
                  f"(target ±{MEDIAN_TARGET:.0%}): {'met' if s['target_met'] else 'NOT met'}; too fast on {fast} of "
                  f"{s['rows']} rows; no constant of the planner is fitted to these rows"]
    lines += missing_lines(rows)
    lines.append("largest errors:")
    for r in sorted(rows, key=lambda r: -abs(r.error))[:4]:
        planner, needed = gemm_efficiency_needed(r)
        lines.append(f"  {r.error:+.1%} {r.run}: predicted step {where_time_goes(r)}; its matrix products at "
                     f"{planner:.0%} of the peak, {needed:.0%} for the published figure (everything else as "
                     f"predicted); assumed: {r.assumed}")
    return "\n".join(lines)


def remaining_gap(rows: list[Row]) -> dict:
    """The rows outside the ±15 % band, by device: ``{hardware: {"rows": [...], "planner": (low, high), "needed":
    (low, high)}}``, the matrix-product efficiency the planner gives those rows and the one their published figures
    imply with everything else as predicted (:func:`gemm_efficiency_needed`), each as its range over the rows."""
    out: dict = {}
    for r in rows:
        if abs(r.error) <= TARGET:
            continue
        planner, needed = gemm_efficiency_needed(r)
        entry = out.setdefault(r.config.hardware, {"rows": [], "planner": [], "needed": []})
        entry["rows"].append(r)
        entry["planner"].append(planner)
        entry["needed"].append(needed)
    for entry in out.values():
        entry["planner"] = (min(entry["planner"]), max(entry["planner"]))
        entry["needed"] = (min(entry["needed"]), max(entry["needed"]))
    return out


def missing_lines(rows: list[Row]) -> list[str]:
    """Which rows miss the band and what closing them would take (:func:`remaining_gap`), as text."""
    gap = remaining_gap(rows)
    if not gap:
        return ["every row within the band"]
    lines = ["outside the band, and what the remaining gap would require (everything else as predicted):"]
    for hardware, entry in gap.items():
        names = "; ".join(f"{r.run.split(',')[0]} {r.error:+.0%}" for r in entry["rows"])
        needed, planner = (f"{a:.0%}" if f"{a:.0%}" == f"{b:.0%}" else f"{a:.0%}-{b:.0%}"
                           for a, b in (entry["needed"], entry["planner"]))
        lines.append(f"  {hardware}, {len(entry['rows'])} rows ({names}): matrix products at {needed} of the peak "
                     f"instead of the planner's {planner}")
    return lines


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    rows = table()
    print(format_table(rows))
    if "--mechanisms" in argv:
        print()
        print(format_effects(mechanism_effects(rows)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
