"""What the GPU's kernels reach, for the GPU report (:mod:`project.tools.gpu_report`, its steps 2 and 6).

* :func:`matmul_peak`: the measured bf16 matrix-product peak — square ``n x n`` products, each timed repeat running
  enough of them for :data:`MATMUL_FLOPS_PER_REPEAT` — beside the datasheet's dense bf16 peak;
* :func:`kernel_figures`: the figures the planner's roofline rests on — the bf16 products of the shapes the planner
  prices (:data:`PLANNER_SHAPES`) beside its efficiency for each (:func:`project.planner.pricing.gemm_efficiency`),
  the bandwidth memory-bound kernels reach (:data:`MEMORY_ELEMENTS` each) over the datasheet's, and SDPA's causal
  attention at :data:`ATTENTION_SEQS` beside the planner's attention efficiency;
* :func:`release`: what a measurement left on the device, freed before the next one.

Every timing goes through the course's one harness (:func:`course.benchmarking.interleaved`). Sizes per device: a
GPU's, and the CPU dry run's tiny ones (they only prove the code runs).
"""
from __future__ import annotations

import gc

# (name, M tokens, N, K) of the products the planner prices: Llama 3 8B's layer (wq, wk/wv with 8 key/value heads,
# wo, w1/w3, w2) and GPT-2's (qkv, fc, fc_proj) at 2048 and 16384 tokens per micro-batch, tp 1 and 8
PLANNER_SHAPES = {"cuda": [(f"{name} tp{t} M{m}", m, n // (t if split == "n" else 1), k // (t if split == "k" else 1))
                           for m in (2048, 16384) for t in (1, 8)
                           for name, n, k, split in (("llama3-8b wq", 4096, 4096, "n"), ("llama3-8b wk", 1024, 4096, "n"),
                                                     ("llama3-8b wo", 4096, 4096, "k"), ("llama3-8b w1", 14336, 4096, "n"),
                                                     ("llama3-8b w2", 4096, 14336, "k"), ("gpt2 qkv", 2304, 768, "n"),
                                                     ("gpt2 fc", 3072, 768, "n"), ("gpt2 fc_proj", 768, 3072, "k"))],
                  "cpu": [("tiny fc", 64, 128, 32), ("tiny fc_proj", 64, 32, 128)]}
MEMORY_ELEMENTS = {"cuda": 1 << 28, "cpu": 1 << 12}  # elements per memory-bound kernel (512 MiB of bf16 on a GPU)
ATTENTION_SEQS = {"cuda": [2048, 4096, 8192], "cpu": [16]}
MATMUL_FLOPS_PER_REPEAT = {"cuda": 2e13, "cpu": 2e7}  # products per timed repeat: at least this many FLOPs


def release(device) -> None:
    """Free what the last measurement left on ``device`` (garbage, and on a GPU the allocator's cache)."""
    import torch

    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def matmul_peak(device, sizes: list[int], repeats: int, warmup: int, datasheet: dict | None) -> dict:
    """FLOP/s of bf16 ``n x n`` products for each ``n`` of ``sizes``, interleaved (each timed repeat runs enough
    products for :data:`MATMUL_FLOPS_PER_REPEAT`); the best median is the measured peak."""
    import torch

    from course.benchmarking import interleaved, summarise

    torch.manual_seed(0)  # the values do not matter for the time; drawn on the device (an n = 16384 pair on the
    work, calls = {}, {}  # host would take seconds)
    for n in sizes:
        a = torch.randn(n, n, device=device, dtype=torch.bfloat16)
        b = torch.randn(n, n, device=device, dtype=torch.bfloat16)
        calls[n] = max(1, int(MATMUL_FLOPS_PER_REPEAT[device.type] // (2.0 * n ** 3)))
        work[str(n)] = (lambda a=a, b=b, k=calls[n]: [torch.mm(a, b) for _ in range(k)])
    seconds = interleaved(work, repeats, warmup, device)
    rows = [{"n": n, "products_per_repeat": calls[n],
             "flop_per_s": summarise([calls[n] * 2.0 * n ** 3 / t for t in seconds[str(n)]])} for n in sizes]
    best = max(rows, key=lambda r: r["flop_per_s"]["median"])
    del work
    return {"dtype": "bfloat16", "sizes": rows, "measured_peak": {"n": best["n"], "flop_per_s": best["flop_per_s"]},
            "datasheet": datasheet,
            "measured_over_datasheet": best["flop_per_s"]["median"] / datasheet["flops"] if datasheet else None}


def _rate(device, repeats: int, warmup: int, work: dict, amount: dict) -> dict:
    """``{name: summarise(amount[name] / seconds)}`` of the interleaved ``work``."""
    from course.benchmarking import interleaved, summarise

    seconds = interleaved(work, repeats, warmup, device)
    return {name: summarise([amount[name] / t for t in seconds[name]]) for name in work}


def kernel_figures(device, args, datasheet: dict | None, planner_kind: str) -> dict:
    """The figures the planner's roofline rests on, measured here (:mod:`project.tools.gpu_report`'s docstring, 6): ``{"gemm": [{"name", "m",
    "n", "k", "flop_per_s", "efficiency" (over the datasheet; None without one), "planner" (the planner's
    efficiency for the shape on ``planner_kind``)}], "memory": {kernel: {"bytes_per_s", "efficiency"}},
    "attention": [{"seq", "forward_flop_per_s", "backward_flop_per_s", "planner_forward", "planner_backward"}],
    "hbm_datasheet" (bytes/s)}``."""
    import torch
    import torch.nn.functional as F

    from course.hardware import HARDWARE
    from project.planner.pricing import attention_efficiency, gemm_efficiency

    kind = device.type
    peak = datasheet["flops"] if datasheet else None
    hw = HARDWARE.get(planner_kind)
    gemm_work, gemm_flops, rows = {}, {}, []
    for name, m, n, k in PLANNER_SHAPES[kind]:
        a = torch.randn(m, k, device=device, dtype=torch.bfloat16)
        b = torch.randn(k, n, device=device, dtype=torch.bfloat16)
        calls = max(1, int(MATMUL_FLOPS_PER_REPEAT[kind] // (2.0 * m * n * k)))
        gemm_work[name] = (lambda a=a, b=b, c=calls: [torch.mm(a, b) for _ in range(c)])
        gemm_flops[name] = 2.0 * m * n * k * calls
        rows.append({"name": name, "m": m, "n": n, "k": k})
    rates = _rate(device, args.repeats, args.warmup, gemm_work, gemm_flops)
    for row in rows:
        row["flop_per_s"] = rates[row["name"]]
        row["efficiency"] = row["flop_per_s"]["median"] / peak if peak else None
        row["planner"] = gemm_efficiency(hw, row["m"], row["n"], row["k"]) if hw else None
    del gemm_work
    release(device)
    n = MEMORY_ELEMENTS[kind]
    x = torch.randn(n, device=device, dtype=torch.bfloat16)
    y = torch.randn(n, device=device, dtype=torch.bfloat16)
    norm = torch.nn.LayerNorm(1024, device=device, dtype=torch.bfloat16) if kind == "cuda" else \
        torch.nn.LayerNorm(64, device=device, dtype=torch.bfloat16)
    rows2 = x.view(-1, norm.normalized_shape[0])
    memory_work = {"copy": lambda: y.copy_(x), "add": lambda: x + y, "gelu": lambda: F.gelu(x),
                   "layernorm": lambda: norm(rows2)}
    moved = {"copy": 4.0 * n, "add": 6.0 * n, "gelu": 4.0 * n, "layernorm": 4.0 * n}  # bytes read + written (bf16)
    bandwidth = _rate(device, args.repeats, args.warmup, memory_work, moved)
    hbm = hw.memory_bandwidth if (hw and kind == "cuda") else None
    memory = {name: {"bytes_per_s": r, "efficiency": r["median"] / hbm if hbm else None}
              for name, r in bandwidth.items()}
    del x, y, rows2
    release(device)
    attention = []
    for seq in ATTENTION_SEQS[kind]:
        heads, d = (16, 128) if kind == "cuda" else (2, 8)
        batch = max(1, (16384 if kind == "cuda" else 32) // seq)
        q, k_, v = (torch.randn(batch, heads, seq, d, device=device, dtype=torch.bfloat16, requires_grad=True)
                    for _ in range(3))
        flops = 4.0 * batch * heads * seq * seq * d * 0.5  # causal: half the products (the planner's count, ~)
        def forward():
            return F.scaled_dot_product_attention(q, k_, v, is_causal=True)

        def backward():
            forward().sum().backward()

        times = _rate(device, args.repeats, args.warmup, {"forward": forward, "forward and backward": backward},
                      {"forward": flops, "forward and backward": 3.5 * flops})
        out = {"seq": seq, "batch": batch, "heads": heads, "head_dim": d,
               "forward_flop_per_s": times["forward"], "forward_backward_flop_per_s": times["forward and backward"],
               "planner_forward": attention_efficiency(hw, seq, "F") * hw.peak_flops["bf16"] if hw else None,
               "planner_backward": attention_efficiency(hw, seq, "B") * hw.peak_flops["bf16"] if hw else None}
        attention.append(out)
        del q, k_, v
        release(device)
    return {"gemm": rows, "memory": memory, "attention": attention, "hbm_datasheet": hbm,
            "planner_hardware": planner_kind, "planner_memory_efficiency": hw.memory_efficiency if hw else None}
