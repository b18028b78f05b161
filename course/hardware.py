"""Devices as the planner (``project/plan.py``) and notebooks 04-06 describe them: peak FLOP/s, memory, links.

A :class:`Link` is the alpha-beta model of one kind of connection between two devices (Hockney 1994):
a message of N bytes takes ``alpha + beta * N`` seconds per step of a collective. A :class:`Hardware`
is one device type with its links: ``intra`` between devices of a node, ``inter`` between nodes.

Published figures (dense, i.e. without 2:4 sparsity; "per direction" = half of NVIDIA's bidirectional
figure):

=================  =========================  ==========================
                   H100 SXM5 80 GB            A100 SXM4 80 GB
=================  =========================  ==========================
bf16 tensor core   989 TFLOP/s                312 TFLOP/s
fp32 (no tensor)   67 TFLOP/s                 19.5 TFLOP/s
memory             80 GB HBM3                 80 GB HBM2e
NVLink             900 GB/s (4th gen), i.e.   600 GB/s (3rd gen), i.e.
                   450 GB/s per direction     300 GB/s per direction
PCIe               Gen5 x16: 64 GB/s/dir.     Gen4 x16: 32 GB/s/dir.
InfiniBand / GPU   NDR 400 Gb/s = 50 GB/s     HDR 200 Gb/s = 25 GB/s
=================  =========================  ==========================

Sources: NVIDIA H100 Tensor Core GPU datasheet (2023: "BFLOAT16 Tensor Core 1,979 teraFLOPS*", "*with
sparsity", FP32 67 TFLOPS, NVLink 900 GB/s, PCIe Gen5 128 GB/s); NVIDIA A100 Tensor Core GPU datasheet
(2021: BF16 312 / 624* TFLOPS, FP32 19.5 TFLOPS, NVLink 600 GB/s, PCIe Gen4 64 GB/s); the DGX H100 and
DGX A100 user guides (eight ConnectX-7 NDR 400 Gb/s, resp. ConnectX-6 HDR 200 Gb/s, compute ports: one
per GPU). Latencies per ring step are NCCL's own cost model (``src/graph/tuning.cc``, ``hwLat`` for the
ring algorithm and the Simple protocol: 3.4 us over NVLink, 5.7 us over PCIe, 9.6 us over the network),
and every collective adds NCCL's base latency (``baseLat``, ring/Simple: 8.4 us).

The CPU of this machine has no published figure that fits: the planner measures it (matrix-product
FLOP/s per rank while every rank computes, gloo all-reduce times fitted to alpha-beta lines:
``project/plan_measure.py``).
"""
from __future__ import annotations

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
    "a100": Hardware("a100", {"bf16": 312e12, "fp32": 19.5e12}, 80 * GB, NVLINK3, IB_HDR, 8,
                     "NVIDIA A100 Tensor Core GPU datasheet (SXM4 80 GB, dense figures)", {"pcie": PCIE4}),
}
