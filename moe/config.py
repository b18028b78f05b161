"""The settings of a mixture-of-experts layer, checked before anything is built or launched.

A mixture-of-experts (MoE) layer replaces one feed-forward block by ``num_experts`` of them
(the *experts*) and a *router* that sends each token to ``top_k`` of them (Shazeer et al. 2017;
Lepikhin et al. 2020, GShard; Fedus et al. 2021, Switch Transformer; Jiang et al. 2024,
Mixtral). The names follow Megatron-Core's ``TransformerConfig`` (``num_moe_experts``,
``moe_router_topk``, ``moe_expert_capacity_factor``, ``moe_aux_loss_coeff``,
``moe_z_loss_coeff``) and ``transformers``' ``MixtralConfig``.
"""
from __future__ import annotations

from dataclasses import dataclass

# DeepSeek-V3's routed scaling factor (its released configuration's ``routed_scaling_factor``; the report's
# eq. 13 gates times it): the default of ``--routed_scaling_factor`` with ``--router deepseek``.
DEEPSEEK_V3_ROUTED_SCALING_FACTOR = 2.5


@dataclass(frozen=True)
class MoEConfig:
    """Routing and capacity of one MoE layer.

    Attributes:
        num_experts: experts per MoE layer (E).
        top_k: experts each token is sent to (k; 1 in Switch Transformer, 2 in GShard and Mixtral).
        capacity_factor: each expert takes at most ``ceil(capacity_factor * T * k / E)`` of the
            T tokens' k choices (Fedus et al. 2021, Sec. 2.2); the rest are dropped. None:
            dropless, every choice is kept.
        normalize_gates: scale each token's k gate values to sum to 1 (GShard, Mixtral). Switch
            Transformer (k = 1) keeps the softmax probability as the gate, so the router gets a
            gradient from the layer's output; normalised, a top-1 gate would always be 1.
            None (default): normalise when k > 1.
        aux_loss_coef: weight of the load-balancing loss (Switch Transformer, eq. 4; alpha = 0.01 there).
        z_loss_coef: weight of the router z-loss (Zoph et al. 2022, ST-MoE, eq. 5; 0.001 there).
            The DeepSeek router has no z-loss (its scores are sigmoids, not a softmax).
        router: ``"softmax"`` (:mod:`moe.router`) or ``"deepseek"`` (:mod:`moe.deepseek_router`:
            sigmoid scores, a selection-only bias, group-limited routing; DeepSeek-V3, Sec. 2.1.2).
            With ``"deepseek"``, ``aux_loss_coef`` weights the sequence-wise balance loss (eq. 17-20).
        shared_experts: experts every token passes through, besides its k routed ones (DeepSeekMoE;
            0: none).
        router_bias_update: gamma, the bias update speed of auxiliary-loss-free balancing (0: the
            bias stays zero). DeepSeek router only.
        n_group, topk_group: the experts form ``n_group`` equal groups (nodes) and each token picks
            its experts from its ``topk_group`` best groups (node-limited routing; 1, 1: no limit).
        routed_scaling_factor: the routed experts' gates are multiplied by it (DeepSeek-V3: 2.5,
            :data:`DEEPSEEK_V3_ROUTED_SCALING_FACTOR`; the default of ``--routed_scaling_factor`` with
            ``--router deepseek``). DeepSeek router only.

    Raises:
        ValueError: at construction, naming the option: ``num_experts`` < 1, ``top_k`` not in
            ``1 .. num_experts``, ``capacity_factor`` <= 0, a negative loss coefficient, an unknown
            ``router``, DeepSeek options with the softmax router, groups that do not divide the
            experts or hold fewer than ``top_k`` of them.
    """

    num_experts: int = 4
    top_k: int = 2
    capacity_factor: float | None = None
    normalize_gates: bool | None = None
    aux_loss_coef: float = 0.01
    z_loss_coef: float = 0.001
    router: str = "softmax"
    shared_experts: int = 0
    router_bias_update: float = 0.0
    n_group: int = 1
    topk_group: int = 1
    routed_scaling_factor: float = 1.0

    def __post_init__(self):
        if not isinstance(self.num_experts, int) or self.num_experts < 1:
            raise ValueError(f"--num_experts must be a whole number >= 1, not {self.num_experts!r}")
        if not isinstance(self.top_k, int) or not 1 <= self.top_k <= self.num_experts:
            raise ValueError(f"--top_k must be between 1 and --num_experts {self.num_experts} (a token cannot pick "
                             f"more experts than there are), not {self.top_k!r}")
        if self.capacity_factor is not None and not self.capacity_factor > 0:  # also refuses nan
            raise ValueError(f"--capacity_factor must be > 0 (1.0: room for an even share of the tokens; leave it out "
                             f"for dropless routing), not {self.capacity_factor!r}")
        if self.normalize_gates is None:
            object.__setattr__(self, "normalize_gates", self.top_k > 1)
        for name in ("aux_loss_coef", "z_loss_coef"):
            if not getattr(self, name) >= 0:
                raise ValueError(f"--{name} must be >= 0, not {getattr(self, name)!r}")
        self._check_deepseek()

    def _check_deepseek(self) -> None:
        if self.router not in ("softmax", "deepseek"):
            raise ValueError(f"--router must be softmax or deepseek, not {self.router!r}")
        if not isinstance(self.shared_experts, int) or self.shared_experts < 0:
            raise ValueError(f"--shared_experts must be a whole number >= 0, not {self.shared_experts!r}")
        if not self.router_bias_update >= 0:
            raise ValueError(f"--router_bias_update must be >= 0, not {self.router_bias_update!r}")
        if not self.routed_scaling_factor > 0:
            raise ValueError(f"--routed_scaling_factor must be > 0, not {self.routed_scaling_factor!r}")
        if self.router == "softmax":
            wanted = dict(router_bias_update=0.0, n_group=1, topk_group=1, routed_scaling_factor=1.0)
            for name, value in wanted.items():
                if getattr(self, name) != value:
                    raise ValueError(f"--{name} belongs to the DeepSeek router: add --router deepseek")
            return
        if not isinstance(self.n_group, int) or self.n_group < 1 or self.num_experts % self.n_group:
            raise ValueError(f"--n_group must divide --num_experts {self.num_experts}, not {self.n_group!r}")
        if not isinstance(self.topk_group, int) or not 1 <= self.topk_group <= self.n_group:
            raise ValueError(f"--topk_group must be between 1 and --n_group {self.n_group}, not {self.topk_group!r}")
        if self.topk_group * (self.num_experts // self.n_group) < self.top_k:
            raise ValueError(f"--topk_group {self.topk_group} groups of {self.num_experts // self.n_group} experts "
                             f"hold fewer than --top_k {self.top_k} experts; raise --topk_group")

    @classmethod
    def of_run(cls, config) -> "MoEConfig":
        """The MoE layers' configuration of a run's options (a resolved ``project/run_moe.py`` configuration:
        ``--num_experts``, ``--top_k``, ... ``--routed_scaling_factor``). Raises the ValueErrors above."""
        return cls(num_experts=config.num_experts, top_k=config.top_k, capacity_factor=config.capacity_factor,
                   normalize_gates=False if config.no_normalize_gates else None, aux_loss_coef=config.aux_loss_coef,
                   z_loss_coef=config.z_loss_coef, router=config.router, shared_experts=config.shared_experts,
                   router_bias_update=config.router_bias_update, n_group=config.n_group, topk_group=config.topk_group,
                   routed_scaling_factor=config.routed_scaling_factor)

    def check(self, ep: int) -> "MoEConfig":
        """Check that the experts can be shared out over ``ep`` expert-parallel ranks.

        Raises:
            ValueError: ``num_experts`` not divisible by ``ep``.
        """
        if ep < 1 or self.num_experts % ep:
            raise ValueError(f"--num_experts {self.num_experts} is not divisible by --ep {ep} (every expert-parallel "
                             f"rank holds the same number of experts); choose --ep in "
                             f"{[e for e in range(1, self.num_experts + 1) if self.num_experts % e == 0]}")
        return self
