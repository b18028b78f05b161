"""Plan a run before launching it: per-rank memory, step time and MFU of a GPT-2 on a device mesh.

    python project/plan.py --preset gpt2-xl --hardware h100 --dp 8 --pp 4 --tp 1 --batch_size 512 \\
        --micro_batches 16 --model_max_length 1024 --vocab_size 50257 --zero 1
    python project/plan.py --preset tiny --hardware cpu --dp 2 --pp 2 --tp 2 --batch_size 16 --micro_batches 4 \\
        --model_max_length 64 --vocab_size 1000 --precision fp32 --measure      # prediction beside measurement

For a model preset (:data:`course.model.PRESETS`), a mesh (``--dp --pp --tp --cp --ep``), micro-batches,
ZeRO stage, activation checkpointing, sequence parallelism, precision and a device (``--hardware``:
the published H100, H200 and A100 figures of :mod:`course.hardware`, or this machine's CPU, measured), it
predicts for every pipeline stage (one rank of it):

* **memory**: parameters, gradients and optimizer state (:func:`memory.accounting.model_state_bytes`:
  4 + 4 + 8 bytes per parameter in fp32, 2 + 2 + 12 in mixed precision, divided by dp where the ZeRO
  stage shards; Rajbhandari et al. 2020, Table 1) and activations (:func:`memory.accounting.layer_activation_bytes`,
  Korthikanti et al. 2022, for the micro-batches the schedule keeps in flight: ``pipeline.schedule_actions``);
* **step time**: compute (model FLOPs :func:`course.model.model_flops_per_token`, per stage and tp rank,
  plus the recomputation of checkpointing, at the device's FLOP/s), the pipeline bubble
  (``pipeline.SCHEDULES[schedule].bubble``) and the communication of every group (dp gradient reduction,
  tp all-reduces per layer, pp send/recv, the tied-embedding all-reduce, cp ring, ep all-to-all) from the
  alpha-beta model of the link it crosses (:func:`communication.alpha_beta.collective_seconds`), not
  overlapped with compute;
* **MFU**: model FLOPs per step over the step time and the devices' peak (Chowdhery et al. 2022, App. B).

With ``--measure`` (CPU) it also runs the configuration here and prints the measurement beside the
prediction with the error of each term (``project/plan_measure.py``). Bad input — a mesh that does not
multiply to ``--n_devices``, a tp that does not divide the heads, a model that does not fit — ends with
a message that says what to change (exit code 2).
"""
from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

if __name__ == "__main__":  # run as a file: import the packages of the tree this script sits in
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from course.config import ConfigError, RunConfig, option  # noqa: E402
from project.options.run_data_parallel import ZEROPP, node_group_size  # noqa: E402
from project.options.run_data_parallel import zeropp_parts as _zeropp_parts  # noqa: E402

PLAN = "plan"
GROUPS = ("tp", "cp", "pp", "embedding", "dp", "dp_shard", "ep", "edp")
ZEROPP_BLOCK = 64  # elements per int8 quantization block (memory.zeropp.ZeroPPModel's default)


