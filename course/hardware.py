"""Devices as the planner (``project/plan.py``) and notebooks 04-06 describe them: peak FLOP/s, memory, links.

A :class:`Link` is the alpha-beta model of one kind of connection between two devices (Hockney 1994):
a message of N bytes takes ``alpha + beta * N`` seconds per step of a collective. A :class:`Hardware`
is one device type with its links: ``intra`` between devices of a node, ``inter`` between nodes.

Published figures (dense, i.e. without 2:4 sparsity; "per direction" = half of NVIDIA's bidirectional
figure):

=================  =========================  =========================  ==========================
                   H100 SXM5 80 GB            H200 SXM 141 GB            A100 SXM4 80 GB
=================  =========================  =========================  ==========================
bf16 tensor core   989 TFLOP/s                989 TFLOP/s                312 TFLOP/s
fp32 (no tensor)   67 TFLOP/s                 67 TFLOP/s                 19.5 TFLOP/s
memory             80 GB HBM3                 141 GB HBM3e               80 GB HBM2e
NVLink             900 GB/s (4th gen), i.e.   900 GB/s (4th gen), i.e.   600 GB/s (3rd gen), i.e.
                   450 GB/s per direction     450 GB/s per direction     300 GB/s per direction
PCIe               Gen5 x16: 64 GB/s/dir.     Gen5 x16: 64 GB/s/dir.     Gen4 x16: 32 GB/s/dir.
InfiniBand / GPU   NDR 400 Gb/s = 50 GB/s     NDR 400 Gb/s = 50 GB/s     HDR 200 Gb/s = 25 GB/s
=================  =========================  =========================  ==========================

Sources: NVIDIA H100 Tensor Core GPU datasheet (2023: "BFLOAT16 Tensor Core 1,979 teraFLOPS*", "*with
sparsity", FP32 67 TFLOPS, NVLink 900 GB/s, PCIe Gen5 128 GB/s); NVIDIA H200 Tensor Core GPU datasheet
(2024, H200 SXM: BFLOAT16 Tensor Core 1,979 TFLOPS with sparsity, FP32 67 TFLOPS, 141 GB HBM3e, NVLink
900 GB/s, PCIe Gen5 128 GB/s; the same GH100 compute as the H100 SXM5, more and faster memory); NVIDIA
A100 Tensor Core GPU datasheet (2021: BF16 312 / 624* TFLOPS, FP32 19.5 TFLOPS, NVLink 600 GB/s, PCIe
Gen4 64 GB/s); the DGX H100/H200 and DGX A100 user guides (eight ConnectX-7 NDR 400 Gb/s, resp.
ConnectX-6 HDR 200 Gb/s, compute ports: one per GPU). Latencies per ring step are NCCL's own cost model
(``src/graph/tuning.cc``, ``hwLat`` for the ring algorithm and the Simple protocol: 3.4 us over NVLink,
5.7 us over PCIe, 9.6 us over the network), and every collective adds NCCL's base latency (``baseLat``,
ring/Simple: 8.4 us).

:func:`datasheet_bf16_peak` finds the dense bf16 peak of a GPU by the name CUDA gives it
(``torch.cuda.get_device_name``), for MFU and for the measured matrix-product peak of the GPU report
(``project/gpu_report.py``): :data:`GPU_DATASHEETS`, the datasheets' "with sparsity" figures halved.

The CPU of this machine has no published figure that fits: the planner measures it (matrix-product
FLOP/s per rank while every rank computes, gloo all-reduce times fitted to alpha-beta lines:
``project/plan_measure.py``).
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

GB = 1e9
US = 1e-6


@dataclass(frozen=True)
class Link:
    """A connection's alpha-beta model.

    Attributes:
        name: e.g. ``"nvlink"``.
        alpha: seconds per step of a collective (latency).
        beta: seconds per byte (1 / bandwidth per direction).
        base: seconds every collective call costs once, whatever its steps (NCCL's base latency).
        source: where the numbers come from.
    """

    name: str
    alpha: float
    beta: float
    base: float = 0.0
    source: str = ""

    @property
    def bandwidth(self) -> float:
        """Bytes per second per direction."""
        return 1.0 / self.beta


@dataclass(frozen=True)
class Hardware:
    """One kind of device and how devices of it connect.

    Attributes:
        name: e.g. ``"h100"``.
        peak_flops: ``{"bf16": ..., "fp32": ...}`` FLOP/s of one device (dense matrix products).
        memory_bytes: memory of one device.
        intra: the link between devices of one node; ``inter``: between nodes (None: one node only).
        devices_per_node: devices that share ``intra``.
        source: where the numbers come from.
    """

    name: str
    peak_flops: dict
    memory_bytes: float
    intra: Link
    inter: Link | None
    devices_per_node: int
    source: str = ""
    notes: dict = field(default_factory=dict)

    def link(self, group_span: int) -> Link:
        """The link a group crosses whose ranks span ``group_span`` consecutive device numbers (its size
        times its stride in the mesh): ``intra`` when that fits in one node, else ``inter``."""
        if group_span <= self.devices_per_node or self.inter is None:
            return self.intra
        return self.inter


NCCL_BASE = 8.4 * US  # NCCL tuning.cc baseLat, ring / Simple
NCCL = "NCCL src/graph/tuning.cc (hwLat, ring/Simple)"
NVLINK4 = Link("nvlink", 3.4 * US, 1 / (450 * GB), NCCL_BASE, f"H100 datasheet (900 GB/s bidirectional); {NCCL}")
NVLINK3 = Link("nvlink", 3.4 * US, 1 / (300 * GB), NCCL_BASE, f"A100 datasheet (600 GB/s bidirectional); {NCCL}")
PCIE5 = Link("pcie", 5.7 * US, 1 / (64 * GB), NCCL_BASE, f"H100 datasheet (PCIe Gen5 128 GB/s bidirectional); {NCCL}")
PCIE4 = Link("pcie", 5.7 * US, 1 / (32 * GB), NCCL_BASE, f"A100 datasheet (PCIe Gen4 64 GB/s bidirectional); {NCCL}")
IB_NDR = Link("infiniband", 9.6 * US, 1 / (50 * GB), NCCL_BASE, f"DGX H100: one NDR 400 Gb/s port per GPU; {NCCL}")
IB_HDR = Link("infiniband", 9.6 * US, 1 / (25 * GB), NCCL_BASE, f"DGX A100: one HDR 200 Gb/s port per GPU; {NCCL}")

HARDWARE: dict[str, Hardware] = {
    "h100": Hardware("h100", {"bf16": 989e12, "fp32": 67e12}, 80 * GB, NVLINK4, IB_NDR, 8,
                     "NVIDIA H100 Tensor Core GPU datasheet (SXM5, dense figures)", {"pcie": PCIE5}),
    "h200": Hardware("h200", {"bf16": 989e12, "fp32": 67e12}, 141 * GB, NVLINK4, IB_NDR, 8,
                     "NVIDIA H200 Tensor Core GPU datasheet (SXM, dense figures)", {"pcie": PCIE5}),
    "a100": Hardware("a100", {"bf16": 312e12, "fp32": 19.5e12}, 80 * GB, NVLINK3, IB_HDR, 8,
                     "NVIDIA A100 Tensor Core GPU datasheet (SXM4 80 GB, dense figures)", {"pcie": PCIE4}),
}


# Dense bf16 tensor-core peaks (FLOP/s, no 2:4 sparsity: half the datasheets' starred "with sparsity" figure,
# rounded down to the TFLOP/s, as the table above has it) of
# the GPUs a course run may land on, matched in this order against the name CUDA reports ("NVIDIA H100 80GB
# HBM3", "NVIDIA H100 PCIe", "NVIDIA A100-SXM4-80GB", "NVIDIA L4", ...): (pattern, model, FLOP/s, source).
GPU_DATASHEETS: list[tuple[str, str, float, str]] = [
    (r"\bGH200\b", "GH200 (H100 compute)", 989e12, "NVIDIA GH200 Grace Hopper Superchip datasheet: FP16/BF16 "
                                                 "1,979 TFLOPS with sparsity"),
    (r"\bH200 NVL\b", "H200 NVL", 835e12, "NVIDIA H200 Tensor Core GPU datasheet: H200 NVL BFLOAT16 1,671 TFLOPS with "
                                         "sparsity"),
    (r"\bH200\b", "H200 SXM", 989e12, "NVIDIA H200 Tensor Core GPU datasheet: H200 SXM BFLOAT16 1,979 TFLOPS with "
                                     "sparsity"),
    (r"\bH100 NVL\b", "H100 NVL", 835e12, "NVIDIA H100 Tensor Core GPU datasheet: H100 NVL BFLOAT16 1,671 TFLOPS with "
                                         "sparsity"),
    (r"\bH100 PCIe\b", "H100 PCIe", 756e12, "NVIDIA H100 Tensor Core GPU datasheet: H100 PCIe BFLOAT16 1,513 TFLOPS "
                                           "with sparsity"),
    (r"\bH100\b", "H100 SXM5", 989e12, "NVIDIA H100 Tensor Core GPU datasheet: H100 SXM BFLOAT16 1,979 TFLOPS with "
                                      "sparsity"),
    (r"\bA100\b", "A100", 312e12, "NVIDIA A100 Tensor Core GPU datasheet: BF16 312 / 624 TFLOPS (dense / sparse), "
                                 "SXM4 and PCIe alike"),
    (r"\bL40S\b", "L40S", 366e12, "NVIDIA L40S datasheet: BF16 Tensor Core 733 TFLOPS with sparsity"),
    (r"\bL4\b", "L4", 121e12, "NVIDIA L4 Tensor Core GPU datasheet: BF16 Tensor Core 242 TFLOPS with sparsity"),
    (r"\bA10\b", "A10", 125e12, "NVIDIA A10 Tensor Core GPU datasheet: BF16 Tensor Core 125 / 250 TFLOPS (dense / "
                               "sparse)"),
]


def datasheet_bf16_peak(gpu_name: str) -> dict | None:
    """The datasheet's dense bf16 tensor-core peak of the GPU CUDA calls ``gpu_name``: ``{"model", "flops"
    (FLOP/s, dense), "source"}`` from :data:`GPU_DATASHEETS`, or None for a GPU not listed there."""
    for pattern, model, flops, source in GPU_DATASHEETS:
        if re.search(pattern, gpu_name, flags=re.IGNORECASE):
            return {"model": model, "flops": flops, "source": source}
    return None
