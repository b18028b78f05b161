"""GPT-2 cut into per-process stages for the multi-process pipeline (:mod:`pipeline.stage_runner`).

Every rank builds the same full GPT-2 (same seed) and keeps the layers of its stage
(:func:`gpt2_stage`), balanced as in :func:`pipeline.gpt2.gpt2_balance`: the embeddings go
with the first blocks on stage 0, the final norm and LM head with the last blocks on
stage p - 1.

The LM head's weight is tied to the token embedding, which lives on stage 0. As in
Megatron-LM, the last stage keeps its own copy of it, and the two copies' gradients are
summed between the first and the last stage before every optimizer step, in the embedding
group of the run's mesh (:class:`TiedGradients`), so both copies stay equal and the update
is the one of the tied model (Shoeybi et al. 2019; Narayanan et al. 2021, Sec. 4.1 note on
shared embeddings).
"""
from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from pipeline.gpt2 import GPT2Head, gpt2_balance, gpt2_layers


def gpt2_stage(model, stage: int, n_stages: int,
               balance: list[int] | None = None) -> tuple[nn.Sequential, nn.Parameter | None]:
    """The layers of ``model`` (a ``GPT2LMHeadModel``) that stage ``stage`` of ``n_stages`` runs.

    ``balance``: layers of :func:`pipeline.gpt2.gpt2_layers` per stage (e.g. from
    :func:`pipeline.gpt2.gpt2_measured_balance`); default :func:`pipeline.gpt2.gpt2_balance`.

    Returns:
        ``(layers, tied)``: the layers map input_ids (batch, seq) [stage 0] or the hidden
        state (batch, seq, n_embd) to the hidden state or, on the last stage, to logits
        (batch, seq, vocab). ``tied`` is this stage's copy of the tied embedding/head
        weight (first and last stage of a pipeline with several stages), else None.

    Raises:
        ValueError: more stages than transformer blocks; a ``balance`` without ``n_stages``
            entries >= 1 summing to the number of layers.
    """
    layers = list(gpt2_layers(model))
    if balance is None:
        balance = gpt2_balance(model.config.n_layer, n_stages)
    if len(balance) != n_stages or sum(balance) != len(layers) or min(balance) < 1:
        raise ValueError(f"balance {balance} must give {n_stages} stages >= 1 layer each, {len(layers)} layers in all")
    start = sum(balance[:stage])
    mine = nn.Sequential(*layers[start:start + balance[stage]])
    tied = None
    head = layers[-1]
    if n_stages > 1 and isinstance(head, GPT2Head) and head.weight is None:  # the head shares wte's weight
        if stage == 0:
            tied = layers[0].wte.weight
        elif stage == n_stages - 1:
            tied = head.untie()
    return mine, tied



def gpt2_chunks(model, stage: int, n_stages: int, virtual_stages: int,
                balance: list[int] | None = None,
                placement: str = "loop") -> tuple[list[nn.Sequential], nn.Parameter | None]:
    """The ``virtual_stages`` model chunks of rank ``stage`` for interleaved 1F1B (Narayanan et al. 2021, Sec. 2.2.2).

    The chain :func:`pipeline.gpt2.gpt2_layers` is cut into ``v * p`` contiguous virtual
    stages (``balance``: layers per virtual stage, default :func:`pipeline.gpt2.gpt2_balance`);
    chunk ``c`` of this rank is virtual stage ``c * p + stage``. The first virtual stage
    (rank 0, chunk 0) holds the embeddings, the last (rank p - 1, chunk v - 1) the final
    norm and LM head; with ``p > 1`` the head gets its own copy of the tied weight, as in
    :func:`gpt2_stage`.

    ``placement="v"`` (ZB-V, DualPipeV; :func:`pipeline.placement.stage_of`): ``v = 2`` and chunk ``c`` is
    virtual stage ``r`` (c = 0) or ``2p - 1 - r`` (c = 1): rank 0 holds the embeddings *and* the head, which
    then keep sharing one weight, registered in both chunks (no copy, ``tied`` is None on every rank).

    Returns:
        ``(chunks, tied)``: this rank's ``v`` ``nn.Sequential`` chunks and its copy of the
        tied weight (vocab, n_embd) or None.

    Raises:
        ValueError: ``virtual_stages`` < 1; more virtual stages than transformer blocks; a
            ``balance`` that does not have ``v * p`` positive entries summing to the layers.
    """
    from pipeline.placement import rank_of, stage_of

    if virtual_stages < 1:
        raise ValueError(f"need at least one chunk per rank, got {virtual_stages}")
    if placement == "v" and virtual_stages != 2:
        raise ValueError(f"the V placement holds two chunks per rank, got virtual_stages={virtual_stages}")
    layers = list(gpt2_layers(model))
    total_stages = virtual_stages * n_stages
    if balance is None:
        balance = gpt2_balance(model.config.n_layer, total_stages)
    if len(balance) != total_stages or sum(balance) != len(layers) or min(balance) < 1:
        raise ValueError(f"balance {balance} must give {total_stages} virtual stages >= 1 layer each, "
                         f"{len(layers)} layers in all")
    starts = [sum(balance[:k]) for k in range(total_stages)]
    chunks = [nn.Sequential(*layers[starts[v]:starts[v] + balance[v]])
              for v in (stage_of(stage, c, n_stages, placement) for c in range(virtual_stages))]
    tied = None
    head = layers[-1]
    if placement == "v" and stage == 0 and isinstance(head, GPT2Head) and head.weight is None:
        # rank 0 holds the embeddings (chunk 0) and the head (chunk 1): the head registers the one tied weight as
        # its own parameter too, so that a split backward's W of chunk 1 (over chunk 1's parameters) takes the
        # head's share of its gradient; the rank's optimizer sees it once (parameters are deduplicated)
        head.weight, head._tied_head = head.head_weight(), None
    if rank_of(total_stages - 1, n_stages, placement) != 0 and isinstance(head, GPT2Head) and head.weight is None:
        if stage == 0:
            tied = layers[0].wte.weight
        elif stage == n_stages - 1:
            tied = head.untie()
    return chunks, tied

class TiedGradients:
    """Sums the tied embedding/head gradient between the first and the last stage.

    Args:
        group: the embedding group of the run's mesh (:attr:`course.mesh.Mesh.embedding_group`):
            this pipeline's first and last stage; None on the other stages and without
            pipeline parallelism (then calling it does nothing).

    Call it after the backward of every step, on every rank.
    """

    def __init__(self, group):
        self.group = group

    def __call__(self, tied: nn.Parameter | None) -> None:
        """Replace ``tied.grad`` (this stage's copy of the tied weight, (vocab, n_embd)) by the sum of
        the first and the last stage's gradients, in place; a missing gradient counts as zeros.
        Does nothing without a group or without a tied copy on this stage."""
        if self.group is None or tied is None:
            return
        # BEGIN ASSIGN5_2_3
        if tied.grad is None:
            tied.grad = torch.zeros_like(tied)
        dist.all_reduce(tied.grad, op=dist.ReduceOp.SUM, group=self.group)
        # END ASSIGN5_2_3


def named_stage_parameters(model, stage: nn.Module) -> dict[str, torch.Tensor]:
    """``{name in model: tensor}`` for the parameters of ``stage`` that belong to ``model``
    (the last rank's untied head copy is left out: rank 0 has the original)."""
    ids = {id(p) for p in stage.parameters()}
    return {name: p.detach() for name, p in model.named_parameters() if id(p) in ids}