@dataclass
class PlanConfig(RunConfig):
    """``project/plan.py``: the run to plan (the run scripts' options, and what only planning needs)."""

    description = "Predict per-rank memory, step time and MFU of a GPT-2 run before launching it."
    mesh_options = ("dp", "pp", "tp", "cp", "ep", "micro_batches", "virtual_stages")
    world_option = None

    dropout: float = option(0.0, "dropout probability (its masks are kept for the backward pass)",
                            group="model and training")
    hardware: str = option("h100", "h100, h200, a100 (published figures, course.hardware) or cpu (this machine, "
                                   "measured)", group=PLAN, choices=("h100", "h200", "a100", "cpu"))
    n_devices: int | None = option(None, "devices of the run (default: the mesh's dp x pp x cp x tp); the mesh must "
                                         "multiply to it", group=PLAN)
    devices_per_node: int | None = option(None, "devices per node (default: the hardware's, 8)", group=PLAN)
    intra_link: str = option("nvlink", "the link between the GPUs of a node", group=PLAN, choices=("nvlink", "pcie"))
    zero: int = option(0, "ZeRO stage (0: plain data parallelism)", group=PLAN, choices=(0, 1, 2, 3))
    zeropp: str = option("", "ZeRO++ with --zero 3: a comma list of qwz, hpz, qgz (memory/zeropp.py)", group=PLAN,
                         metavar="LIST")
    zeropp_group: int = option(0, "--zeropp hpz: dp ranks per node-sized group (0: the devices of a node, at most "
                                  "--dp)", group=PLAN, metavar="RANKS")
    activation_checkpointing: bool = option(False, "recompute every block in the backward pass", group=PLAN)
    sequence_parallel: bool = option(False, "split layer norms and dropout along the sequence over tp", group=PLAN)
    precision: str = option("bf16", "fp32: 4 + 4 + 8 bytes per parameter, fp32 products; bf16: mixed precision, "
                                    "2 + 2 + 12 bytes, bf16 products and activations", group=PLAN,
                            choices=("fp32", "bf16"))
    activation_model: str | None = option(None, "korthikanti: Megatron-LM's layers (Korthikanti et al. 2022, "
                                                "Table 2); course: this course's GPT-2 blocks (transformers' "
                                                "elementwise GeLU; memory.accounting.layer_activation_bytes); default: "
                                                "course on the CPU, korthikanti on GPUs", group=PLAN,
                                          choices=("korthikanti", "course"))
    schedule: str = option("1f1b", "pipeline schedule (pipeline.SCHEDULES)", group=PLAN,
                           choices=("gpipe", "1f1b", "interleaved", "zb-h1"))
    num_experts: int = option(1, "experts per MoE layer (1: dense GPT-2)", group=PLAN)
    top_k: int = option(2, "experts per token (MoE)", group=PLAN)
    moe_every: int = option(2, "one MoE block in this many (MoE)", group=PLAN)
    flops_efficiency: float = option(1.0, "fraction of the peak FLOP/s the matrix products reach (GPUs; the CPU's "
                                          "is measured)", group=PLAN)
    measure: bool = option(False, "also run the configuration on this machine's CPU and print the measurement "
                                  "beside the prediction, with the error of each term", group=PLAN)
    steps: int = option(4, "--measure: timed steps (after one warm-up step)", group=PLAN)
    cpu_figures: str | None = option(None, "--hardware cpu: read this machine's measured FLOP/s and alpha-beta from "
                                           "this JSON file, or measure them and write it there", group=PLAN)
    json: str | None = option(None, "write the prediction (and measurement) to this JSON file", group=PLAN)

    @property
    def devices(self) -> int:
        return self.n_devices if self.n_devices is not None else self.world_size

    def resolve(self, devices: int | None = None, *, here: bool = True) -> None:
        super().resolve(devices, here=here)
        if self.activation_model is None:
            self.activation_model = "course" if self.hardware == "cpu" else "korthikanti"

    def check(self) -> None:
        super().check()
        from pipeline.schedules import SCHEDULES, micro_batches_per_round

        shape = self.model_shape
        try:
            self.dims.check(self.devices, n_layer=shape["n_layer"], n_head=shape["n_head"], n_inner=shape["n_inner"])
        except ValueError as exc:
            raise ConfigError(f"{exc} (--n_devices {self.devices})") from None
        per_dp = self.batch_size // self.dp
        if self.batch_size % self.dp or per_dp % self.micro_batches:
            raise ConfigError(f"--batch_size {self.batch_size} must split into --dp {self.dp} shares of --micro_batches "
                              f"{self.micro_batches} micro-batches: try --batch_size "
                              f"{self.dp * self.micro_batches * max(1, per_dp // self.micro_batches)}")
        if self.model_max_length % self.cp:
            raise ConfigError(f"--cp {self.cp} does not divide the sequence length --model_max_length "
                              f"{self.model_max_length}")
        chunked = SCHEDULES[self.schedule].chunks
        if self.virtual_stages > 1 and not chunked:
            raise ConfigError(f"--virtual_stages {self.virtual_stages} needs --schedule interleaved")
        if chunked and self.pp > 1:
            try:
                micro_batches_per_round(self.pp, self.micro_batches)
            except ValueError as exc:
                raise ConfigError(f"--micro_batches {self.micro_batches}: {exc}") from None
        if self.pp * self.virtual_stages > shape["n_layer"]:
            raise ConfigError(f"--pp {self.pp} x --virtual_stages {self.virtual_stages} is more than the "
                              f"{shape['n_layer']} blocks of --preset {self.preset}")
        if self.ep > 1 and (self.num_experts < 2 or self.num_experts % self.ep):
            raise ConfigError(f"--ep {self.ep} shares out the experts of MoE layers: give --num_experts, a multiple of "
                              f"{self.ep} (now {self.num_experts})")
        if self.num_experts > 1 and not 1 <= self.top_k <= self.num_experts:
            raise ConfigError(f"--top_k must be in 1..--num_experts {self.num_experts}, not {self.top_k}")
        if not 0 < self.flops_efficiency <= 1:
            raise ConfigError(f"--flops_efficiency is a fraction of the peak in (0, 1], not {self.flops_efficiency}")
        parts = tuple(n.strip().lower() for n in (self.zeropp or "").split(",") if n.strip())
        if [n for n in parts if n not in ZEROPP] or (parts and self.zero != 3):
            raise ConfigError(f"--zeropp {self.zeropp}: a comma list of {', '.join(ZEROPP)}, with --zero 3")
        if self.zeropp_group < 0 or (self.zeropp_group and self.dp % self.zeropp_group):
            raise ConfigError(f"--zeropp_group {self.zeropp_group} must divide --dp {self.dp}")
        if self.measure:
            if self.hardware != "cpu":
                raise ConfigError("--measure runs the configuration on this machine's CPU: add --hardware cpu")
            from project.plan_measure import measurable

            why = measurable(self)
            if why:
                raise ConfigError(f"--measure: {why}")
        if self.steps < 1:
            raise ConfigError(f"--steps must be >= 1, not {self.steps}")


