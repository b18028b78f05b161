"""Plan a run before launching it: per-rank memory, step time and MFU of a GPT-2 on a device mesh.

    python project/plan.py --preset gpt2-xl --hardware h100 --dp 8 --pp 4 --tp 1 --batch_size 512 \\
        --micro_batches 16 --model_max_length 1024 --vocab_size 50257 --zero 1
    python project/plan.py --model llama-7b --gpus 1024 --hardware h100 --top 10   # the ranked plans
    python project/plan.py --preset tiny --hardware cpu --dp 2 --pp 2 --tp 2 --batch_size 16 --micro_batches 4 \\
        --model_max_length 64 --vocab_size 1000 --precision fp32 --measure      # prediction beside measurement

For a model preset (:data:`course.model.PRESETS`, or any shape with ``--n_layer --n_embd --n_head
--n_inner``), a mesh (``--dp --pp --tp --cp --ep``), micro-batches, ZeRO stage, activation checkpointing,
sequence parallelism, precision and a device (``--hardware``: the published H100, H200, A100 and L4 figures
of :mod:`course.hardware`, or this machine's CPU, measured), it predicts for every pipeline stage (one rank
of it):

* **memory**: parameters, gradients and optimizer state (:func:`memory.accounting.model_state_bytes`:
  4 + 4 + 8 bytes per parameter in fp32, 2 + 2 + 12 in mixed precision, divided by dp where the ZeRO
  stage shards; Rajbhandari et al. 2020, Table 1) and activations (:func:`memory.accounting.layer_activation_bytes`,
  Korthikanti et al. 2022, for the micro-batches the schedule keeps in flight: ``pipeline.schedule_actions``);
* **step time, replayed** (:func:`predict`): each stage's forward and backward of a micro-batch cost its
  FLOPs from the GEMM shapes (:func:`stage_flops`) at the peak times a matrix-product efficiency (the
  course's GPU report's measurement in ``results/gpu/`` when one exists for the GPU, else the published
  MAMF figure: :func:`compute_efficiency`), plus the tp, cp and ep calls inside them (exposed: on the
  critical path); the schedule's action lists (``pipeline.SCHEDULES``) are replayed with those costs and a pp
  send per hand-over (:func:`pipeline.metrics.replay`); with ``--overlap on`` (the GPUs' default) the dp
  gradient reduction runs in 25 MiB buckets behind the last micro-batch's backward (exposed:
  ``max(0, C - C_last - B_last) + C_last``) and ZeRO-3's per-block all-gathers are prefetched behind the
  previous block (exposed: ``g + (L - 1) max(0, g - c)``). Every call is priced with the alpha-beta model
  of the links it crosses, in levels where its group spans nodes (:func:`call_seconds`,
  :func:`communication.alpha_beta.hierarchical_seconds`). The step splits into ``compute + bubble +
  exposed communication`` (per group), with the communication hidden behind computation beside it;
* **MFU**: model FLOPs per step over the step time and the devices' peak (Chowdhery et al. 2022, App. B).

**The ranked plans.** Given ``--n_devices`` (old name ``--gpus``) without ``--dp --pp --tp``, it predicts
every mesh of that many devices the model allows (heads and MLP width divisible by tp, a block per stage,
the batch divisible by dp and micro-batches) at its best micro-batching, and prints the ``--top`` fastest
that fit, with memory, step time, MFU, bubble, exposed communication and what limits each; ``--verify``
builds the first and last rank of each in a fake world (``project/fake_mesh.py``) and prints their bytes
beside the planner's. The ranked plans default to 1024 sequences of 4096 tokens per step.

With ``--measure`` (CPU) it also runs the configuration here and prints the measurement beside the
prediction with the error of each term (``project/plan_measure.py``). Bad input — a mesh that does not
multiply to ``--n_devices``, a tp that does not divide the heads, a model that does not fit — ends with
a message that says what to change (exit code 2). ``project/published_runs.py`` sets the planner beside
published runs (Megatron-LM, torchtitan, the Ultra-Scale Playbook).
"""
from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

