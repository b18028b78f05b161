"""What a kernel costs: the roofline of one kernel, the GEMM efficiency by shape, and a collective on its links.

**A kernel** (:func:`kernel_seconds`) takes ``max(FLOPs / (peak x efficiency), bytes / (bandwidth x
memory_efficiency))`` (Williams et al. 2009, the roofline model): matrix products at the GEMM efficiency of their
shape, FlashAttention at its own (:attr:`course.hardware.Hardware.attention_efficiency`), memory-bound kernels
(norms, activations, residual adds, dropout, softmax, cross-entropy, the optimizer) at the achievable memory
bandwidth (the GPU report's measurement where there is one, :func:`measured_memory_efficiency`; else
:attr:`course.hardware.Hardware.memory_efficiency`).

**GEMM efficiency by shape** (:func:`gemm_efficiency`): where the course's GPU report measured the very product
(its ``kernels`` section, ``project/tools/gpu_report.py``), that measurement; else the best large product's efficiency
(:func:`gemm_base_efficiency`: the course's GPU report's sweep of square bf16 products on this GPU, interpolated in
the product's FLOPs, where one exists in ``results/gpu/``; else S. Bekman's MAMF figure) times the tile and wave
quantization of the shape (NVIDIA, "Matrix Multiplication Background User's Guide", sections "Tile Quantization"
and "Wave Quantization"; Anthony et al. 2024, "The Case for Co-Designing Model Architectures with Hardware", Sec. 3):
the output is computed in tiles of 128 x 256 (or 256 x 128, or 128 x 128, whichever wastes least), and the tiles
run in waves of one per streaming multiprocessor, so a product of ``M x N`` outputs does the work of
``ceil(tiles / SMs) x SMs`` whole tiles. No constant here is fitted to the published runs.

**A power limit** (:func:`clock_factor`): a device held below the power limit its efficiency figures were measured
at runs its compute-bound kernels (matrix products, attention) at the cube root of the power ratio
(:mod:`course.hardware`, "power_w"); memory-bound kernels keep their bandwidth (the memory's clock is its own).

**Streaming multiprocessors taken by communication** (:func:`contention_seconds`): a collective runs as a kernel of
its own, one CTA per channel, each CTA holding an SM for the collective's whole length (NCCL: one block per channel,
bounded by ``NCCL_MIN_CTAS`` / ``NCCL_MAX_CTAS``), so the computation it overlaps runs on the SMs left:
:attr:`course.hardware.Hardware.comm_sms` of them taken (:data:`course.hardware.NCCL_CTAS`). Measured: an
FSDP-style all-gather beside a matrix product on an H100 (132 SMs) launched 24 blocks and pushed the product into
a second wave (NVIDIA developer forum, "Compute-Communication Overlap Causes Severe GEMM Performance Degradation
because of Tail Effect"); across GPT and Llama training on A100s and H100s, overlapping communication slowed the
computation it overlapped by 18.9 % on average ("Characterizing Compute-Communication Overlap in GPU-Accelerated
Distributed Deep Learning: Performance and Power Implications", arXiv:2507.03114, 2025, abstract) — 24 of 132 SMs
is 18.2 %. The planner adds, for every second of a collective hidden behind computation, the share of the SMs it
holds (the computation that did not run then runs afterwards); a pipeline's point-to-point sends run on a few
channels per peer and are left out.

**A collective** (:func:`call_seconds`): the alpha-beta cost of its ring on the link it crosses (NCCL's per-step
latencies), at the link's achievable bus bandwidth (:attr:`course.hardware.Link.efficiency`, nccl-tests figures),
in two levels where a group spans nodes (:func:`communication.alpha_beta.hierarchical_seconds`).

Not modelled (no sourced figure): the gap the GPU leaves between two dependent kernels and the CPU's time to issue
each kernel without CUDA graphs. Both are microseconds per kernel, so they matter where kernels are that short
(the course's own one-GPU GPT-2 step at 128 tokens: ``project/tools/gpu_report.py`` prints the planner's prediction
beside the measured step) and not in the published runs' millisecond kernels.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from functools import lru_cache

TILES = ((128, 256), (256, 128), (128, 128))  # cuBLAS / CUTLASS output tiles (NVIDIA's GEMM guide)


@dataclass(frozen=True)
class Kernel:
    """One kernel of the step, on one rank, for one micro-batch (or one step for the optimizer).

    Attributes:
        name: e.g. ``"qkv"``. kind: ``gemm``, ``attention``, ``memory`` (memory-bound) or ``optimizer``.
        phase: ``F`` (forward), ``B`` (backward: the input's gradient), ``W`` (the weights' gradient), ``R``
            (recomputed forward), ``O`` (the optimizer step).
        flops: floating-point operations. bytes: bytes read and written in device memory.
        shape: ``(M, N, K, batch)`` of a matrix product (None otherwise).
        count: how many times it runs per micro-batch (e.g. once per block of the stage).
    """

    name: str
    kind: str
    phase: str
    flops: float
    bytes: float
    shape: tuple | None = None
    count: float = 1.0

    def times(self, count: float) -> "Kernel":
        return replace(self, count=self.count * count)


def tile_utilisation(m: int, n: int, batch: int, sms: int) -> float:
    """Useful work over the work of the whole tiles and waves the GPU runs for an ``m x n`` output (``batch`` of
    them): the best of :data:`TILES`. 1 when ``sms`` is 0 (not modelled)."""
    if sms <= 0:
        return 1.0
    best = 0.0
    for tm, tn in TILES:
        tiles = batch * math.ceil(m / tm) * math.ceil(n / tn)
        waves = math.ceil(tiles / sms)
        best = max(best, batch * m * n / (waves * sms * tm * tn))
    return best


@lru_cache(maxsize=None)
def newest_report(name: str) -> tuple[dict, str] | None:
    """The newest GPU report in ``results/gpu/`` (dry runs left out) measured on a GPU of planner kind ``name``, and
    where it is: ``(report, "results/gpu/<file> (<device>, <date>)")``; None when there is none."""
    import json

    from course.gpu_figures import KIND, REPORTS_DIR
    from course.hardware import datasheet_bf16_peak

    kinds = {"H100 SXM5": ("h100", "h100-96gb"), "H200 SXM": ("h200",), "A100": ("a100",), "L4": ("l4",)}
    best = None
    for path in sorted(REPORTS_DIR.glob("*.json")) if REPORTS_DIR.is_dir() else []:
        try:
            report = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if report.get("kind") != KIND or report.get("dry_run"):
            continue
        sheet = datasheet_bf16_peak(report.get("device", {}).get("name", ""))
        if sheet and name in kinds.get(sheet["model"], ()) and (best is None or report["created"] > best[0]["created"]):
            best = (report | {"datasheet_flops": sheet["flops"]},
                    f"results/gpu/{path.name} ({report['device']['name']}, {report['date']})")
    return best


def measured_shapes(name: str) -> dict:
    """``{(m, n, k): efficiency over the datasheet}`` of the products the newest GPU report of kind ``name``
    measured at the planner's shapes (``project/tools/gpu_report.py``, its ``kernels`` section); empty without one."""
    found = newest_report(name)
    rows = ((found or ({},))[0].get("kernels") or {}).get("gemm") or []
    return {(r["m"], r["n"], r["k"]): r["efficiency"] for r in rows if r.get("efficiency")}


