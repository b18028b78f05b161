"""The model on the mesh: the sizes one rank works with, and the blocks and parameters of each pipeline stage.

:func:`sizes` turns a configuration into the per-rank sizes every other part of the planner uses (a
:class:`Sizes`); :func:`stage_layout` says which blocks a pipeline stage holds and how many parameters one of its
tensor-parallel ranks keeps (Megatron-LM's split: Shoeybi et al. 2019, Sec. 3 — the QKV and first MLP matrices by
columns, the output projections by rows, the vocabulary by rows; biases of the row-parallel layers and the norms
replicated).
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Sizes:
    """Per-rank sizes of one micro-batch (elements; bytes where named).

    Attributes:
        L: blocks of the model. h: width. a: query heads. kv: key/value heads. d: head width. f: MLP width.
        V: vocabulary padded to a multiple of tp. P: positions of a learned position table (0: rotary).
        S: tokens per sequence. s: tokens per context-parallel rank (``S / cp``). b: sequences per micro-batch.
        t: tensor-parallel ranks. a_t, kv_t, f_t, V_t: heads, key/value heads (at least one: Megatron-LM
        replicates them when tp exceeds them), MLP width and vocabulary on one tp rank.
        e: bytes per activation (4 in fp32, 2 in bf16). mask: bytes per dropout-mask element (1-byte booleans on
        GPUs; the CPU keeps the scaled noise, an element).
    """

    L: int
    h: int
    a: int
    kv: int
    d: int
    f: int
    V: int
    P: int
    S: int
    s: int
    b: int
    t: int
    e: int
    mask: int

    @property
    def a_t(self) -> int:
        return self.a // self.t

    @property
    def kv_t(self) -> int:
        return max(1, self.kv // self.t)

    @property
    def f_t(self) -> int:
        return self.f // self.t

    @property
    def V_t(self) -> int:
        return self.V // self.t

    @property
    def tokens(self) -> int:
        """Tokens of one micro-batch on one rank: ``b s``."""
        return self.b * self.s


def sizes(config) -> Sizes:
    """The :class:`Sizes` of ``config`` (a :class:`project.planner.cli.PlanConfig`)."""
    model, t = config.model, config.tp
    e = 4 if config.precision == "fp32" else 2
    return Sizes(L=model.n_layer, h=model.n_embd, a=model.n_head, kv=model.n_kv_head, d=model.head_dim,
                 f=model.n_inner, V=-(-config.vocab_size // t) * t,
                 P=config.model_max_length if model.positions == "learned" else 0, S=config.model_max_length,
                 s=config.model_max_length // config.cp, b=config.batch_size // (config.dp * config.micro_batches),
                 t=t, e=e, mask=e if config.hardware == "cpu" else 1)


@dataclass(frozen=True)
class StageLayout:
    """What one tensor-parallel rank of a pipeline stage holds.

    Attributes:
        blocks: transformer blocks of the stage. moe_blocks: of which mixture-of-experts blocks.
        dense_params: parameters sharded over dp x cp by ZeRO (everything but the experts).
        expert_params: the experts this rank holds (sharded over the dp x cp ranks holding a replica).
        block_params: one dense block's parameters on this rank.
        embedding, head: whether the stage holds the token embedding, the LM head.
    """

    blocks: int
    moe_blocks: int
    dense_params: float
    expert_params: float
    block_params: float
    embedding: bool
    head: bool


def block_params_on_rank(config) -> tuple[float, float]:
    """``(attention and norms, MLP)`` parameters of one dense block on one tp rank."""
    model, z = config.model, sizes(config)
    h, t = z.h, z.t
    kv_rank = z.kv_t * z.d                                          # this rank's key (and value) width
    attention = h * (h // t + 2 * kv_rank) + h * h / t + 2 * model.norm_params
    mlp = (3 if model.mlp == "swiglu" else 2) * h * z.f_t
    if model.bias:
        attention += h // t + 2 * kv_rank + h                       # column-parallel biases split; the output's whole
        mlp += (2 if model.mlp == "swiglu" else 1) * z.f_t + h
    return attention, mlp


def stage_layout(config, stage: int) -> StageLayout:
    """Blocks (dense and MoE) of pipeline stage ``stage`` (:func:`three_d.stage.stage_blocks`: the course's split,
    the embedding's and head's stages one block lighter) and the parameters one of its tp ranks holds."""
    from moe.gpt2 import moe_block_indices
    from three_d.stage import stage_blocks

    model, z = config.model, sizes(config)
    h, t = z.h, z.t
    blocks = list(stage_blocks(z.L, stage, config.pp))
    moe = set(moe_block_indices(z.L, config.moe_every)) if config.num_experts > 1 else set()
    n_moe = sum(1 for i in blocks if i in moe)
    attention, mlp = block_params_on_rank(config)
    dense = len(blocks) * attention + (len(blocks) - n_moe) * mlp + n_moe * h * config.num_experts  # routers
    expert = (3 if model.mlp == "swiglu" else 2) * h * z.f + ((z.f + h) if model.bias else 0)
    experts = n_moe * config.num_experts // config.ep * expert
    first, last = stage == 0, stage == config.pp - 1
    if first:
        dense += z.V * h / t + z.P * h
    if last:
        dense += model.norm_params + (z.V * h / t if config.pp > 1 or not model.tied else 0)
    return StageLayout(blocks=len(blocks), moe_blocks=n_moe, dense_params=dense, expert_params=experts,
                       block_params=attention + mlp, embedding=first, head=last)


def pipeline_actions(config) -> list[list[tuple]]:
    """Every stage's action list (``pipeline.SCHEDULES``); with one stage, gradient accumulation: each
    micro-batch's forward then its backward."""
    from pipeline.schedules import all_actions

    if config.pp == 1:
        return [[a for i in range(config.micro_batches) for a in (("F", i), ("B", i))]]
    return all_actions(config.schedule, config.pp, config.micro_batches, config.virtual_stages)