if __name__ == "__main__":  # run as a file: import the packages of the tree this script sits in
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from course.config import ConfigError, RunConfig, option  # noqa: E402
from course.model import PRESETS  # noqa: E402
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
    preset: str = option("auto", "GPT-2 size (course.model.PRESETS; llama-7b: GPT-2 blocks at Llama-7B's size); auto: "
                                 "tiny on CPU, gpt2 on GPU", group="model and training",
                         choices=("auto", *PRESETS), old=("model",))
    batch_size: int | None = option(None, "global batch size (sequences per optimizer step); default 64, and for the "
                                          "ranked plans 1024 (with 4096 tokens each: a 4M-token step, as Llama's; "
                                          "Touvron et al. 2023, Sec. 2.2)", group="model and training")
    model_max_length: int | None = option(None, "sequence length (tokens); default 128, and 4096 for the ranked plans",
                                          group="data")
    vocab_size: int | None = option(None, "vocabulary (tokens); default: 32000 for --preset llama-7b (Llama's), "
                                          "else 5000 (the course tokenizer's)", group="data")
    hardware: str = option("h100", "h100, h200, a100, l4 (published figures, course.hardware) or cpu (this machine, "
                                   "measured)", group=PLAN, choices=("h100", "h200", "a100", "l4", "cpu"))
    n_devices: int | None = option(None, "devices of the run (default: the mesh's dp x pp x cp x tp); the mesh must "
                                         "multiply to it. Given without --dp --pp --tp: rank every dp x pp x tp of "
                                         "it (the ranked plans)", group=PLAN, old=("gpus",))
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
    flops_efficiency: float | None = option(None, "fraction of the peak FLOP/s the matrix products reach (default: "
                                                 "this GPU's measured by the course's GPU report in results/gpu/, "
                                                 "else the hardware's published MAMF figure, course.hardware; the "
                                                 "CPU's rate is measured)", group=PLAN)
    overlap: str = option("auto", "replay the step as DDP/FSDP/Megatron-LM run it: gradient reduction in "
                                        "buckets behind the last micro-batch's backward, ZeRO-3 all-gathers "
                                        "prefetched behind the previous block (default: on for GPUs; off on the "
                                        "CPU, where the course's own steps reduce after the backward pass)",
                          group=PLAN, choices=("auto", "on", "off"))
    n_layer: int | None = option(None, "plan a model of another shape: blocks (overrides the preset's; GPT-2 blocks)",
                                 group=PLAN)
    n_embd: int | None = option(None, "plan a model of another shape: width (overrides the preset's)", group=PLAN)
    n_head: int | None = option(None, "plan a model of another shape: attention heads (overrides the preset's)",
                                group=PLAN)
    n_inner: int | None = option(None, "plan a model of another shape: the MLP's inner width (default 4 x width)",
                                 group=PLAN)
    top: int = option(10, "the ranked plans: how many to print", group=PLAN)
    verify: bool = option(False, "the ranked plans: build one rank of each top plan in a fake world "
                                 "(project/fake_mesh.py) and print its memory beside the prediction", group=PLAN)
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
        if self.batch_size is None:
            self.batch_size = 1024 if self.ranking else 64
        if self.model_max_length is None:
            self.model_max_length = 4096 if self.ranking else 128
        if self.vocab_size is None:
            self.vocab_size = 32000 if self.preset == "llama-7b" else 5000
        if self.overlap in (True, False):  # for_test(overlap=True) reads as "on"
            self.overlap = "on" if self.overlap else "off"
        if self.overlap == "auto":
            self.overlap = "off" if self.hardware == "cpu" else "on"

    @property
    def model_overrides(self) -> dict:
        """``--n_layer --n_embd --n_head --n_inner`` as given (the preset's shape with these replaced is
        :attr:`model_shape`; :func:`course.model.model_flops_per_token` takes them as keywords)."""
        out = {k: getattr(self, k) for k in ("n_layer", "n_embd", "n_head", "n_inner") if getattr(self, k)}
        if "n_embd" in out and "n_inner" not in out:
            out["n_inner"] = 4 * out["n_embd"]
        return out

    @property
    def model_shape(self) -> dict:
        """``n_layer``, ``n_embd``, ``n_head``, ``n_inner``: the preset's, with :attr:`model_overrides`."""
        return dict(super().model_shape, **self.model_overrides)

    @property
    def ranking(self) -> bool:
        """The ranked plans: ``--n_devices`` given without a mesh (``--dp --pp --tp`` left at 1)."""
        return (self.n_devices is not None and self.dp == self.pp == self.tp == 1
                and self.n_devices != self.cp * self.ep and not self.measure)

    def check(self) -> None:
        super().check()
        from pipeline.schedules import SCHEDULES, micro_batches_per_round

        shape = self.model_shape
        if self.top < 1:
            raise ConfigError(f"--top must be >= 1 plans, not {self.top}")
        if self.flops_efficiency is not None and not 0 < self.flops_efficiency <= 1:
            raise ConfigError(f"--flops_efficiency is a fraction of the peak in (0, 1], not {self.flops_efficiency}")
        if self.steps < 1:
            raise ConfigError(f"--steps must be >= 1, not {self.steps}")
        if any(v is not None and v < 1 for v in (self.n_layer, self.n_embd, self.n_head, self.n_inner)):
            raise ConfigError("--n_layer, --n_embd, --n_head and --n_inner must be >= 1")
        if shape["n_embd"] % shape["n_head"]:
            raise ConfigError(f"the width {shape['n_embd']} does not split into {shape['n_head']} heads: change "
                              f"--n_embd or --n_head")
        if self.model_overrides and (self.measure or self.verify):
            raise ConfigError("--measure and --verify build the preset's model: drop --n_layer --n_embd --n_head "
                              "--n_inner")
        if self.ranking:
            if self.n_devices % (self.cp * self.ep):
                raise ConfigError(f"--n_devices {self.n_devices} is not a multiple of --cp {self.cp} x --ep {self.ep}")
            return
        if self.verify:
            raise ConfigError("--verify checks the ranked plans: give --n_devices without --dp --pp --tp")
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
    """``(alpha, beta, base)`` of the link ``group`` crosses on ``hardware`` (per step of a ring): the CPU's line
    fitted at the group's size, else the level a flat ring of the group would use (the intra-node link when the
    group fits in a node, else the network). :func:`call_seconds` prices a call, in levels where the group
    spans nodes."""
    from communication.alpha_beta import per_step_alpha_beta

    size, span = group_shape(config, group)
    fitted = hardware.notes.get("all_reduce_fits")  # the CPU: lines fitted per group size
    if fitted:
        alpha_fit, beta_fit = fitted.get(str(max(size, 2)), fitted[max(fitted, key=int)])
        return (*per_step_alpha_beta(alpha_fit, beta_fit, max(size, 2)), 0.0)
    intra, inter = levels(hardware, config)
    per_node = config.devices_per_node or hardware.devices_per_node
    link = intra if span <= per_node or inter is None else inter
    return link.alpha, link.beta, link.base


