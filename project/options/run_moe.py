"""The configuration of ``project/run_moe.py`` (torch-free: the script, ``modal run`` and the tests
import it)."""
from __future__ import annotations

import re
from dataclasses import dataclass

from course.config import ConfigError, RunConfig, options_in


@dataclass
class MoERunConfig(RunConfig):
    """``project/run_moe.py``: a GPT-2 with MoE MLPs over ``--dp`` ranks, its experts shared out over ``--ep``."""

    description = ("GPT-2 with mixture-of-experts MLPs, expert parallel x data parallel, on Multi30k German→English "
                   "(assignment 5.8).")
    results_prefix = "moe_"  # its files: moe_rank{r}_results_epoch{e}.json
    takes = ("dp", "ep", *options_in("mixture of experts"))
    defaults = {"batch_size": 32, "dp": None, "ep": None}
    notes = {"ep": "a divisor of --dp; default: --dp"}
    world_option = "dp"

    def resolve(self, devices: int | None = None, *, here: bool = True) -> None:
        from moe.config import DEEPSEEK_V3_ROUTED_SCALING_FACTOR

        super().resolve(devices, here=here)
        if self.ep is None:
            self.ep = self.dp
        if self.routed_scaling_factor is None:  # DeepSeek-V3's with its router; the softmax router takes none
            self.routed_scaling_factor = DEEPSEEK_V3_ROUTED_SCALING_FACTOR if self.router == "deepseek" else 1.0

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
            MoEConfig.of_run(self).check(self.ep)
        except ValueError as exc:
            fits = [e for e in range(1, self.dp * self.cp + 1) if (self.dp * self.cp) % e == 0 and
                    self.num_experts % e == 0]  # an --ep that shares out the experts and divides dp x cp
            raise ConfigError(re.sub(r"choose --ep in \[[^]]*\]", f"choose --ep in {fits} (it divides --dp "
                                     f"{self.dp} too)", str(exc))) from None
        if self.moe_every < 1:
            raise ConfigError(f"--moe_every must be >= 1, not {self.moe_every}")
        n_layer = self.model_shape["n_layer"]
        if n_layer < self.moe_every:
            raise ConfigError(f"--preset {self.preset} has {n_layer} blocks: with --moe_every {self.moe_every} none "
                              "would be an MoE block; lower --moe_every")