def measured_memory_efficiency(name: str) -> float | None:
    """The bandwidth a memory-bound kernel reached in the newest GPU report of kind ``name`` (the median of its
    copy, add, GeLU and LayerNorm over the datasheet's HBM bandwidth); None without one."""
    found = newest_report(name)
    memory = ((found or ({},))[0].get("kernels") or {}).get("memory") or {}
    values = sorted(m["efficiency"] for m in memory.values() if m.get("efficiency"))
    return values[len(values) // 2] if values else None


@lru_cache(maxsize=None)
def measured_sweep(name: str) -> tuple[tuple[tuple[float, float], ...], str] | None:
    """The course's GPU report's square bf16 products on a GPU of planner kind ``name``: ``((FLOPs of one product,
    its efficiency over the datasheet peak), ...)`` ascending, and the report it comes from; None when no report
    (dry runs left out) measured that kind (:func:`newest_report`)."""
    found = newest_report(name)
    rows = ((found or ({},))[0].get("matmul") or {}).get("sizes") or []
    if not rows:
        return None
    report, source = found
    points = tuple(sorted((2.0 * r["n"] ** 3, r["flop_per_s"]["median"] / report["datasheet_flops"]) for r in rows))
    return points, source


def gemm_base_efficiency(hardware, flops: float, override: float | None = None) -> tuple[float, str]:
    """``(efficiency, source)`` of a well-shaped product of ``flops`` FLOPs on ``hardware``: ``override``
    (``--flops_efficiency``); else the GPU report's sweep (:func:`measured_sweep`) interpolated linearly in
    ``log(flops)`` and held flat beyond its ends; else the hardware's MAMF figure."""
    if override is not None:
        return override, "--flops_efficiency"
    sweep = measured_sweep(hardware.name)
    if sweep is None:
        return hardware.matmul_efficiency, hardware.efficiency_source
    points, source = sweep
    if flops <= points[0][0]:
        return points[0][1], source
    if flops >= points[-1][0]:
        return points[-1][1], source
    for (f0, e0), (f1, e1) in zip(points, points[1:]):
        if f0 <= flops <= f1:
            w = (math.log(flops) - math.log(f0)) / (math.log(f1) - math.log(f0))
            return e0 + w * (e1 - e0), source
    return points[-1][1], source


def gemm_efficiency(hardware, m: int, n: int, k: int, batch: int = 1, override: float | None = None) -> float:
    """Fraction of the peak a product ``(m x k) @ (k x n)`` (``batch`` of them) reaches: the base efficiency of a
    product of its FLOPs times its tile and wave utilisation over the reference square product's (the base was
    measured on squares, whose utilisation is already in it)."""
    flops = 2.0 * m * n * k * batch
    measured = measured_shapes(hardware.name).get((m, n, k)) if batch == 1 and override is None else None
    if measured:  # the GPU report measured this very product
        return measured
    base, _ = gemm_base_efficiency(hardware, flops, override)
    side = round((flops / 2) ** (1 / 3))
    reference = tile_utilisation(side, side, 1, hardware.sms) if measured_sweep(hardware.name) else 1.0
    return base * tile_utilisation(m, n, batch, hardware.sms) / reference


def attention_efficiency(hardware, seq: int, phase: str) -> float:
    """FlashAttention's fraction of the peak at sequence length ``seq`` for the forward (``phase`` ``F``) or the
    backward pass: the device's published throughput by sequence length where it has one
    (:attr:`course.hardware.Hardware.attention_table`: FlashAttention-2 on the H100, interpolated in ``log(seq)``,
    held flat beyond its ends, over the 989 TFLOP/s of the H100 SXM5 it was measured on); else
    :attr:`course.hardware.Hardware.attention_efficiency`."""
    if not hardware.attention_table:
        return hardware.attention_efficiency
    column = 1 if phase == "F" else 2
    points = [(row[0], row[column] / 989e12) for row in hardware.attention_table]
    if seq <= points[0][0]:
        return points[0][1]
    for (s0, e0), (s1, e1) in zip(points, points[1:]):
        if seq <= s1:
            w = (math.log(seq) - math.log(s0)) / (math.log(s1) - math.log(s0))
            return e0 + w * (e1 - e0)
    return points[-1][1]


def clock_factor(hardware) -> float:
    """The fraction of its reference clock ``hardware`` holds under its power limit: ``(power_w /
    reference_power_w) ** (1/3)``, at most 1 (power goes as the clock cubed: :mod:`course.hardware`); 1 where the
    profile does not say (``power_w`` or ``reference_power_w`` 0)."""
    if hardware.power_w <= 0 or hardware.reference_power_w <= 0:
        return 1.0
    return min(1.0, (hardware.power_w / hardware.reference_power_w) ** (1.0 / 3.0))


def contention_seconds(hidden_s: float, hardware) -> float:
    """Seconds the computation loses to ``hidden_s`` seconds of communication running beside it: the SMs the
    collective holds (:attr:`course.hardware.Hardware.comm_sms`) as a share of the device's (module docstring); 0
    where they are not modelled (the CPU)."""
    if hardware.sms <= 0 or hardware.comm_sms <= 0 or hidden_s <= 0:
        return 0.0
    return hidden_s * min(1.0, hardware.comm_sms / hardware.sms)


def kernel_seconds(kernel: Kernel, hardware, precision: str, override: float | None = None) -> float:
    """Seconds of ``kernel`` (all its ``count`` runs) on ``hardware``: the roofline of the module docstring, its
    compute at the clock the power limit holds (:func:`clock_factor`). On a device without a memory bandwidth (the
    CPU), FLOPs at the measured rate only."""
    peak = hardware.peak_flops[precision] * clock_factor(hardware)
    if "achieved_flops" in hardware.notes:  # the CPU: a whole block's measured FLOP/s, kernels and Python together
        return kernel.count * kernel.flops / hardware.notes["achieved_flops"]
    if kernel.kind == "gemm":
        m, n, k, batch = kernel.shape
        compute = kernel.flops / (peak * gemm_efficiency(hardware, m, n, k, batch, override))
    elif kernel.kind == "attention":
        compute = kernel.flops / (peak * attention_efficiency(hardware, kernel.shape[0], kernel.phase))
    else:
        compute = kernel.flops / peak
    reached = measured_memory_efficiency(hardware.name) or hardware.memory_efficiency
    memory = kernel.bytes / (hardware.memory_bandwidth * reached) if hardware.memory_bandwidth else 0.0
    return kernel.count * max(compute, memory)