def levels(hardware, config):
    """``(intra, inter)``: the hardware's links, intra-node replaced by its PCIe link with ``--intra_link pcie``."""
    intra = hardware.notes.get("pcie", hardware.intra) if config.intra_link == "pcie" else hardware.intra
    return intra, hardware.inter


def group_placement(hardware, config, group: str) -> tuple[int, int]:
    """``(members per node, nodes)`` of ``group`` (:meth:`course.hardware.Hardware.placement`; a group's stride
    is its span over its size: tp 1, cp tp, dp cp tp, pp dp cp tp, the embedding pair (pp - 1) dp cp tp)."""
    size, span = group_shape(config, group)
    if size <= 1:
        return 1, 1
    stride = span // size if group != "embedding" else max(1, (config.pp - 1) * config.dp * config.cp * config.tp)
    return hardware.placement(size, stride, config.devices_per_node)


def call_seconds(hardware, config, group: str, kind: str, nbytes: float) -> float:
    """Seconds of one ``kind`` call of ``nbytes`` in ``group``: on the CPU the fitted line of the group's size
    (:func:`link_for`), on GPUs the hierarchical alpha-beta cost of the group's placement
    (:func:`communication.alpha_beta.hierarchical_seconds`: inside a node NVLink (or PCIe) only; across nodes
    intra, then inter, then intra)."""
    from communication.alpha_beta import collective_seconds, hierarchical_seconds

    p = group_shape(config, group)[0]
    if hardware.notes.get("all_reduce_fits") or hardware.inter is None:
        return collective_seconds(kind, nbytes, p, *link_for(hardware, config, group))
    intra, inter = levels(hardware, config)
    if kind in ("send", "recv"):  # a neighbour in the pp group: inside the node or across
        members, nodes = group_placement(hardware, config, group)
        link = intra if nodes == 1 else inter
        return collective_seconds(kind, nbytes, p, link.alpha, link.beta, link.base)
    members, nodes = group_placement(hardware, config, group)
    return hierarchical_seconds(kind, nbytes, p, members if p % members == 0 else 1, intra, inter)


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


BUCKET_BYTES = 25 * 2**20  # gradient bucket of DDP (torch.nn.parallel.DistributedDataParallel, bucket_cap_mb=25)
IN_ACTION = ("tp", "cp", "ep")  # groups whose calls sit inside a forward or backward: on the critical path


def compute_efficiency(config, hardware) -> tuple[float, str]:
    """``(fraction of the peak FLOP/s the matrix products reach, where it comes from)``: ``--flops_efficiency``;
    else the newest GPU report in ``results/gpu/`` measured on this kind of GPU (its bf16 matrix-product peak
    over the datasheet's: ``matmul.measured_over_datasheet``, :mod:`project.gpu_report`); else the hardware's
    published MAMF figure (:attr:`course.hardware.Hardware.matmul_efficiency`)."""
    if config.flops_efficiency is not None:
        return config.flops_efficiency, "--flops_efficiency"
    measured = measured_efficiency(hardware.name)
    if measured:
        return measured
    return hardware.matmul_efficiency, hardware.efficiency_source


