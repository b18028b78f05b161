"""Devices as the planner (``python -m project.planner``) and notebooks 04-06 describe them: peak FLOP/s, memory, links.

Profiles: :data:`HARDWARE` ``h100``, ``h200``, ``a100`` (DGX nodes of 8 SXM GPUs), ``h100-96gb`` (the 96 GB HBM2e
SXM H100 held to 500 W of torchtitan's published runs) and ``l4`` (nodes of 8 PCIe L4).

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
when one exists for the device (:func:`project.planner.pricing.gemm_base_efficiency`).

**What a kernel reaches** (the planner's per-kernel roofline, :mod:`project.planner.pricing`). Beside the peaks, each
profile carries the datasheet's memory bandwidth and streaming multiprocessors, and the fractions of them real
kernels reach, each from a named measurement:

* ``memory_efficiency``: a memory-bound kernel streams at 88 % of the datasheet's HBM bandwidth — 1.80 of 2.04 TB/s
  measured on an A100 80 GB SXM by a bandwidth kernel, "around 90 %" the best of any kernel in NVIDIA's GTC 2025
  talk it cites (NVIDIA developer forum, "Trouble to reach peak bandwidth of A100", 2025); the same fraction is
  taken for the other GPUs (an assumption until the course's GPU report measures it: ``project/tools/gpu_report.py``);
* ``attention_efficiency``: FlashAttention-2's throughput as a fraction of the dense peak — on H100 by sequence
  length, forward and backward (:data:`FA2_H100_TABLE`: Shah et al. 2024, FlashAttention-3, Figs. 5 and 6, head
  dimension 128: 191 to 335 TFLOP/s forward, 214 to 322 backward), on A100 73 % (Dao 2023, FlashAttention-2,
  abstract: "50-73 % of the theoretical maximum FLOPs/s on A100");
* ``sms``: streaming multiprocessors (A100 108, H100 SXM and H200 132, L4 58; the GPUs' whitepapers and
  datasheets), over which a matrix product's tiles run in waves;
* ``power_w`` and ``reference_power_w``: the board power limit the profile runs at, and the limit of the part its
  efficiency figures were measured on (the H100 SXM5's 700 W, the A100 SXM4's 400 W, the H200 SXM's 700 W: the
  datasheets' maximum TDP, the default limit). A GPU held below the power its matrix products draw lowers its
  clock until they fit: dynamic power is ``C V^2 f`` and the voltage scales with the clock in that range, so power
  goes as ``f^3`` and the clock a limit allows as its cube root (:func:`project.planner.pricing.clock_factor`).
  The reference figures come from sustained products, the kernels that draw the most power, so they already
  carry the clock the reference limit holds; a whole step draws no more, and only a lower limit changes it. Two
  checks on GH100 and GA100 parts held to less power: NVIDIA's datasheet rates the H100 NVL (350-400 W) at 835 of
  the SXM5's 989 TFLOP/s, 0.844, where the cube root of 400 / 700 gives 0.830; the MAMF table's A100 PCIe (250 or
  300 W; the table does not say which card) reached 252.9 TFLOP/s against the 400 W A100 SXM's 271.2, 0.933, where
  the cube root gives 0.855 or 0.909: the law errs, if anything, toward too large a loss;
* ``comm_sms``: the SMs a running collective holds (:data:`NCCL_CTAS`), which the computation it overlaps loses
  (:func:`project.planner.pricing.contention_seconds`);
* a link's ``efficiency``: the bus bandwidth ``nccl-tests`` measures over the link's per-direction bandwidth —
  NVLink 4 (8 x H200, ring): all-reduce 367.2, all-gather 361.4, reduce-scatter 362.9 of 450 GB/s, 81 % (S. Bekman,
  Machine Learning Engineering, network/README.md, "SHARP", nccl 2.27.7, 16 GiB); NVLink 3: 235 of 300 GB/s, 78 %
  (same, "Unidirectional vs Bidirectional", nccl-tests all_reduce on an A100 node); between nodes: 36.95 of 50 GB/s
  per accelerator, 74 % (same, the 4-node all-reduce table, 16 GiB); PCIe: 55.4 of 63 GB/s, 88 % (same, PCIe
  section, nvbandwidth). The size dependence comes from NCCL's per-step latencies (``alpha``).

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
``project/planner/measure.py``).
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
        beta: seconds per byte (1 / bandwidth per direction, the datasheet's).
        base: seconds every collective call costs once, whatever its steps (NCCL's base latency).
        source: where the numbers come from.
        efficiency: the fraction of the bandwidth a collective's bus bandwidth reaches (module docstring).
        efficiency_source: where that fraction comes from.
    """

    name: str
    alpha: float
    beta: float
    base: float = 0.0
    source: str = ""
    efficiency: float = 1.0
    efficiency_source: str = "the datasheet's bandwidth itself"

    @property
    def achieved_beta(self) -> float:
        """Seconds per byte at the achievable bus bandwidth: ``beta / efficiency``."""
        return self.beta / self.efficiency

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
        matmul_efficiency: the best-shaped bf16 matrix product's fraction of the peak (``efficiency_source``).
        memory_bandwidth: the datasheet's memory bandwidth (bytes/s); ``memory_efficiency`` the fraction a
            memory-bound kernel reaches. sms: streaming multiprocessors (0: not modelled).
        attention_efficiency: FlashAttention-2's fraction of the peak (``attention_source``); ``attention_table``:
            its published throughput by sequence length where there is one (``(seq, forward FLOP/s, backward
            FLOP/s)``, :data:`FA2_H100_TABLE`).
        power_w: the board power limit the device runs at; reference_power_w: the limit of the part the
            efficiency figures were measured on (0: not modelled; module docstring).
        comm_sms: SMs a running collective holds (NCCL's CTAs, one per channel), taken from the computation it
            overlaps (:data:`NCCL_CTAS`; 0: not modelled).
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
    memory_bandwidth: float = 0.0
    memory_efficiency: float = 1.0
    sms: int = 0
    attention_efficiency: float = 1.0
    attention_source: str = "the datasheet peak itself"
    attention_table: tuple = ()
    power_w: float = 0.0
    reference_power_w: float = 0.0
    comm_sms: int = 0

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
BEKMAN = "S. Bekman, Machine Learning Engineering, network/README.md"
NVLINK4_EFF = (0.81, f"{BEKMAN}, SHARP section: nccl-tests ring all-reduce 367.2, all-gather 361.4, reduce-scatter "
                     "362.9 of 450 GB/s on 8 x H200 (NVLink 4), 16 GiB")
NVLINK3_EFF = (235 / 300, f"{BEKMAN}: nccl-tests all_reduce on an A100 node, 235 of 300 GB/s")
NETWORK_EFF = (36.95 / 50, f"{BEKMAN}: 4-node all-reduce, 36.95 of 50 GB/s per accelerator at 16 GiB")
PCIE_EFF = (55.43 / 63, f"{BEKMAN}, PCIe section: nvbandwidth 55.43 of 63 GB/s (PCIe 5 x16)")
NVLINK4 = Link("nvlink", 3.4 * US, 1 / (450 * GB), NCCL_BASE, f"H100 datasheet (900 GB/s bidirectional); {NCCL}",
               *NVLINK4_EFF)
NVLINK3 = Link("nvlink", 3.4 * US, 1 / (300 * GB), NCCL_BASE, f"A100 datasheet (600 GB/s bidirectional); {NCCL}",
               *NVLINK3_EFF)
PCIE5 = Link("pcie", 5.7 * US, 1 / (64 * GB), NCCL_BASE, f"H100 datasheet (PCIe Gen5 128 GB/s bidirectional); {NCCL}",
             *PCIE_EFF)
PCIE4 = Link("pcie", 5.7 * US, 1 / (32 * GB), NCCL_BASE, f"A100 datasheet (PCIe Gen4 64 GB/s bidirectional); {NCCL}",
             *PCIE_EFF)
IB_NDR = Link("infiniband", 9.6 * US, 1 / (50 * GB), NCCL_BASE, f"DGX H100: one NDR 400 Gb/s port per GPU; {NCCL}",
              *NETWORK_EFF)
IB_HDR = Link("infiniband", 9.6 * US, 1 / (25 * GB), NCCL_BASE, f"DGX A100: one HDR 200 Gb/s port per GPU; {NCCL}",
              *NETWORK_EFF)
PCIE4_L4 = Link("pcie", 5.7 * US, 1 / (32 * GB), NCCL_BASE, f"L4 datasheet (PCIe Gen4 x16 64 GB/s bidirectional); {NCCL}",
                *PCIE_EFF)
ETH_L4 = Link("ethernet", 9.6 * US, 1 / (100 / 8 / 8 * GB), NCCL_BASE,
              f"GCP g2-standard-96 / AWS g6.48xlarge: 100 Gb/s per node of 8 L4, shared: 1.56 GB/s per GPU; {NCCL}",
              *NETWORK_EFF)
MAMF = "Bekman, ML Engineering, compute/accelerator/README.md, MAMF BF16 table"

# SMs a running collective holds: an FSDP-style all-gather beside a matrix product on an H100 launched 24 blocks (NVIDIA
# developer forum, "Compute-Communication Overlap Causes Severe GEMM Performance Degradation because of Tail Effect");
# NCCL runs one CTA per channel. Taken for the A100 and H200 on NVLink too (an assumption: their channel counts are not
# measured); not modelled on the L4, whose PCIe rings NCCL runs on far fewer channels.
NCCL_CTAS = 24
HBM = 0.88  # memory-bound kernels: 1.80 of 2.04 TB/s on an A100 (module docstring)
FA2_H100 = (333 / 989, "Shah et al. 2024, FlashAttention-3, Figs. 5 and 6: FlashAttention-2 on H100 SXM5, head "
                       "dimension 128, forward (causal) and backward TFLOP/s by sequence length")
# (sequence length, forward TFLOP/s (causal), backward TFLOP/s) of FlashAttention-2 on H100 SXM5, head dimension 128:
# Shah et al. 2024 (FlashAttention-3), Fig. 5 (forward) and Fig. 6 (backward)
FA2_H100_TABLE = ((512, 191e12, 214e12), (1024, 260e12, 260e12), (2048, 298e12, 291e12), (4096, 319e12, 310e12),
                  (8192, 333e12, 318e12), (16384, 335e12, 322e12))
FA2_A100 = (0.73, "Dao 2023, FlashAttention-2, abstract: 50-73 % of the theoretical maximum FLOP/s on A100")

HARDWARE: dict[str, Hardware] = {
    "h100": Hardware("h100", {"bf16": 989e12, "fp32": 67e12}, 80 * GB, NVLINK4, IB_NDR, 8,
                     "NVIDIA H100 Tensor Core GPU datasheet (SXM5, dense figures); DGX H100", {"pcie": PCIE5},
                     794.5 / 989, f"{MAMF}: H100 SXM 794.5 of 989 TFLOP/s", 3.35e12, HBM, 132, *FA2_H100,
                     FA2_H100_TABLE, 700.0, 700.0, NCCL_CTAS),
    "h100-96gb": Hardware("h100-96gb", {"bf16": 989e12, "fp32": 67e12}, 96 * GB, NVLINK4, IB_NDR, 8,
                          "torchtitan's Grand Teton H100 (benchmarks/llama3_h100_202412_torchtitan.md): an SXM H100 "
                          "with 96 GB HBM2e at 2.4 TB/s, held to a 500 W power limit ('tuning it up to 700W TDP can "
                          "potentially provide further speedups'), 400 Gb/s RDMA per GPU; the SXM5's datasheet peak "
                          "(the same 132 SMs), its clock lowered by the 500 W limit (power_w)", {"pcie": PCIE5},
                          794.5 / 989, f"{MAMF}: H100 SXM 794.5 of 989 TFLOP/s (at 700 W)", 2.4e12, HBM, 132,
                          *FA2_H100, FA2_H100_TABLE, 500.0, 700.0, NCCL_CTAS),
    "h200": Hardware("h200", {"bf16": 989e12, "fp32": 67e12}, 141 * GB, NVLINK4, IB_NDR, 8,
                     "NVIDIA H200 Tensor Core GPU datasheet (SXM, dense figures); DGX H200", {"pcie": PCIE5},
                     828.6 / 989, f"{MAMF}: GH200 (H100 compute, 141 GB HBM3e) 828.6 of 989 TFLOP/s", 4.8e12, HBM,
                     132, *FA2_H100, FA2_H100_TABLE, 700.0, 700.0, NCCL_CTAS),
    "a100": Hardware("a100", {"bf16": 312e12, "fp32": 19.5e12}, 80 * GB, NVLINK3, IB_HDR, 8,
                     "NVIDIA A100 Tensor Core GPU datasheet (SXM4 80 GB, dense figures); DGX A100", {"pcie": PCIE4},
                     271.2 / 312, f"{MAMF}: A100 SXM 271.2 of 312 TFLOP/s", 2.039e12, HBM, 108, *FA2_A100,
                     power_w=400.0, reference_power_w=400.0, comm_sms=NCCL_CTAS),
    "l4": Hardware("l4", {"bf16": 121e12, "fp32": 30.3e12}, 24 * GB, PCIE4_L4, ETH_L4, 8,
                   "NVIDIA L4 Tensor Core GPU datasheet (dense figures: 242 with sparsity halved); 8 per node "
                   "(GCP g2-standard-96, AWS g6.48xlarge)", {"pcie": PCIE4_L4},
                   794.5 / 989, f"assumed: the H100 SXM's MAMF efficiency ({MAMF}; the L4 is not in it)", 300e9, HBM,
                   58, FA2_H100[0], f"assumed: the H100's ({FA2_H100[1]})"),
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
