"""The planner's options, declared once: :class:`PlanConfig`, the run scripts' configuration
(:class:`course.config.RunConfig`: mesh, micro-batches, batch, sequence, vocabulary, dropout) with the planner's
defaults and choices, and every option only planning needs (its checks: :mod:`project.planner.rules`)."""
from __future__ import annotations

from dataclasses import dataclass

from course.config import ConfigError, RunConfig, option
from project.planner.model import MODELS

PLAN = "plan"
MODEL = "model shape"


@dataclass
class PlanConfig(RunConfig):
    """``python -m project.planner``: the run to plan — the run scripts' options (mesh, micro-batches, batch,
    sequence, vocabulary, dropout, preset with the planner's wider choice) and what only planning needs."""

    description = "Predict per-rank memory, step time and MFU of a training run before launching it."
    # the run scripts' options (course.config.RunConfig's table), with the planner's defaults, choices and notes
    takes = ("dp", "pp", "tp", "cp", "ep", "micro_batches", "virtual_stages", "schedule", "n_layer", "num_experts",
             "top_k", "moe_every", "sequence_parallel", "zero", "zeropp", "zeropp_group", "activation_checkpointing",
             "precision", "steps", "out")
    defaults = {"dropout": 0.0, "batch_size": None, "model_max_length": None, "vocab_size": None, "precision": "bf16",
                "schedule": "1f1b", "num_experts": 1, "steps": 4}
    choices = {"preset": ("auto", *MODELS), "schedule": ("gpipe", "1f1b", "interleaved", "zb-h1")}
    notes = {"dropout": "its masks are kept for the backward pass",
             "preset": "the planner's models, project.planner.model.MODELS: GPT-2 and Llama 3 shapes",
             "batch_size": "default 64, and for the ranked plans 1024 (with 4096 tokens each: a 4M-token step)",
             "model_max_length": "default 128, and 4096 for the ranked plans",
             "vocab_size": "default: the preset's (50,257 for GPT-2's, 128,256 for Llama 3's), else 5000",
             "num_experts": "1: dense",
             "zeropp_group": "the planner: 0 is the devices of a node, at most --dp",
             "activation_checkpointing": "the planner: full recomputation of every block",
             "precision": "the planner: fp32 prices 4 + 4 + 8 bytes per parameter and fp32 products; bf16 mixed "
                          "precision, 2 + 2 + 12 bytes, bf16 products and activations",
             "steps": "the planner: --measure's timed steps, after one warm-up step",
             "out": "the planner: the prediction (and measurement)"}
    world_option = None

    # ---- what only planning needs ----
    hardware: str = option("h100", "device (course.hardware.HARDWARE, published figures) or cpu (this machine, "
                                   "measured)", group=PLAN, choices=("h100", "h100-96gb", "h200", "a100", "l4", "cpu"))
    n_devices: int | None = option(None, "devices of the run (default: the mesh's dp x pp x cp x tp); given without "
                                         "--dp --pp --tp: rank every dp x pp x tp of it", group=PLAN)
    devices_per_node: int | None = option(None, "devices per node (default: the hardware's, 8)", group=PLAN)
    intra_link: str = option("nvlink", "the link between the GPUs of a node", group=PLAN, choices=("nvlink", "pcie"))
    selective_checkpointing: str = option("none", "recompute part of each block: attention (the attention core: "
                                                  "Korthikanti et al. 2022, Sec. 5) or matmuls (every other matrix "
                                                  "product and every elementwise kernel: torchtitan's selective op "
                                                  "policy)", group=PLAN, choices=("none", "attention", "matmuls"))
    activation_model: str | None = option(None, "korthikanti: Megatron-LM's layers (Korthikanti et al. 2022, Table 2); "
                                                "course: this course's GPT-2 blocks (transformers' elementwise GeLU); "
                                                "default: course on the CPU, korthikanti on GPUs", group=PLAN,
                                          choices=("korthikanti", "course"))
    attention_kernel: str = option("auto", "flash (FlashAttention: no s x s scores kept, causal blocks skipped) or "
                                           "eager (the s x s scores as products and softmax); auto: eager for the "
                                           "course's GPT-2 blocks (--activation_model course), flash elsewhere; "
                                           "context parallelism's is always blockwise", group=PLAN,
                                   choices=("auto", "flash", "eager"))
    fused_kernels: bool = option(False, "elementwise chains fused into one kernel each (torch.compile; Megatron-LM's "
                                        "fused bias-GeLU, bias-dropout-add and scale-mask-softmax)", group=PLAN)
    norm_kernel: str = option("auto", "how the norms run: fused (one kernel: torch's LayerNorm, Megatron-LM's, "
                                      "nanotron's Triton RMSNorm, torch.compile) or composite (RMSNorm as eight "
                                      "PyTorch operations, each a kernel: torchtitan's and transformers' RMSNorm "
                                      "modules in eager mode); auto: composite for an RMSNorm without "
                                      "--fused_kernels, else fused", group=PLAN,
                              choices=("auto", "fused", "composite"))
    reduce_dtype: str = option("auto", "the precision the data-parallel gradient reduction runs in (auto: "
                                       "--precision's; fp32 as torchtitan's FSDP2, training.mixed_precision_reduce)",
                               group=PLAN, choices=("auto", "bf16", "fp32"))
    cp_comm: str = option("ring", "context parallelism's K and V exchange: ring (sends around the cp group) or "
                                  "all_gather (Llama 3's: K, V gathered, their gradients reduce-scattered)",
                          group=PLAN, choices=("ring", "all_gather"))
    flops_efficiency: float | None = option(None, "fraction of the peak FLOP/s a large matrix product reaches (default: "
                                                 "this GPU's measured by the course's GPU report in results/gpu/, else "
                                                 "its published MAMF figure; shapes reach less: project.planner."
                                                 "pricing)", group=PLAN)
    dp_overlap: str = option("auto", "overlap the data-parallel communication with computation: gradient buckets "
                                     "behind the last backward, ZeRO-3's gathers prefetched (auto: on for GPUs, off "
                                     "on the CPU, where the course's steps reduce after the backward)", group=PLAN,
                             choices=("auto", "on", "off"))
    n_embd: int | None = option(None, "a free shape: width", group=MODEL)
    n_head: int | None = option(None, "a free shape: query heads", group=MODEL)
    n_kv_head: int | None = option(None, "a free shape: key/value heads (fewer than --n_head: grouped-query attention; "
                                         "1: multi-query)", group=MODEL)
    n_inner: int | None = option(None, "a free shape: MLP width (GeLU default 4 x width)", group=MODEL)
    mlp: str | None = option(None, "a free shape: gelu (GPT-2's two matrices) or swiglu (Llama's three)", group=MODEL,
                             choices=("gelu", "swiglu"))
    top: int = option(10, "the ranked plans: how many to print", group=PLAN)
    rank: int = option(0, "the fake world (python -m project.planner.fake_mesh): the global rank to build", group=PLAN)
    factorisations: bool = option(False, "the fake world: build the rank at every dp x pp x tp of the world the model "
                                         "allows, one line each", group=PLAN)
    verify: bool = option(False, "the ranked plans: build one rank of each top plan in a fake world and print its "
                                 "memory beside the prediction", group=PLAN)
    measure: bool = option(False, "also run the configuration on this machine's CPU and print the measurement beside "
                                  "the prediction, with the error of each term", group=PLAN)
    cpu_figures: str | None = option(None, "--hardware cpu: read this machine's measured FLOP/s and alpha-beta from "
                                           "this JSON file, or measure them and write it there", group=PLAN)

    # ---- derived -------------------------------------------------------------------------------------
    @property
    def devices(self) -> int:
        return self.n_devices if self.n_devices is not None else self.world_size

    @property
    def shape_overrides(self) -> dict:
        """The free-shape options given (``--n_layer --n_embd --n_head --n_kv_head --n_inner --mlp``)."""
        return {k: getattr(self, k) for k in ("n_layer", "n_embd", "n_head", "n_kv_head", "n_inner", "mlp")
                if getattr(self, k) is not None}

    @property
    def model(self):
        """The :class:`project.planner.model.ModelShape` planned: the preset's with :attr:`shape_overrides`."""
        return MODELS[self.preset].replace(**self.shape_overrides)

    @property
    def model_shape(self) -> dict:
        model = self.model
        return {"n_layer": model.n_layer, "n_embd": model.n_embd, "n_head": model.n_head, "n_inner": model.n_inner}

    @property
    def norms(self) -> str:
        """``fused`` or ``composite``: how the norms run (``--norm_kernel``; auto: composite for an RMSNorm
        without ``--fused_kernels``)."""
        if self.norm_kernel != "auto":
            return self.norm_kernel
        return "composite" if self.model.norm == "rmsnorm" and not self.fused_kernels else "fused"

    @property
    def gradient_bytes(self) -> int:
        """Bytes per element of the data-parallel gradient reduction (``--reduce_dtype``; auto: the precision's)."""
        dtype = self.reduce_dtype if self.reduce_dtype != "auto" else self.precision
        return 4 if dtype == "fp32" else 2

    @property
    def recompute(self) -> str:
        from project.planner.memory import recompute_policy

        return recompute_policy(self)

    @property
    def ranking(self) -> bool:
        """The ranked plans: ``--n_devices`` given without a mesh (``--dp --pp --tp`` left at 1)."""
        return (self.n_devices is not None and self.dp == self.pp == self.tp == 1
                and self.n_devices != self.cp * self.ep and not self.measure)

    def resolve(self, devices: int | None = None, *, here: bool = True) -> None:
        super().resolve(devices, here=here)
        if self.activation_model is None:
            self.activation_model = "course" if self.hardware == "cpu" else "korthikanti"
        if self.attention_kernel == "auto":
            self.attention_kernel = "eager" if self.activation_model == "course" else "flash"
        if self.cp > 1:
            self.attention_kernel = "flash"  # context parallelism's attention is blockwise: no s x S scores kept
        if self.batch_size is None:
            self.batch_size = 1024 if self.ranking else 64
        if self.model_max_length is None:
            self.model_max_length = 4096 if self.ranking else 128
        if self.vocab_size is None:
            self.vocab_size = MODELS[self.preset].vocab_size or 5000
        if self.dp_overlap == "auto":
            self.dp_overlap = "off" if self.hardware == "cpu" else "on"

    def check(self) -> None:
        try:
            self.model.check()
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
        super().check()
        from project.planner.rules import check_plan

        check_plan(self)
