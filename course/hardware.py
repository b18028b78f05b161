"""Devices as the planner (``project/plan.py``) and notebooks 04-06 describe them: peak FLOP/s, memory, links.

Profiles: :data:`HARDWARE` ``h100``, ``h200``, ``a100`` (DGX nodes of 8 SXM GPUs) and ``l4`` (nodes of 8 PCIe L4).

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

=================  =========================
                   L4 24 GB (PCIe card)
=================  =========================
bf16 tensor core   121 TFLOP/s
fp32 (no tensor)   30.3 TFLOP/s
memory             24 GB GDDR6
NVLink             none
PCIe               Gen4 x16: 32 GB/s/dir.
network / GPU      100 Gb/s Ethernet per node of 8 L4 = 1.56 GB/s
=================  =========================

**Link levels.** Every profile names its two levels explicitly: ``intra`` (between the GPUs of one node:
NVLink through NVSwitch on DGX/HGX H100, H200 and A100; PCIe on an L4 node, which has no NVLink) and
``inter`` (between nodes: one InfiniBand port per GPU on DGX — NDR 400 Gb/s for H100/H200, HDR 200 Gb/s
for A100 — and on an L4 node the node's one Ethernet NIC shared by its GPUs), and ``devices_per_node``
(8 for DGX/HGX; 8 for the L4 nodes the clouds rent, GCP ``g2-standard-96`` and AWS ``g6.48xlarge``, each
with 100 Gb/s of network for the node). :meth:`Hardware.placement` says how a group of the mesh lands on
the nodes (members per node, nodes), and :func:`communication.alpha_beta.hierarchical_seconds` prices a
collective of a group that spans nodes in two levels (intra, then inter, then intra).

**Matrix-product efficiency.** ``matmul_efficiency`` is the fraction of the datasheet peak the best-shaped
bf16 matrix product reaches, as measured by the "Maximum Achievable Matmul FLOPS" (MAMF) table of
S. Bekman, *Machine Learning Engineering* (github.com/stas00/ml-engineering, compute/accelerator/README.md,
BF16 table, torch 2.6-2.7): A100 SXM 271.2 of 312 TFLOP/s (86.9 %), H100 SXM 794.5 of 989 (80.3 %), GH200
(the H100's compute with the H200's 141 GB HBM3e) 828.6 of 989 (83.6 %, used for the H200). The L4 is not in
that table: its efficiency is the H100's, an assumption (a 72 W card probably reaches less). The planner
prefers a measurement of this course's GPU report (``results/gpu/``: ``matmul.measured_over_datasheet``)
when one exists for the device (:func:`project.plan.compute_efficiency`).

Sources: NVIDIA L4 Tensor Core GPU datasheet (2023: "BF16 Tensor Core 242 teraFLOPS*", "*with sparsity",
i.e. 121 dense; FP32 30.3 TFLOPS; 24 GB GDDR6 at 300 GB/s; PCIe Gen4 x16 64 GB/s bidirectional; no
NVLink); Google Cloud G2 machine series (g2-standard-96: 8 L4, 100 Gbps egress) and AWS EC2 G6 (g6.48xlarge:
8 L4, 100 Gbps); NVIDIA H100 Tensor Core GPU datasheet (2023: "BFLOAT16 Tensor Core 1,979 teraFLOPS*", "*with
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
(``project/tools/gpu_report.py``): :data:`GPU_DATASHEETS`, the datasheets' "with sparsity" figures halved.

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
    matmul_efficiency: float = 1.0
    efficiency_source: str = "the datasheet peak itself (no efficiency known)"

    def placement(self, size: int, stride: int, devices_per_node: int | None = None) -> tuple[int, int]:
        """``(members per node, nodes)`` of a group of ``size`` ranks ``stride`` device numbers apart (the mesh
        numbers devices node by node, ``devices_per_node`` each; default :attr:`devices_per_node`).

        In the course's mesh (``pp, dp, cp, tp``, tp fastest: :mod:`course.mesh`) a tp group has stride 1, a cp
        group stride ``tp``, a dp group stride ``cp * tp``, a pp group stride ``dp * cp * tp``. With 8 GPUs per
        node: tp <= 8 stays inside a node (NVLink); a dp group has ``8 / (cp tp)`` members per node (1 when
        ``cp tp >= 8``: every hop crosses the network); a pp group crosses nodes once ``dp cp tp >= 8``.

        Raises:
            ValueError: ``size`` or ``stride`` < 1.
        """
        if size < 1 or stride < 1:
            raise ValueError(f"a group needs size >= 1 and stride >= 1, not {size} and {stride}")
        per_node = devices_per_node or self.devices_per_node
        if self.inter is None or size * stride <= per_node:
            return size, 1
        members = max(1, min(size, per_node // stride))
        return members, -(-size // members)

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
PCIE4_L4 = Link("pcie", 5.7 * US, 1 / (32 * GB), NCCL_BASE, f"L4 datasheet (PCIe Gen4 x16 64 GB/s bidirectional); {NCCL}")
ETH_L4 = Link("ethernet", 9.6 * US, 1 / (100 / 8 / 8 * GB), NCCL_BASE,
              f"GCP g2-standard-96 / AWS g6.48xlarge: 100 Gb/s per node of 8 L4, shared: 1.56 GB/s per GPU; {NCCL}")
MAMF = "Bekman, ML Engineering, compute/accelerator/README.md, MAMF BF16 table"

HARDWARE: dict[str, Hardware] = {
    "h100": Hardware("h100", {"bf16": 989e12, "fp32": 67e12}, 80 * GB, NVLINK4, IB_NDR, 8,
                     "NVIDIA H100 Tensor Core GPU datasheet (SXM5, dense figures); DGX H100", {"pcie": PCIE5},
                     794.5 / 989, f"{MAMF}: H100 SXM 794.5 of 989 TFLOP/s"),
    "h200": Hardware("h200", {"bf16": 989e12, "fp32": 67e12}, 141 * GB, NVLINK4, IB_NDR, 8,
                     "NVIDIA H200 Tensor Core GPU datasheet (SXM, dense figures); DGX H200", {"pcie": PCIE5},
                     828.6 / 989, f"{MAMF}: GH200 (H100 compute, 141 GB HBM3e) 828.6 of 989 TFLOP/s"),
    "a100": Hardware("a100", {"bf16": 312e12, "fp32": 19.5e12}, 80 * GB, NVLINK3, IB_HDR, 8,
                     "NVIDIA A100 Tensor Core GPU datasheet (SXM4 80 GB, dense figures); DGX A100", {"pcie": PCIE4},
                     271.2 / 312, f"{MAMF}: A100 SXM 271.2 of 312 TFLOP/s"),
    "l4": Hardware("l4", {"bf16": 121e12, "fp32": 30.3e12}, 24 * GB, PCIE4_L4, ETH_L4, 8,
                   "NVIDIA L4 Tensor Core GPU datasheet (dense figures: 242 with sparsity halved); 8 per node "
                   "(GCP g2-standard-96, AWS g6.48xlarge)", {"pcie": PCIE4_L4},
                   794.5 / 989, f"assumed: the H100 SXM's MAMF efficiency ({MAMF}; the L4 is not in it)"),
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
