"""The experts of one MoE layer, stored as stacked weights: expert e is slice e of every parameter.

Every parameter has the experts along dimension 0, so a rank's share of the experts under expert
parallelism is a slice (:meth:`GroupedExperts.shard`), and the experts of all ranks are the
concatenation of their slices in ep-rank order (:meth:`GroupedExperts.gather`). The forward pass
takes the tokens already grouped by expert — ``counts[e]`` consecutive rows for expert e — and
runs each expert on its rows, one matrix product per expert (a "grouped GEMM" done as a loop;
Gale et al. 2023, MegaBlocks, do it in one kernel). An expert with no rows still runs, on an
empty matrix: its parameters then get a zero gradient, not none, and the output stays connected
to the input, so the backward pass reaches every collective on every rank.

Two kinds:

* :class:`MLPExperts` — GPT-2's MLP per expert: ``c_proj(gelu(c_fc(x)))`` with biases, width f.
* :class:`GatedExperts` — Mixtral's SwiGLU experts (Jiang et al. 2024; Shazeer 2020):
  ``down(silu(gate(x)) * up(x))`` without biases, laid out like ``transformers``'
  ``MixtralExperts`` (``gate_up_proj`` (E, 2f, h), ``down_proj`` (E, h, f)).
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from course.collectives import all_gather


class GroupedExperts(nn.Module):
    """Base class: ``num_experts`` experts whose parameters are stacked along dimension 0.

    Shapes: ``forward(tokens, counts)``: tokens (N, h) grouped by expert, counts (num_experts,)
    ints summing to N -> (N, h).

    Raises:
        ValueError: counts that do not sum to the number of rows, or name more experts than held.
    """

    def __init__(self, num_experts: int):
        super().__init__()
        self.num_experts = num_experts

    def expert(self, e: int, x: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def forward(self, tokens: torch.Tensor, counts) -> torch.Tensor:
        counts = counts.tolist() if torch.is_tensor(counts) else list(counts)
        if len(counts) != self.num_experts or sum(counts) != tokens.shape[0]:
            raise ValueError(f"counts {counts} do not split {tokens.shape[0]} rows over {self.num_experts} experts")
        chunks = torch.split(tokens, counts, dim=0)
        return torch.cat([self.expert(e, chunk) for e, chunk in enumerate(chunks)], dim=0)

    def shard(self, rank: int, world: int) -> "GroupedExperts":
        """Experts ``[rank * E/world, (rank + 1) * E/world)`` as a new module of the same kind (copies).

        Raises:
            ValueError: ``num_experts`` not divisible by ``world``.
        """
        if self.num_experts % world:
            raise ValueError(f"{self.num_experts} experts cannot be shared out over {world} ranks")
        per = self.num_experts // world
        out = self._empty(per)
        with torch.no_grad():
            for name, p in self.named_parameters():
                getattr(out, name).copy_(p[rank * per:(rank + 1) * per])
        return out

    def gather(self, group) -> "GroupedExperts":
        """Every rank's experts of ``group``, concatenated in group-rank order, as a new module (copies;
        a collective in ``group``)."""
        gathered = {name: all_gather(p.detach(), 0, group=group) for name, p in self.named_parameters()}
        out = self._empty(next(iter(gathered.values())).shape[0])
        with torch.no_grad():
            for name, value in gathered.items():
                getattr(out, name).copy_(value)
        return out

    def _empty(self, num_experts: int) -> "GroupedExperts":
        raise NotImplementedError


class MLPExperts(GroupedExperts):
    """GPT-2 MLPs (``c_fc``: h -> f, tanh-GELU, ``c_proj``: f -> h, with biases), one per expert.

    Initialised as GPT-2 initialises its MLP (Radford et al. 2019): weights normal with std 0.02,
    ``c_proj``'s divided by ``sqrt(2 n_layer)``, biases zero; ``generator`` makes it repeatable.

    Parameters: ``c_fc_weight`` (E, h, f), ``c_fc_bias`` (E, f), ``c_proj_weight`` (E, f, h),
    ``c_proj_bias`` (E, h) (``x @ weight``, GPT-2's ``Conv1D`` layout).
    """

    def __init__(self, num_experts: int, hidden_size: int, inner_size: int, n_layer: int = 1,
                 generator: torch.Generator | None = None, device=None, dtype=None):
        super().__init__(num_experts)
        self.hidden_size, self.inner_size, self.n_layer = hidden_size, inner_size, n_layer
        self.c_fc_weight = nn.Parameter(torch.empty(num_experts, hidden_size, inner_size, device=device, dtype=dtype))
        self.c_fc_bias = nn.Parameter(torch.zeros(num_experts, inner_size, device=device, dtype=dtype))
        self.c_proj_weight = nn.Parameter(torch.empty(num_experts, inner_size, hidden_size, device=device, dtype=dtype))
        self.c_proj_bias = nn.Parameter(torch.zeros(num_experts, hidden_size, device=device, dtype=dtype))
        with torch.no_grad():  # drawn on the host from a host generator (the same numbers on every device), copied in
            self.c_fc_weight.copy_(torch.randn(self.c_fc_weight.shape, generator=generator, device="cpu") * 0.02)
            self.c_proj_weight.copy_(torch.randn(self.c_proj_weight.shape, generator=generator, device="cpu")
                                     * (0.02 / math.sqrt(2 * n_layer)))

    def expert(self, e: int, x: torch.Tensor) -> torch.Tensor:
        h = F.gelu(x @ self.c_fc_weight[e] + self.c_fc_bias[e], approximate="tanh")
        return h @ self.c_proj_weight[e] + self.c_proj_bias[e]

    def _empty(self, num_experts: int) -> "MLPExperts":
        p = self.c_fc_weight
        return MLPExperts(num_experts, self.hidden_size, self.inner_size, self.n_layer, generator=torch.Generator(),
                          device=p.device, dtype=p.dtype)  # overwritten; leaves the global generator alone


class GatedExperts(GroupedExperts):
    """Mixtral's experts: ``down_proj[e] (silu(gate) * up)`` with ``gate, up = gate_up_proj[e] x``, no biases.

    Parameters: ``gate_up_proj`` (E, 2f, h), ``down_proj`` (E, h, f) (``nn.Linear`` layout, as in
    ``transformers``' ``MixtralExperts``). Initialised normal with std 0.02.
    """

    def __init__(self, num_experts: int, hidden_size: int, inner_size: int,
                 generator: torch.Generator | None = None, device=None, dtype=None):
        super().__init__(num_experts)
        self.hidden_size, self.inner_size = hidden_size, inner_size
        self.gate_up_proj = nn.Parameter(torch.empty(num_experts, 2 * inner_size, hidden_size, device=device,
                                                     dtype=dtype))
        self.down_proj = nn.Parameter(torch.empty(num_experts, hidden_size, inner_size, device=device, dtype=dtype))
        with torch.no_grad():  # drawn on the host from a host generator, copied in
            for p in (self.gate_up_proj, self.down_proj):
                p.copy_(torch.randn(p.shape, generator=generator, device="cpu") * 0.02)

    def expert(self, e: int, x: torch.Tensor) -> torch.Tensor:
        gate, up = F.linear(x, self.gate_up_proj[e]).chunk(2, dim=-1)
        return F.linear(F.silu(gate) * up, self.down_proj[e])

    def _empty(self, num_experts: int) -> "GatedExperts":
        p = self.down_proj
        return GatedExperts(num_experts, self.hidden_size, self.inner_size, generator=torch.Generator(), device=p.device,
                            dtype=p.dtype)  # overwritten; leaves the global generator alone
