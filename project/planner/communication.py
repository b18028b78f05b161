"""The calls one rank makes per step, the groups they run in, and what each costs on its links.

:func:`stage_communication` lists every call of a stage's rank per step as a :class:`Call` (group, kind, bytes of
the full tensor as :class:`course.collectives.CommCounter` records them, count): the tp all-reduces (or, with
sequence parallelism, all-gathers and reduce-scatters) of every block, forward, backward and recomputed forward;
the context-parallel exchange of K and V (a ring of sends, or Llama 3's all-gather and reduce-scatter: Dubey et al.
2024, Sec. 3.3.2) at the key/value heads' size; the expert all-to-alls; the pipeline's sends; the tied embedding's
all-reduce; the 3D step's scalars; and the data-parallel gradient reduction of the ZeRO stage (with ZeRO++'s int8
all-to-alls and gathers). :func:`call_seconds` prices one call (module :mod:`project.planner.pricing`).
"""
from __future__ import annotations

from dataclasses import dataclass

from project.planner.layout import sizes, stage_layout

GROUPS = ("tp", "cp", "pp", "embedding", "dp", "dp_shard", "ep", "edp")
ZEROPP_BLOCK = 64  # elements per int8 quantization block (memory.zeropp.ZeroPPModel's default)


@dataclass
class Call:
    """One kind of call a rank makes per step: ``count`` calls of ``kind`` about ``bytes`` (the full tensor) in
    ``group``; ``seconds`` (all of them) and ``traffic_bytes`` (what this rank sends, ring algorithm) are filled in
    by :func:`project.planner.step.predict`."""

    group: str
    kind: str
    bytes: float
    count: float
    seconds: float = 0.0
    traffic_bytes: float = 0.0


def zeropp_parts(config) -> tuple[str, ...]:
    """``--zeropp`` as names (``()`` without it, or without ``--zero 3``)."""
    from project.options.run_data_parallel import zeropp_parts as parts

    return parts(config.zero, config.zeropp)


def hpz_group_size(config) -> int:
    """dp ranks per hpZ group: ``--zeropp_group``, else the dp ranks on one node (at most dp)."""
    from project.options.run_data_parallel import node_group_size

    per_node = (config.devices_per_node or 8) // (config.cp * config.tp)
    return node_group_size(config.dp, config.zeropp_group, per_node)


