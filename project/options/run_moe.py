"""The configuration of ``project/run_moe.py`` (torch-free: the script, ``modal run`` and the tests
import it)."""
from __future__ import annotations

import re
from dataclasses import dataclass

from course.config import ConfigError, RunConfig, option

MOE = "mixture of experts"


@dataclass
class MoERunConfig(RunConfig):
    """``project/run_moe.py``: a GPT-2 with MoE MLPs over ``--dp`` ranks, its experts shared out over ``--ep``."""

    description = ("GPT-2 with mixture-of-experts MLPs, expert parallel x data parallel, on Multi30k German→English "
                   "(assignment 5.8).")
    results_prefix = "moe_"  # its files: moe_rank{r}_results_epoch{e}.json
    mesh_options = ("dp", "ep")
    world_option = "dp"

    batch_size: int = option(32, "global batch size (sequences per optimizer step)", group="model and training")
    dp: int | None = option(None, "data-parallel ranks (default: torchrun's WORLD_SIZE, else 2)", group="mesh")
    ep: int | None = option(None, "expert-parallel ranks, dividing --dp (default: --dp)", group="mesh")
    num_experts: int = option(4, "experts per MoE layer", group=MOE)
    top_k: int = option(2, "experts per token (1: Switch Transformer; 2: GShard, Mixtral)", group=MOE)
    capacity_factor: float | None = option(None, "expert capacity = ceil(factor * tokens * top_k / experts), the rest "
                                                 "dropped (default: dropless)", group=MOE)
    no_normalize_gates: bool = option(False, "top-k > 1: keep the softmax probabilities as gates instead of normalising "
                                             "them to sum to 1 (top-1 gates are always the probability, as in Switch "
                                             "Transformer)", group=MOE)
    aux_loss_coef: float = option(0.01, "load-balancing loss weight (Switch: 0.01)", group=MOE)
    z_loss_coef: float = option(0.001, "router z-loss weight (ST-MoE: 0.001)", group=MOE)
    router: str = option("softmax", "softmax: top-k softmax gating; deepseek: DeepSeek-V3's sigmoid gating with a "
                                    "selection bias, group-limited routing and the sequence-wise balance loss "
                                    "(weighted by --aux_loss_coef)", group=MOE, choices=("softmax", "deepseek"))
    shared_experts: int = option(0, "shared experts every token passes through besides its routed ones (DeepSeekMoE)",
                                 group=MOE)
    router_bias_update: float = option(0.0, "--router deepseek: auxiliary-loss-free balancing, the selection bias "
                                            "moves by this gamma after each step (DeepSeek-V3: 0.001; 0: off)",
                                       group=MOE)
    n_group: int = option(1, "--router deepseek: the experts form this many groups (nodes)", group=MOE)
    topk_group: int = option(1, "--router deepseek: groups each token may route to (node-limited routing)",
                             group=MOE)
    moe_every: int = option(2, "one MoE block in this many (blocks 1, 3, ... for 2)", group=MOE)
    dense: bool = option(False, "train the dense GPT-2 of the same active parameters per token instead (same batches)",
                         group=MOE)

    @property
    def world_size(self) -> int:
        return self.dp

    def resolve(self, devices: int | None = None, *, here: bool = True) -> None:
        super().resolve(devices, here=here)
        if self.ep is None:
            self.ep = self.dp

    def export_refusal(self) -> str | None:
        if self.dense and self.top_k == 1:
            return None  # the dense counterpart of a top-1 MoE is GPT-2 itself
        if self.dense:
            return (f"--dense --top_k {self.top_k} trains a GPT-2 whose would-be MoE blocks hold MLPs {self.top_k} times "
                    "as wide as the others (transformers' GPT2Config has one n_inner); only --top_k 1 exports")
        return ("transformers has no GPT-2 with mixture-of-experts MLPs to load it into; export works for the dense "
                "runs of run_data_parallel.py, run_pipeline.py, run_tensor_parallel.py and run_3d.py")

    def check(self) -> None:
        from moe.config import MoEConfig

        super().check()
        try:
            MoEConfig(self.num_experts, self.top_k, self.capacity_factor, None, self.aux_loss_coef, self.z_loss_coef,
                      self.router, self.shared_experts, self.router_bias_update, self.n_group,
                      self.topk_group).check(self.ep)
        except ValueError as exc:
            fits = [e for e in range(1, self.dp * self.cp + 1) if (self.dp * self.cp) % e == 0 and
                    self.num_experts % e == 0]  # an --ep that shares out the experts and divides dp x cp
            raise ConfigError(re.sub(r"choose --ep in \[[^]]*\]", f"choose --ep in {fits} (it divides --dp "
                                     f"{self.dp} too)", str(exc))) from None
        if self.moe_every < 1:
            raise ConfigError(f"--moe_every must be >= 1, not {self.moe_every}")
        if self.batch_size % self.dp:
            raise ConfigError(f"--batch_size {self.batch_size} is not divisible by --dp {self.dp} (every rank takes an "
                              f"equal share of a batch); try --batch_size {max(1, self.batch_size // self.dp) * self.dp}")
        n_layer = self.model_shape["n_layer"]
        if n_layer < self.moe_every:
            raise ConfigError(f"--preset {self.preset} has {n_layer} blocks: with --moe_every {self.moe_every} none "
                              "would be an MoE block; lower --moe_every")