def measured_efficiency(name: str) -> tuple[float, str] | None:
    """The GPU report's measured matrix-product efficiency on a GPU of planner kind ``name`` (``h100``, ``h200``,
    ``a100``, ``l4``), from the newest report in ``results/gpu/`` (dry runs left out); None when there is none."""
    import json

    from course.gpu_figures import KIND, REPORTS_DIR
    from course.hardware import datasheet_bf16_peak

    kinds = {"H100 SXM5": "h100", "H200 SXM": "h200", "A100": "a100", "L4": "l4"}
    best = None
    for path in sorted(REPORTS_DIR.glob("*.json")) if REPORTS_DIR.is_dir() else []:
        try:
            report = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if report.get("kind") != KIND or report.get("dry_run"):
            continue
        sheet = datasheet_bf16_peak(report.get("device", {}).get("name", ""))
        ratio = (report.get("matmul") or {}).get("measured_over_datasheet")
        if sheet and kinds.get(sheet["model"]) == name and ratio and (best is None or report["created"] > best[2]):
            best = (ratio, f"results/gpu/{path.name} ({report['device']['name']}, {report['date']})",
                    report["created"])
    return best[:2] if best else None


def exposed_gathers(per_block: float, compute_per_block: float, blocks: int, overlap: bool) -> float:
    """Seconds a ZeRO-3 unit-by-unit all-gather adds to a pass over ``blocks`` blocks, each gather taking
    ``per_block`` and each block's computation ``compute_per_block``: with prefetch (``overlap``, as FSDP's
    forward and backward prefetch) the first gather is exposed and each later one hides behind the previous
    block's computation, ``g + (blocks - 1) max(0, g - c)``; without, all of them, ``blocks g``."""
    if blocks < 1 or per_block <= 0:
        return 0.0
    if not overlap:
        return blocks * per_block
    return per_block + (blocks - 1) * max(0.0, per_block - compute_per_block)


def reduction_finish(start_last_backward: float, end_backward: float, seconds: float, last_bucket: float,
                     overlap: bool) -> float:
    """When a stage's gradient reduction ends: its buckets but the last run from the start of the stage's last
    backward (its gradients are produced during it), the last bucket once the backward has ended and the others
    are done; without ``overlap`` all of it after the backward. The exposed part (the result less
    ``end_backward``) is ``max(0, C - C_last - B_last) + C_last`` with ``B_last`` the last backward's length
    (Li et al. 2020, PyTorch Distributed, Sec. 3.2.3: bucketing and overlap)."""
    if not overlap:
        return end_backward + seconds
    last = min(last_bucket, seconds)
    return max(end_backward, start_last_backward + seconds - last) + last


def pipeline_actions(config) -> list[list[tuple]]:
    """Every stage's action list (``pipeline.SCHEDULES``; with one stage, its micro-batches' forwards then
    backwards)."""
    from pipeline.schedules import all_actions

    if config.pp == 1:
        return [[("F", i) for i in range(config.micro_batches)] + [("B", i) for i in range(config.micro_batches)]]
    return all_actions(config.schedule, config.pp, config.micro_batches, config.virtual_stages)


def replay_step(actions, costs: list[dict], latency: float, extra: list[dict] | None = None):
    """:func:`pipeline.metrics.replay` of ``actions`` with ``costs[r][kind]`` seconds per action of stage r
    (``extra[r][kind]``: seconds added to the stage's first action of that kind)."""
    from pipeline.metrics import replay

    durations = []
    for r, acts in enumerate(actions):
        seen, row = set(), []
        for a in acts:
            add = 0.0
            if extra and a[0] not in seen:
                add = extra[r].get(a[0], 0.0)
                seen.add(a[0])
            row.append(costs[r][a[0]] + add)
        durations.append(row)
    return replay(actions, durations, latency)


def _split(calls: list[dict], config) -> dict:
    """A stage's calls by where they sit in the step: ``in_action`` {group: seconds per micro-batch, forward and
    backward}, ``hop`` (one pp send), ``gathers`` {group: (forward, backward) seconds of ZeRO-3's per-unit
    all-gathers}, ``reduction`` {group: seconds of the gradient reduction}, ``last_bucket`` {group: seconds of
    its last bucket}, ``post`` {group: seconds after the reduction: the tied embedding's all-reduce, the 3D
    step's scalars, ZeRO-1/2's all-gather of the updated weights}."""
    m = config.micro_batches
    passes = 3 if config.activation_checkpointing else 2
    forward_share = {"tp": 1 / passes, "cp": 1 / 3, "ep": 1 / 2}
    out = {"in_action": {}, "hop": 0.0, "gathers": {}, "reduction": {}, "last_bucket": {}, "post": {}}
    by_group: dict[str, list[dict]] = {}
    for c in calls:
        by_group.setdefault(c["group"], []).append(c)
    hpz = "hpz" in zeropp_parts(config)
    for group, group_calls in by_group.items():
        for i, c in enumerate(group_calls):
            seconds, scalar = c["seconds"], c["bytes"] == 8 and c["count"] <= 2
            if scalar or group == "embedding":
                out["post"][group] = out["post"].get(group, 0.0) + seconds
            elif group in IN_ACTION:
                f = seconds / m * forward_share[group]
                old = out["in_action"].get(group, (0.0, 0.0))
                out["in_action"][group] = (old[0] + f, old[1] + seconds / m - f)
            elif group == "pp":
                if c["kind"] == "send":
                    out["hop"] = seconds / c["count"]
            elif c["kind"] == "all_gather" and config.zero == 3:
                gathers = [x for x in group_calls if x["kind"] == "all_gather"]
                backward = group == "dp_shard" or (not (hpz and group == "dp") and c is gathers[-1])
                old = out["gathers"].get(group, (0.0, 0.0))
                out["gathers"][group] = (old[0] + (0 if backward else seconds), old[1] + (seconds if backward else 0))
            elif c["kind"] == "all_gather":  # ZeRO-1/2: the updated slices, after the optimizer step
                out["post"][group] = out["post"].get(group, 0.0) + seconds
            else:  # the gradient reduction (all-reduce, reduce-scatter, or ZeRO++'s int8 all-to-all)
                out["reduction"][group] = out["reduction"].get(group, 0.0) + seconds
                unit = seconds / c["count"] if config.zero == 3 else \
                    seconds * min(1.0, BUCKET_BYTES / max(c["bytes"], 1.0))
                out["last_bucket"][group] = max(out["last_bucket"].get(group, 0.0), unit)
    return out