def group_shape(config, name: str) -> tuple[int, int]:
    """``(size, span)`` of a group: its ranks and how many consecutive global ranks they spread over (the mesh
    orders its dimensions pp, dp, cp, tp, tp fastest: docs/architecture.md, "The device mesh"; ``dp_shard``: hpZ's
    node-sized group of dp ranks, :func:`hpz_group_size`)."""
    dp, pp, tp, cp, ep = config.dp, config.pp, config.tp, config.cp, config.ep
    if name == "dp_shard":
        g = hpz_group_size(config) if "hpz" in zeropp_parts(config) else 1
        return g, g * cp * tp
    return {"tp": (tp, tp), "cp": (cp, cp * tp), "dp": (dp * cp, dp * cp * tp), "pp": (pp, config.world_size),
            "embedding": (2 if pp > 1 else 1, config.world_size), "ep": (ep, ep * tp),
            "edp": (dp * cp // ep, dp * cp * tp)}[name]


def passes(config) -> int:
    """Forward passes of each block per micro-batch: 2 with full recomputation, else 1."""
    return 2 if config.activation_checkpointing else 1


def stage_communication(config, stage: int) -> list[Call]:
    """The calls one rank of ``stage`` makes per step (module docstring)."""
    z, lay = sizes(config), stage_layout(config, stage)
    m, v, t, e = config.micro_batches, config.virtual_stages, config.tp, z.e
    first, last = stage == 0, stage == config.pp - 1
    act = z.tokens * z.h * e                                # one micro-batch's hidden state (bytes)
    weight_bytes = 4 if config.precision == "fp32" else 2  # gathered in their precision
    grad_bytes = config.gradient_bytes  # reduced in --reduce_dtype's
    calls: list[Call] = []

    def call(group, kind, nbytes, count):
        if count and group_shape(config, group)[0] > 1:
            calls.append(Call(group, kind, float(nbytes), float(count)))

    tp_calls = (passes(config) + 1) * 2 * lay.blocks * m    # 2 per block forward (and recomputed), 2 backward
    if config.sequence_parallel:
        call("tp", "all_gather", act, tp_calls)
        call("tp", "reduce_scatter", act, tp_calls)
    else:
        call("tp", "all_reduce", act, tp_calls)
    if first:
        call("tp", "all_reduce", act, m)                    # vocabulary-parallel embedding
    if last:
        call("tp", "all_reduce", act, m)                    # the head's input gradient (backward of f)
        targets = z.s - 1 if config.cp == 1 else z.s        # next-token targets: the last position has none
        call("tp", "all_reduce", z.b * targets * 4, 3 * m)  # cross-entropy: max, sum of exp, target logit
    if config.pp > 1 or config.tp > 1:  # the 3D step (three_d.step): fp64 scalars
        call("tp", "all_reduce", 8, 1)                      # the gradient norm's square, over tp ...
        call("pp", "all_reduce", 8, 1)                      # ... and over pp
        call("dp", "all_reduce", 8, 2 if last else 1)       # the target count (and on the last stage the loss)
    sends = m * v - (m if last else 0) + m * v - (m if first else 0)  # activations forward, gradients back
    call("pp", "send", act, sends)
    call("pp", "recv", act, sends)  # as many received (0 s: the sender's call carries the time)
    kv = 2 * z.tokens * z.kv_t * z.d * e                    # this rank's K and V chunk (key/value heads' size)
    if config.cp_comm == "ring":  # K, V around the ring forward (and recomputed), K, V and dK, dV back
        call("cp", "send", kv, (passes(config) + 2) * (config.cp - 1) * lay.blocks * m)
    else:  # all-gather K, V forward (and recomputed), reduce-scatter dK, dV back (Llama 3)
        call("cp", "all_gather", kv * config.cp, (passes(config) + 1) * lay.blocks * m)
        call("cp", "reduce_scatter", kv * config.cp, lay.blocks * m)
    call("ep", "all_to_all", act * config.top_k, 4 * lay.moe_blocks * m)  # dispatch, combine; their backward
    if (first or last) and config.pp > 1 and config.model.tied:
        call("embedding", "all_reduce", z.V * z.h / t * grad_bytes, 1)
    for group, params in (("dp", lay.dense_params), ("edp", lay.expert_params)):
        if params:
            calls += data_parallel_calls(config, group, params, lay.blocks * lay.block_params if group == "dp"
                                         else params, lay.blocks, grad_bytes, weight_bytes)
    return calls


def data_parallel_calls(config, group: str, params: float, blocks_params: float, blocks: int, grad_bytes: int,
                        weight_bytes: int) -> list[Call]:
    """The gradient reduction and weight gathers of ZeRO stage ``config.zero`` over ``group`` for ``params``
    parameters, of which ``blocks_params`` in ``blocks`` blocks (ZeRO-3 gathers by unit: a unit per block and one
    for the rest, memory.training.ShardedStep)."""
    n = group_shape(config, group)[0]
    if n <= 1:
        return []
    out = []

    def call(kind, nbytes, count, where=group):
        if count and group_shape(config, where)[0] > 1:
            out.append(Call(where, kind, float(nbytes), float(count)))

    if config.zero <= 1:
        call("all_reduce", params * grad_bytes, 1)
        if config.zero == 1:  # each rank steps its slice, then the updated slices are all-gathered (memory.zero)
            call("all_gather", params * weight_bytes, 1)
        return out
    if config.zero == 2:  # gradients reduce-scattered, updated shards all-gathered
        call("reduce_scatter", params * grad_bytes, 1)
        call("all_gather", params * weight_bytes, 1)
        return out
    root = params - blocks_params                         # 0 for the experts: all of them are in blocks
    units, unit_blocks = blocks + (1 if root else 0), max(1, blocks)
    block_unit = blocks_params / unit_blocks
    parts = zeropp_parts(config) if group == "dp" else ()

    def int8(numel):  # ZeRO++: (values, scales) bytes of a unit padded to n slices, a scale per block
        slice_ = -(-numel // n)
        return slice_ * n, 4 * n * -(-slice_ // ZEROPP_BLOCK)

    block_int8, root_int8 = int8(block_unit), int8(root)
    if "qgz" in parts:  # the gradient as an all-to-all of int8 chunks, then one of their scales
        for i in (0, 1):
            call("all_to_all", block_int8[i], unit_blocks)
            call("all_to_all", root_int8[i], 1 if root else 0)
    else:
        call("reduce_scatter", params * grad_bytes / units, units)
    if "qwz" in parts:  # the forward all-gathers as int8 values, then scales
        for i in (0, 1):
            call("all_gather", block_int8[i], unit_blocks)
            call("all_gather", root_int8[i], 1 if root else 0)
    else:
        call("all_gather", block_unit * weight_bytes, unit_blocks)   # forward
        call("all_gather", root * weight_bytes, 1 if root else 0)    # kept from the forward pass to the end
    # backward: hpZ gathers each block from its secondary slices inside the node-sized group
    call("all_gather", block_unit * weight_bytes, unit_blocks, "dp_shard" if "hpz" in parts else group)
    return out


# ---- prices --------------------------------------------------------------------------------------------------

def levels(hardware, config):
    """``(intra, inter)``: the hardware's links, intra-node replaced by its PCIe link with ``--intra_link pcie``."""
    intra = hardware.notes.get("pcie", hardware.intra) if config.intra_link == "pcie" else hardware.intra
    return intra, hardware.inter


def group_placement(hardware, config, group: str) -> tuple[int, int]:
    """``(members per node, nodes)`` of ``group`` (:meth:`course.hardware.Hardware.placement`; a group's stride is
    its span over its size: tp 1, cp tp, dp cp tp, pp dp cp tp, the embedding pair (pp - 1) dp cp tp)."""
    size, span = group_shape(config, group)
    if size <= 1:
        return 1, 1
    stride = span // size if group != "embedding" else max(1, (config.pp - 1) * config.dp * config.cp * config.tp)
    return hardware.placement(size, stride, config.devices_per_node)


def achieved(link):
    """``link`` at its achievable bus bandwidth (:attr:`course.hardware.Link.achieved_beta`)."""
    from dataclasses import replace

    return replace(link, beta=link.achieved_beta, efficiency=1.0)


def call_seconds(hardware, config, group: str, kind: str, nbytes: float) -> float:
    """Seconds of one ``kind`` call of ``nbytes`` in ``group``: on the CPU the all-reduce line fitted at the group's
    size (:mod:`project.planner.measure`), on GPUs the hierarchical alpha-beta cost of the group's placement at the
    links' achievable bus bandwidth (inside a node NVLink or PCIe only; across nodes intra, then inter, then
    intra)."""
    from communication.alpha_beta import collective_seconds, hierarchical_seconds, per_step_alpha_beta

    p = group_shape(config, group)[0]
    fitted = hardware.notes.get("all_reduce_fits")  # the CPU: lines fitted per group size
    if fitted:
        alpha_fit, beta_fit = fitted.get(str(max(p, 2)), fitted[max(fitted, key=int)])
        return collective_seconds(kind, nbytes, p, *per_step_alpha_beta(alpha_fit, beta_fit, max(p, 2)), 0.0)
    intra, inter = (achieved(link) if link is not None else None for link in levels(hardware, config))
    members, nodes = group_placement(hardware, config, group)
    if kind in ("send", "recv") or inter is None:  # a neighbour in the pp group: inside the node or across
        link = intra if nodes == 1 or inter is None else inter
        return collective_seconds(kind, nbytes, p, link.alpha, link.beta, link.base)
    return hierarchical_seconds(kind, nbytes, p, members if p % members == 0 else 1, intra, inter)