# ---- the model on the mesh --------------------------------------------------------------------------

def shape(config) -> dict:
    """``L, h, a, inner, V`` (vocabulary padded to a multiple of tp), ``P`` (positions), ``s`` (tokens per
    cp rank), ``b`` (rows per micro-batch), ``e`` (bytes per activation), ``m`` (bytes per dropout mask)."""
    fields = config.model_shape
    t = config.tp
    e = 4 if config.precision == "fp32" else 2
    mask = e if config.hardware == "cpu" else 1  # dropout masks: booleans on GPUs; the CPU keeps the scaled noise
    return {"L": fields["n_layer"], "h": fields["n_embd"], "a": fields["n_head"], "inner": fields["n_inner"],
            "V": -(-config.vocab_size // t) * t, "P": config.model_max_length,
            "s": config.model_max_length // config.cp, "b": config.batch_size // (config.dp * config.micro_batches),
            "e": e, "m": mask}


def stage_layout(config, stage: int) -> dict:
    """Blocks (dense and MoE) of pipeline stage ``stage`` and the parameters one of its tp ranks holds."""
    from moe.gpt2 import moe_block_indices
    from three_d.stage import stage_blocks

    d, t = shape(config), config.tp
    h, inner = d["h"], d["inner"]
    blocks = list(stage_blocks(d["L"], stage, config.pp))
    moe = set(moe_block_indices(d["L"], config.moe_every)) if config.num_experts > 1 else set()
    n_moe = sum(1 for i in blocks if i in moe)
    attention = (4 * h * h + 3 * h) / t + h + 4 * h       # QKV and projection (weights and QKV bias split), bias, 2 LNs
    mlp = (2 * h * inner + inner) / t + h
    dense = len(blocks) * attention + (len(blocks) - n_moe) * mlp + n_moe * h * config.num_experts  # routers
    experts = n_moe * config.num_experts // config.ep * (2 * h * inner + inner + h)
    if stage == 0:
        dense += d["V"] * h / t + d["P"] * h
    if stage == config.pp - 1:
        dense += 2 * h + (d["V"] * h / t if config.pp > 1 else 0)
    return {"blocks": len(blocks), "moe_blocks": n_moe, "dense_params": dense, "expert_params": experts,
            "block_params": attention + mlp}


def in_flight(config, stage: int) -> int:
    """Most (chunk, micro-batch) pairs this stage holds activations of at once under the schedule
    (forwarded, not yet backwarded: ``pipeline.schedule_actions``)."""
    import pipeline

    if config.pp == 1:
        return 1
    return pipeline.peak_in_flight(pipeline.schedule_actions(config.schedule, stage, config.pp, config.micro_batches,
                                                             config.virtual_stages))


def stage_memory(config, stage: int) -> dict:
    """Bytes one rank of ``stage`` holds: ``params``, ``grads``, ``optimizer`` (Adam's step counters, 4 bytes per
    parameter tensor, left out), ``activations`` (what the forward passes in flight save for the backward
    pass, at their peak) and ``recompute`` (with checkpointing: one block's full activations while the
    backward pass recomputes it; 0 without)."""
    from memory.accounting import head_activation_bytes, layer_activation_bytes, model_state_bytes

    d, lay = shape(config), stage_layout(config, stage)
    dense = model_state_bytes(config.zero, lay["dense_params"], config.dp * config.cp, config.precision)
    experts = model_state_bytes(config.zero, lay["expert_params"], config.dp * config.cp // config.ep,
                                config.precision)
    layer = dict(s=d["s"], b=d["b"], h=d["h"], a=d["a"], t=config.tp, sequence_parallel=config.sequence_parallel,
                 element_bytes=d["e"], dropout=config.dropout > 0, mask_bytes=d["m"], attention_scores=config.cp == 1,
                 implementation=config.activation_model)
    per_layer = layer_activation_bytes(**layer, checkpointing=config.activation_checkpointing)
    unit = lay["blocks"] / config.virtual_stages * per_layer  # one (chunk, micro-batch) pair
    extra = 0.0
    if stage == 0 and config.dropout > 0:  # the embedding dropout's mask
        extra += d["m"] * d["s"] * d["b"] * d["h"] / (config.tp if config.sequence_parallel else 1)
    if stage == config.pp - 1:
        extra += head_activation_bytes(d["s"], d["b"], d["h"], d["V"], config.tp, element_bytes=d["e"],
                                       logits_bytes=4)
    activations = in_flight(config, stage) * unit + extra
    # one block recomputed at a time in the backward pass: its full activations on top, for a moment
    recompute = layer_activation_bytes(**layer) if config.activation_checkpointing else 0.0
    # (ZeRO++'s hpZ also holds 1/g of every block from its forward to its gradient reduction, g = hpz_group_size:
    # transient, like the activations, and left out of the state held)
    return {k: dense[k] + experts[k] for k in dense} | {"activations": activations, "recompute": recompute}


# ---- communication and time -------------------------------------------------------------------------

def zeropp_parts(config) -> tuple[str, ...]:
    """``--zeropp`` as names (``()`` without it, or without ``--zero 3``)."""
    return _zeropp_parts(config.zero, config.zeropp)


def hpz_group_size(config) -> int:
    """dp ranks per hpZ group: ``--zeropp_group``, else the dp ranks on one node (at most dp)."""
    per_node = (config.devices_per_node or 8) // (config.cp * config.tp)
    return node_group_size(config.dp, config.zeropp_group, per_node)


def group_shape(config, name: str) -> tuple[int, int]:
    """``(size, span)`` of a group: its ranks and how many consecutive global ranks they spread over (the
    mesh orders its dimensions pp, dp, cp, tp, tp fastest: docs/architecture.md, "The device mesh"; ``dp_shard``:
    hpZ's node-sized group of dp ranks, :func:`hpz_group_size`)."""
    dp, pp, tp, cp, ep = config.dp, config.pp, config.tp, config.cp, config.ep
    if name == "dp_shard":
        g = hpz_group_size(config) if "hpz" in zeropp_parts(config) else 1
        return g, g * cp * tp
    return {"tp": (tp, tp), "cp": (cp, cp * tp), "dp": (dp * cp, dp * cp * tp), "pp": (pp, config.world_size),
            "embedding": (2 if pp > 1 else 1, config.world_size), "ep": (ep, ep * tp),
            "edp": (dp * cp // ep, dp * cp * tp)}[name]


def stage_communication(config, stage: int) -> list[dict]:
    """The calls one rank of ``stage`` makes per step: ``{"group", "kind", "bytes", "count"}`` (bytes of the
    full tensor, as :class:`course.collectives.CommCounter` records them)."""
    d, lay = shape(config), stage_layout(config, stage)
    m, v, t, e = config.micro_batches, config.virtual_stages, config.tp, d["e"]
    first, last = stage == 0, stage == config.pp - 1
    act = d["b"] * d["s"] * d["h"] * e                      # one micro-batch's hidden state
    grad_bytes = 4 if config.precision == "fp32" else 2     # gradients reduced in their own precision
    calls = []

    def call(group, kind, nbytes, count):
        if count and group_shape(config, group)[0] > 1:
            calls.append({"group": group, "kind": kind, "bytes": float(nbytes), "count": float(count)})

    passes = 3 if config.activation_checkpointing else 2    # forward, backward (and the recomputed forward)
    if config.sequence_parallel:
        call("tp", "all_gather", act, passes * 2 * lay["blocks"] * m)
        call("tp", "reduce_scatter", act, passes * 2 * lay["blocks"] * m)
    else:
        call("tp", "all_reduce", act, passes * 2 * lay["blocks"] * m)
    if first:
        call("tp", "all_reduce", act, m)                    # vocabulary-parallel embedding
    if last:
        call("tp", "all_reduce", act, m)                    # the head's input gradient (backward of f)
        targets = d["s"] - 1 if config.cp == 1 else d["s"]  # next-token targets: the last position has none
        call("tp", "all_reduce", d["b"] * targets * 4, 3 * m)  # cross-entropy: max, sum of exp, target logit
    if config.pp > 1 or config.tp > 1:  # the 3D step (three_d.step): fp64 scalars
        call("tp", "all_reduce", 8, 1)                      # the gradient norm's square, over tp ...
        call("pp", "all_reduce", 8, 1)                      # ... and over pp
        call("dp", "all_reduce", 8, 2 if last else 1)       # the target count (and on the last stage the loss)
    sends = m * v - (m if last else 0) + m * v - (m if first else 0)  # activations forward, gradients back
    call("pp", "send", act, sends)
    call("pp", "recv", act, sends)  # as many received (0 s: the sender's call carries the time)
    call("cp", "send", 2 * act / t, 3 * (config.cp - 1) * lay["blocks"] * m)  # K, V around the ring; dK, dV back
    call("ep", "all_to_all", act * config.top_k, 4 * lay["moe_blocks"] * m)    # dispatch, combine; their backward
    if first or last:
        call("embedding", "all_reduce", d["V"] * d["h"] / t * grad_bytes, 1)
    block_params = lay["block_params"]
    for group, params in (("dp", lay["dense_params"]), ("edp", lay["expert_params"])):
        if not params:
            continue
        weight_bytes = 4 if config.precision == "fp32" else 2
        if config.zero <= 1:
            call(group, "all_reduce", params * grad_bytes, 1)
            if config.zero == 1:  # each rank steps its slice, then the updated slices are all-gathered (memory.zero)
                call(group, "all_gather", params * weight_bytes, 1)
        elif config.zero == 2:  # gradients reduce-scattered, updated shards all-gathered
            call(group, "reduce_scatter", params * grad_bytes, 1)
            call(group, "all_gather", params * weight_bytes, 1)
        else:  # ZeRO-3 by unit (memory.training.ShardedStep): a unit per block and one for the rest
            blocks = lay["blocks"] * block_params if group == "dp" else params
            root = params - blocks
            units = lay["blocks"] + (1 if root else 0)
            parts = zeropp_parts(config) if group == "dp" else ()
            n = group_shape(config, group)[0]

            def int8(numel):  # ZeRO++: (values, scales) bytes of a unit padded to n slices, a scale per block
                slice_ = -(-numel // n)
                return slice_ * n, 4 * n * -(-slice_ // ZEROPP_BLOCK)

            block_int8, root_int8 = int8(blocks / lay["blocks"]), int8(root)
            if "qgz" in parts:  # the gradient as an all-to-all of int8 chunks, then one of their scales
                for i in (0, 1):
                    call(group, "all_to_all", block_int8[i], lay["blocks"])
                    call(group, "all_to_all", root_int8[i], 1 if root else 0)
            else:
                call(group, "reduce_scatter", params * grad_bytes / units, units)
            if "qwz" in parts:  # the forward all-gathers as int8 values, then scales
                for i in (0, 1):
                    call(group, "all_gather", block_int8[i], lay["blocks"])
                    call(group, "all_gather", root_int8[i], 1 if root else 0)
            else:
                call(group, "all_gather", blocks * weight_bytes / lay["blocks"], lay["blocks"])  # forward
                call(group, "all_gather", root * weight_bytes, 1)  # kept from the forward pass to the end of backward
            # backward: hpZ gathers each block from its secondary slices inside the node-sized group
            call("dp_shard" if "hpz" in parts else group, "all_gather", blocks * weight_bytes / lay["blocks"],
                 lay["blocks"])
    return calls


def link_for(hardware, config, group: str):
    """``(alpha, beta, base)`` of the link ``group`` crosses on ``hardware`` (per step of a ring)."""
    from communication.alpha_beta import per_step_alpha_beta

    size, span = group_shape(config, group)
    fitted = hardware.notes.get("all_reduce_fits")  # the CPU: lines fitted per group size
    if fitted:
        alpha_fit, beta_fit = fitted.get(str(max(size, 2)), fitted[max(fitted, key=int)])
        return (*per_step_alpha_beta(alpha_fit, beta_fit, max(size, 2)), 0.0)
    intra = hardware.notes.get(config.intra_link, hardware.intra) if config.intra_link != "nvlink" else hardware.intra
    per_node = config.devices_per_node or hardware.devices_per_node
    link = intra if span <= per_node or hardware.inter is None else hardware.inter
    return link.alpha, link.beta, link.base


def stage_flops(config, stage: int, *, model_only: bool = False) -> float:
    """FLOPs one rank of ``stage`` computes per step (forward and backward of its micro-batches; with
    checkpointing one more forward of its blocks unless ``model_only``)."""
    d, lay = shape(config), stage_layout(config, stage)
    h, inner, t = d["h"], d["inner"], config.tp
    dense_mlp = lay["blocks"] - lay["moe_blocks"]
    matmul = (lay["blocks"] * 4 * h * h + dense_mlp * 2 * h * inner) / t + lay["moe_blocks"] * config.top_k * 2 * h * inner
    attention = lay["blocks"] * 2 * h * config.model_max_length / t   # 2 s h per token and layer, forward
    forward = 2 * matmul + 2 * attention
    if stage == config.pp - 1:
        forward += 2 * d["V"] * h / t
    per_token = 3 * forward + (0 if model_only or not config.activation_checkpointing else 2 * matmul + 2 * attention)
    return per_token * d["b"] * d["s"] * config.micro_batches


def predict(config, hardware) -> dict:
    """The prediction for ``config`` (a :class:`PlanConfig`) on ``hardware`` (:class:`course.hardware.Hardware`).

    Returns:
        ``{"stages": [per stage: {"memory": {params, grads, optimizer, activations, total} (bytes),
        "compute_s", "comm": [calls with "seconds" and "traffic_bytes"], "comm_s": {group: seconds}}],
        "memory_bytes" (the largest stage total), "fits", "compute_s" (slowest stage), "bubble" (fraction),
        "bubble_s", "comm_s", "step_s", "model_flops", "mfu", "tokens"}``; times in seconds.
    """
    from communication.alpha_beta import collective_seconds
    from course.collectives import ring_traffic_bytes
    from course.model import model_flops_per_token
    from pipeline.schedules import SCHEDULES

    # the FLOP/s the model's layers reach: the peak times --flops_efficiency, or on the CPU the rate measured
    # on a whole block (products, layer norms, softmax, GeLU and Python together)
    rate = hardware.notes.get("achieved_flops", hardware.peak_flops[config.precision] * config.flops_efficiency)
    stages = []
    for stage in range(config.pp):
        memory = stage_memory(config, stage)
        memory["total"] = sum(memory.values())
        calls = stage_communication(config, stage)
        comm_s: dict[str, float] = {}
        for c in calls:
            alpha, beta, base = link_for(hardware, config, c["group"])
            p = group_shape(config, c["group"])[0]
            c["seconds"] = c["count"] * collective_seconds(c["kind"], c["bytes"], p, alpha, beta, base)
            c["traffic_bytes"] = c["count"] * ring_traffic_bytes(c["kind"], c["bytes"], p)
            comm_s[c["group"]] = comm_s.get(c["group"], 0.0) + c["seconds"]
        stages.append({"stage": stage, "memory": memory, "compute_s": stage_flops(config, stage) / rate, "comm": calls,
                       "comm_s": comm_s})
    bubble = SCHEDULES[config.schedule].bubble(config.pp, config.micro_batches, config.virtual_stages) \
        if config.pp > 1 else 0.0
    compute = max(s["compute_s"] for s in stages)
    bubble_s = compute * bubble / (1 - bubble)
    comm = max(sum(s["comm_s"].values()) for s in stages)
    step = compute + bubble_s + comm
    tokens = config.batch_size * config.model_max_length
    model_flops = model_flops_per_token(config.preset, config.vocab_size, config.model_max_length) * tokens
    memory_bytes = max(s["memory"]["total"] for s in stages)
    return {"stages": stages, "memory_bytes": memory_bytes, "device_memory_bytes": hardware.memory_bytes,
            "fits": memory_bytes <= hardware.memory_bytes, "compute_s": compute, "bubble": bubble,
            "bubble_s": bubble_s, "comm_s": comm, "step_s": step, "tokens": tokens, "model_flops": model_flops,
            "mfu": model_flops / (step * config.devices * hardware.peak_flops[config.precision]),
            "hardware": hardware.name, "peak_flops": hardware.peak_flops[config.precision]}


def fit_message(config, prediction: dict) -> str:
    """What to change when the prediction does not fit the device's memory (empty when it fits)."""
    if prediction["fits"]:
        return ""
    worst = max(prediction["stages"], key=lambda s: s["memory"]["total"])
    mem = worst["memory"]
    parts = ", ".join(f"{k} {mem[k] / 1e9:.1f}" for k in ("params", "grads", "optimizer", "activations", "recompute"))
    hints = []
    if config.zero < 3 and config.dp * config.cp > 1:
        hints.append(f"--zero {config.zero + 1}")
    if not config.activation_checkpointing:
        hints.append("--activation_checkpointing")
    hints += ["a larger --tp or --pp", "more --micro_batches (smaller micro-batches)"]
    return (f"--preset {config.preset} does not fit: stage {worst['stage']} needs {mem['total'] / 1e9:.1f} GB per "
            f"device ({parts} GB) and a {config.hardware} has {prediction['device_memory_bytes'] / 1e9:.0f} GB; try "
            + ", ".join(hints))


def load_hardware(config):
    """The :class:`course.hardware.Hardware` of ``config.hardware`` (the CPU: measured, or read from
    ``config.cpu_figures``)."""
    from course.hardware import HARDWARE

    if config.hardware != "cpu":
        return HARDWARE[config.hardware]
    from project.plan_measure import cpu_hardware

    d = shape(config)
    block = {"b": d["b"], "s": d["s"], "h": d["h"], "a": d["a"], "inner": d["inner"], "preset": config.preset,
             "dropout": config.dropout}
    return cpu_hardware(config, block, [max(2, group_shape(config, g)[0]) for g in ("tp", "dp", "pp", "embedding")])


def main(argv=None) -> int:
    config = PlanConfig.from_command_line(argv, environment=False)
    hardware = load_hardware(config)
    prediction = predict(config, hardware)
    from project.plan_report import format_prediction

    print(format_prediction(config, prediction))
    report = {"config": config.record(), "prediction": prediction}
    status = 0
    if not prediction["fits"]:
        print(f"error: {fit_message(config, prediction)}", file=sys.stderr)
        status = 2
    elif config.measure:
        from project.plan_measure import compare, measure_run
        from project.plan_report import format_comparison

        measurement = measure_run(config)
        report["measurement"] = measurement
        report["errors"] = compare(config, prediction, measurement)
        print(format_comparison(report["errors"]))
    if config.json:
        from course.results import write_json

        write_json(Path(config.json), report)
    return status


if __name__ == "__main__":
    sys.exit(main())