def predict(config, hardware) -> dict:
    """The prediction for ``config`` (a :class:`PlanConfig`) on ``hardware`` (:class:`course.hardware.Hardware`).

    The step is **replayed**, not summed. Each stage's forward and backward of one micro-batch cost its model
    FLOPs (:func:`stage_flops`, the GEMM shapes of its blocks) at ``peak x efficiency``
    (:func:`compute_efficiency`), plus the calls that sit inside them on the critical path — tp all-reduces
    (or all-gathers and reduce-scatters), the cp ring, the ep all-to-all; the schedule's action lists
    (``pipeline.SCHEDULES``) are replayed with those costs and one pp send per hand-over between stages
    (:func:`pipeline.metrics.replay`); ZeRO-3's per-block all-gathers hide behind the previous block's
    computation (:func:`exposed_gathers`); each stage's gradient reduction runs in buckets behind its last
    backward (:func:`reduction_finish`); then the tied embedding's all-reduce, the 3D step's scalars and
    ZeRO-1/2's all-gather. ``--overlap`` off (the CPU's default) makes every call blocking.

    Breakdown: ``step_s = compute_s + bubble_s + comm_s``, with ``compute_s`` the critical stage's computation
    (the stage busiest in the replay), ``bubble_s`` its idle time in the replay without transfer latency,
    ``comm_s`` the exposed communication, per group in ``exposed_s`` (in-action calls of the critical stage;
    ``pp``: what the hand-overs add to the replay; the reduction's tail beyond the last backward; the calls
    after it); ``hidden_s`` per group is the rest of that group's seconds (``comm_total_s``, the most of any
    stage), hidden behind computation.

    Returns:
        ``{"stages": [per stage: {"memory": {params, grads, optimizer, activations, recompute, total} (bytes),
        "compute_s", "forward_s", "backward_s" (one micro-batch, with its in-action calls), "comm": [calls with
        "seconds" and "traffic_bytes"], "comm_s": {group: seconds of all its calls}}], "memory_bytes" (the
        largest stage total), "fits", "compute_s", "bubble" (the critical stage's idle fraction of the replay),
        "bubble_theory" (the schedule's formula), "bubble_s", "comm_s", "exposed_s", "hidden_s",
        "comm_total_s", "pipeline_s" (the replay's length), "step_s", "model_flops", "mfu", "tokens",
        "efficiency", "efficiency_source", "overlap", "limit" (what limits the step most)}``; times in seconds.
    """
    from course.collectives import ring_traffic_bytes
    from course.model import model_flops_per_token
    from pipeline.schedules import SCHEDULES

    efficiency, efficiency_source = compute_efficiency(config, hardware)
    # the FLOP/s the model's layers reach: the peak times the efficiency, or on the CPU the rate measured on a
    # whole block (products, layer norms, softmax, GeLU and Python together)
    rate = hardware.notes.get("achieved_flops", hardware.peak_flops[config.precision] * efficiency)
    overlap = config.overlap == "on"
    m, v = config.micro_batches, config.virtual_stages
    stages, costs, extra, parts = [], [], [], []
    for stage in range(config.pp):
        memory = stage_memory(config, stage)
        memory["total"] = sum(memory.values())
        calls = stage_communication(config, stage)
        comm_s: dict[str, float] = {}
        for c in calls:
            p = group_shape(config, c["group"])[0]
            c["seconds"] = c["count"] * call_seconds(hardware, config, c["group"], c["kind"], c["bytes"])
            c["traffic_bytes"] = c["count"] * ring_traffic_bytes(c["kind"], c["bytes"], p)
            comm_s[c["group"]] = comm_s.get(c["group"], 0.0) + c["seconds"]
        split = _split(calls, config)
        forward = stage_flops(config, stage, model_only=True) / 3 / m / rate      # one micro-batch, all chunks
        recompute = (stage_flops(config, stage) - stage_flops(config, stage, model_only=True)) / m / rate
        tp_f = sum(f for f, _ in split["in_action"].values())
        tp_b = sum(b for _, b in split["in_action"].values())
        if SCHEDULES[config.schedule].name == "zb-h1" and config.pp > 1:
            cost = {"F": forward + tp_f, "B": forward + recompute + tp_b, "W": forward}
        else:
            cost = {"F": forward + tp_f, "B": 2 * forward + recompute + tp_b}
        costs.append({k: t / v for k, t in cost.items()})
        blocks = max(1, stage_layout(config, stage)["blocks"])
        gather_f = sum(exposed_gathers(f / blocks, forward / blocks, blocks, overlap)
                       for f, _ in split["gathers"].values())
        gather_b = sum(exposed_gathers(b / blocks, (2 * forward + recompute) / blocks, blocks, overlap)
                       for _, b in split["gathers"].values())
        extra.append({"F": gather_f, "B": gather_b})
        parts.append(split | {"compute": (3 * forward + recompute) * m, "gather_s": gather_f + gather_b,
                              "tp_s": (tp_f + tp_b) * m})
        stages.append({"stage": stage, "memory": memory, "compute_s": stage_flops(config, stage) / rate,
                       "forward_s": cost["F"], "backward_s": cost["B"] + cost.get("W", 0.0), "comm": calls,
                       "comm_s": comm_s})
    actions = pipeline_actions(config)
    hop = max(s["hop"] for s in parts)
    still = replay_step(actions, costs, 0.0, extra)
    events = replay_step(actions, costs, hop, extra) if hop else still
    t0 = max(e[3] for ev in still for e in ev)
    t1 = max(e[3] for ev in events for e in ev)
    finish, ends = [], []
    for r, ev in enumerate(events):
        last_b = max(e[2] for e in ev if e[0] == "B")
        end = ev[-1][3]
        total = sum(parts[r]["reduction"].values())
        last = max(parts[r]["last_bucket"].values(), default=0.0)
        finish.append(reduction_finish(last_b, end, total, last, overlap))
        ends.append(finish[-1] + sum(parts[r]["post"].values()))
    step = max(ends)
    busy = [sum(e[3] - e[2] for e in ev) for ev in still]
    crit = max(range(config.pp), key=lambda r: busy[r])
    compute = parts[crit]["compute"]
    bubble_s = t0 - busy[crit]
    exposed: dict[str, float] = {}

    def add(group, seconds):
        if seconds > 0:
            exposed[group] = exposed.get(group, 0.0) + seconds

    for group, (f, b) in parts[crit]["in_action"].items():
        add(group, (f + b) * m)
    gathers = parts[crit]["gathers"]
    gather_total = sum(f + b for f, b in gathers.values())
    for group, (f, b) in gathers.items():  # the exposed part of ZeRO-3's gathers, shared out by their seconds
        add(group, parts[crit]["gather_s"] * (f + b) / gather_total)
    add("pp", t1 - t0)
    r_red = max(range(config.pp), key=lambda r: finish[r])
    tail = max(finish) - t1
    red_total = sum(parts[r_red]["reduction"].values())
    for group, seconds in parts[r_red]["reduction"].items():
        add(group, tail * seconds / red_total)
    r_end = max(range(config.pp), key=lambda r: ends[r])
    post_total = sum(parts[r_end]["post"].values())
    for group, seconds in parts[r_end]["post"].items():
        add(group, (step - max(finish)) * seconds / post_total)
    totals: dict[str, float] = {}
    for s in stages:
        for group, seconds in s["comm_s"].items():
            totals[group] = max(totals.get(group, 0.0), seconds)
    hidden = {g: max(0.0, t - exposed.get(g, 0.0)) for g, t in totals.items()}
    comm = sum(exposed.values())
    theory = SCHEDULES[config.schedule].bubble(config.pp, m, v) if config.pp > 1 else 0.0
    tokens = config.batch_size * config.model_max_length
    model_flops = model_flops_per_token(config.preset, config.vocab_size, config.model_max_length,
                                        **config.model_overrides) * tokens
    memory_bytes = max(s["memory"]["total"] for s in stages)
    prediction = {"stages": stages, "memory_bytes": memory_bytes, "device_memory_bytes": hardware.memory_bytes,
                  "fits": memory_bytes <= hardware.memory_bytes, "compute_s": compute,
                  "bubble": bubble_s / t0 if t0 else 0.0, "bubble_theory": theory, "bubble_s": bubble_s,
                  "comm_s": comm, "exposed_s": exposed, "hidden_s": hidden, "comm_total_s": totals,
                  "pipeline_s": t1, "step_s": step, "tokens": tokens, "model_flops": model_flops,
                  "mfu": model_flops / (step * config.devices * hardware.peak_flops[config.precision]),
                  "hardware": hardware.name, "peak_flops": hardware.peak_flops[config.precision],
                  "efficiency": rate / hardware.peak_flops[config.precision],
                  "efficiency_source": "measured on this CPU" if "achieved_flops" in hardware.notes
                  else efficiency_source, "overlap": overlap, "critical_stage": crit}
    prediction["limit"] = limiting_term(config, hardware, prediction)
    return prediction


def limiting_term(config, hardware, prediction: dict) -> str:
    """What limits the step most: ``"memory"`` when it does not fit, else the largest of the bubble and each
    group's exposed communication as a share of the step (a tp group that spans nodes is named so), or
    ``"compute"`` when none of them is over 10 % of it."""
    if not prediction["fits"]:
        return f"memory ({prediction['memory_bytes'] / 1e9:.0f} of {prediction['device_memory_bytes'] / 1e9:.0f} GB)"
    terms = {"bubble": prediction["bubble_s"]} | {f"exposed {g}": t for g, t in prediction["exposed_s"].items()}
    name, seconds = max(terms.items(), key=lambda kv: kv[1])
    share = seconds / prediction["step_s"]
    if share < 0.10:
        return "compute"
    if name in ("exposed tp", "exposed cp", "exposed dp") and hardware.inter is not None:
        group = name.split()[1]
        if group_placement(hardware, config, group)[1] > 1:
            name += " across nodes"
    return f"{name} {share:.0%}"


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


# ---- the ranked plans ----------------------------------------------------------------------------------

def plan_candidates(config) -> list[dict]:
    """Every mesh of ``config.n_devices`` the model and batch allow, as option values: each ``(dp, pp, tp)``
    with ``dp * pp * tp * cp = n_devices`` (:func:`three_d.factorisation_benchmark.factorisations`: heads and
    the MLP width divisible by tp, at least one block per stage), ``--cp`` as given, the batch divisible by dp,
    and for each a micro-batch size b of 1, 2, 4, ... rows dividing the per-dp batch (``micro_batches =
    batch / (dp b)``; with pp > 1 at most 4 rows, since more micro-batches only shrink the bubble)."""
    from three_d.factorisation_benchmark import factorisations

    shape = config.model_shape
    out = []
    for dp, pp, tp in factorisations(config.n_devices // config.cp, shape["n_layer"], shape["n_head"],
                                     shape["n_inner"]):
        if config.batch_size % dp:
            continue
        per_dp, rows = config.batch_size // dp, 1
        while rows <= per_dp and (pp == 1 or rows <= 4):
            if per_dp % rows == 0:
                out.append({"dp": dp, "pp": pp, "tp": tp, "micro_batches": per_dp // rows})
            rows *= 2
    return out


def rank_plans(config, hardware) -> list[dict]:
    """The plans for ``config.n_devices`` devices, best first: for each mesh of :func:`plan_candidates`, its
    fastest micro-batching that fits the device's memory (else its smallest in memory), predicted with
    :func:`predict`; those that fit first, by predicted step time, then those that do not, by memory.

    Returns:
        ``[{"dims": {"dp", "pp", "tp", "cp", "micro_batches"}, "config": PlanConfig, "prediction": dict}]``.
    """
    best: dict[tuple, dict] = {}
    base = {k: v for k, v in config.record().items() if k not in ("dp", "pp", "tp", "micro_batches")}
    base.update(verify=False)
    for values in plan_candidates(config):
        try:
            plan = PlanConfig.for_test(**base, **values)
        except ConfigError:
            continue  # e.g. interleaved's micro-batch rule, or more stages than blocks x chunks
        out = predict(plan, hardware)
        key = (values["dp"], values["pp"], values["tp"])
        score = (not out["fits"], out["step_s"] if out["fits"] else out["memory_bytes"])
        if key not in best or score < best[key]["score"]:
            best[key] = {"dims": dict(values, cp=config.cp), "config": plan, "prediction": out, "score": score}
    return sorted(best.values(), key=lambda r: r["score"])


def format_plans(config, plans: list[dict], top: int) -> str:
    """The ranked plans as a table: mesh, micro-batches, memory per device, step time, MFU, bubble, exposed
    communication and what limits each."""
    fitting = [p for p in plans if p["prediction"]["fits"]]
    head = (f"plans for {config.preset} on {config.n_devices} x {config.hardware}: batch {config.batch_size} x "
            f"{config.model_max_length} tokens, ZeRO-{config.zero}, {config.precision}, {config.schedule}, "
            f"checkpointing {'on' if config.activation_checkpointing else 'off'}, sequence parallel "
            f"{'on' if config.sequence_parallel else 'off'}, overlap {config.overlap}; {len(plans)} meshes, "
            f"{len(fitting)} fit")
    lines = [head, "", f"{'#':>3} {'dp':>5} {'pp':>4} {'tp':>4} {'cp':>3} {'micro':>6} {'memory':>9} {'step':>10} "
             f"{'MFU':>6} {'bubble':>7} {'exposed comm':>13}  limited by"]
    for i, p in enumerate(plans[:top], 1):
        d, out = p["dims"], p["prediction"]
        step = f"{out['step_s'] * 1e3:.1f} ms" if out["step_s"] < 1 else f"{out['step_s']:.3f} s"
        lines.append(f"{i:>3} {d['dp']:>5} {d['pp']:>4} {d['tp']:>4} {d['cp']:>3} {d['micro_batches']:>6} "
                     f"{out['memory_bytes'] / 1e9:>6.1f} GB {step:>10} {out['mfu']:>6.1%} {out['bubble']:>7.1%} "
                     f"{out['comm_s'] / out['step_s']:>13.1%}  {out['limit']}")
    if not fitting:
        lines.append("")
        lines.append("no plan fits: try --zero 3, --activation_checkpointing, a smaller --batch_size or more devices")
    return "\n".join(lines)


VERIFY_SCRIPT = """
import json, sys
from project.fake_mesh import check_supported, measure
from project.plan import PlanConfig
out = []
for values in json.loads(sys.argv[1]):
    plan = PlanConfig.for_test(**values)
    try:
        check_supported(plan)
    except ValueError as exc:
        out.append({"error": str(exc)})
        continue
    for rank in sorted({0, plan.world_size - 1}):
        got = measure(plan, rank)
        out.append({"rank": rank, "stage": got["stage"], "held": got["bytes"], "planned": got["planned"],
                    "peak": got["memtracker"]["peak"].get("Total")})
print(json.dumps(out))
"""


def verify_plans(plans: list[dict], timeout: float = 1800.0, log=print) -> list[dict]:
    """Build the first and the last rank of each plan in a fake world (:func:`project.fake_mesh.measure`: the
    course's mesh, stage and ZeRO on meta tensors), in a child process bounded by ``timeout`` seconds (a process
    group, once made, would stay in this one), and set their bytes beside the planner's. The fake rank builds
    fp32 dense runs without checkpointing or sequence parallelism (``project.fake_mesh.check_supported``):
    each plan is verified in that form (the bytes' arithmetic is the same; bf16's 2 + 2 + 12 bytes per
    parameter are 4 + 4 + 8 there), and the changes are said.

    Returns:
        ``[{"dims", "rank", "stage", "held": {params, grads, optimizer}, "planned": {...}, "peak" (MemTracker's
        peak total), "changed"}]`` (or ``{"dims", "error"}`` for a plan the fake rank does not build).

    Raises:
        RuntimeError: the child failed (its error's end in the message).
    """
    import json
    import os
    import subprocess

    changes = {"precision": "fp32", "activation_checkpointing": False, "sequence_parallel": False}
    values = [p["config"].record() | changes | {"verify": False, "json": None} for p in plans]
    root = Path(__file__).resolve().parent.parent
    done = subprocess.run([sys.executable, "-c", VERIFY_SCRIPT, json.dumps(values)], cwd=root, capture_output=True,
                          text=True, timeout=timeout, env={**os.environ, "PYTHONPATH": str(root)})
    if done.returncode:
        raise RuntimeError(f"the fake ranks failed: {done.stderr[-2000:]}")
    found, results = [], iter(json.loads(done.stdout.strip().splitlines()[-1]))
    for p in plans:
        changed = [k for k, v in changes.items() if getattr(p["config"], k) != v]
        first = next(results)
        if "error" in first:
            log(f"  {p['dims']}: not built ({first['error']})")
            found.append({"dims": p["dims"], "error": first["error"]})
            continue
        rows = [first] + ([next(results)] if p["config"].world_size > 1 else [])
        for row in rows:
            row.update(dims=p["dims"], changed=changed)
            found.append(row)
            log("  " + " ".join(f"{k}={v}" for k, v in p["dims"].items()) + f", rank {row['rank']} (stage "
                f"{row['stage']})" + (f" [{', '.join(changed)}: as fp32 / off]" if changed else "") + ": "
                + ", ".join(f"{k} {row['held'][k] / 1e6:,.2f} MB held / {row['planned'][k] / 1e6:,.2f} MB planned "
                            f"({row['held'][k] - row['planned'][k]:+,.0f} B)" for k in ("params", "grads", "optimizer")))
    return found


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
    if config.ranking:
        plans = rank_plans(config, hardware)
        print(format_plans(config, plans, config.top))
        report = {"config": config.record(), "plans": [{"dims": p["dims"], "prediction": p["prediction"]}
                                                        for p in plans[:config.top]]}
        if config.verify:
            print("\nverify: one fake rank of each plan (project/fake_mesh.py), its bytes beside the planner's")
            report["verify"] = verify_plans(plans[:config.top])
        if config.json:
            from course.results import write_json

            write_json(Path(config.json), report)
        return 0 if any(p["prediction"]["fits"] for p in plans) else 2
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
