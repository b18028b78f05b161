"""Assignment 5.6.2: a pipeline stage whose GPT-2 blocks are tensor parallel over the stage's tp group.

In a ``dp x pp x tp`` mesh, the ``tp`` ranks of one stage (one tp group of the mesh) hold
that stage's layers, each rank its shards, exactly as :class:`tensor_parallel.TensorParallelGPT2`
splits the whole model: attention by heads and the MLP column- then row-parallel
(2 all-reduces forward and 2 backward per block, in the tp group), the token embedding
vocabulary-parallel on the first stage. The last stage keeps its own copy of its tp
rank's vocabulary shard of the tied embedding as the LM head (its gradient is summed with
the first stage's in the embedding group, :mod:`three_d.step`).

Between stages, every tp rank of stage s talks to **the same tp rank** of stage s + 1 (its
neighbour in its pp group, so the pipeline's :class:`pipeline.StageRunner` addresses it). The
activation is replicated over the tp ranks, so it travels in one of two ways:

* ``scatter_gather=False``: every tp rank sends the whole (micro_batch, seq, n_embd)
  activation: tp copies of the same bytes cross between the stages.
* ``scatter_gather=True`` (Narayanan et al. 2021, Sec. 4.1, "scatter/gather communication
  optimization"): each tp rank sends only its 1/tp slice of the last dimension, and the
  next stage puts the slices together with one all-gather in its tp group (on a cluster:
  inside the node, where bandwidth is plentiful). Backward, the gradient slices go back the
  same way and are all-gathered on the sending stage.

Per micro-batch and stage boundary each rank sends ``b*s*h`` elements forward (and as many
backward) without the optimisation, ``b*s*h / tp`` with it, plus an all-gather of
``b*s*h`` in the tp group of the receiving side.

Sources: Narayanan et al. 2021 (Megatron-LM "PTD-P", Sec. 3 and 4.1); Shoeybi et al. 2019.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

import pipeline
import tensor_parallel
from course.collectives import group_size


def stage_blocks(n_layer: int, stage: int, n_stages: int) -> range:
    """The transformer blocks of stage ``stage`` of ``n_stages`` (the split of ``pipeline.gpt2_balance``:
    embeddings count as one layer of the first stage, the head as one of the last).

    Raises:
        ValueError: more stages than blocks.
    """
    balance = pipeline.gpt2_balance(n_layer, n_stages)
    start = sum(balance[:stage]) - (1 if stage > 0 else 0)
    n_blocks = balance[stage] - (stage == 0) - (stage == n_stages - 1)
    return range(start, start + n_blocks)


class TensorParallelStage(nn.Module):
    """Stage ``stage`` of ``n_stages`` of a GPT-2, its layers tensor parallel over ``group``.

    Args:
        hf_model: the single-device ``GPT2LMHeadModel`` (eager attention, the same on every rank).
        stage, n_stages: this rank's stage (its pp rank) and the number of stages.
        group: the stage's tensor-parallel group (the mesh's ``tp`` group); None: the world.
        scatter_gather: send 1/tp of each activation and all-gather it in ``group`` (see module doc).

    Forward: first stage: input_ids (micro_batch, seq) (int64); other stages: the hidden state
    received from stage - 1, (micro_batch, seq, n_embd), or (micro_batch, seq, n_embd / tp)
    with ``scatter_gather``. Returns the hidden state for stage + 1 (same shapes), or on the
    last stage this rank's vocabulary slice of the logits (micro_batch, seq, padded_vocab / tp).
    Attention is causal (no padding mask: padded positions carry label -100).

    Parameter names are those of :class:`tensor_parallel.TensorParallelGPT2` (``wte.weight``,
    ``h.<global block index>. ...``, ``ln_f.*``); the last stage's copy of the tied weight is
    ``lm_head.weight`` (with one stage the head uses ``wte.weight`` itself).

    Raises:
        ValueError: heads or MLP width not divisible by tp; more stages than blocks.
    """

    def __init__(self, hf_model, stage: int, n_stages: int, group=None, scatter_gather: bool = False):
        super().__init__()
        config = hf_model.config
        self.stage, self.n_stages, self.group = stage, n_stages, group
        self.is_first, self.is_last = stage == 0, stage == n_stages - 1
        self.scatter_gather = scatter_gather
        self.blocks = stage_blocks(config.n_layer, stage, n_stages)
        full = tensor_parallel.TensorParallelGPT2(hf_model, group=group)
        self.__dict__["full_model"] = full  # not a submodule: its other stages' layers are not this stage's
        self.tp, self.vocab_size, self.padded_vocab_size = full.tp, full.vocab_size, full.padded_vocab_size
        if self.is_first:
            self.wte, self.wpe, self.drop = full.wte, full.wpe, full.drop
        self.h = nn.ModuleDict({str(i): full.h[i] for i in self.blocks})
        self.lm_head = None
        if self.is_last:
            self.ln_f = full.ln_f
            if not self.is_first:  # own copy of the tied weight; its gradient is summed with the first stage's
                self.lm_head = nn.Linear(config.n_embd, full.wte.weight.size(0), bias=False)
                self.lm_head.weight = nn.Parameter(full.wte.weight.detach().clone())
            self.vocab_start, self.vocab_end = full.wte.vocab_start, full.wte.vocab_end

    @property
    def tied(self) -> nn.Parameter | None:
        """This stage's copy of the tied embedding/head weight (vocab / tp, n_embd): first and
        last stage of a pipeline with several stages; None elsewhere and with one stage."""
        if self.n_stages == 1:
            return None
        if self.is_first:
            return self.wte.weight
        return self.lm_head.weight if self.is_last else None

    def head_weight(self) -> torch.Tensor:
        return self.wte.weight if self.lm_head is None else self.lm_head.weight

    def sharded_parameters(self) -> set[int]:
        """``id``s of the parameters split over the tp ranks (each rank holds a different shard):
        column-parallel weights and biases, row-parallel weights, the vocabulary-parallel
        embedding and head. All other parameters (layer norms, position embedding, row-parallel
        biases) are replicated: the same on every tp rank."""
        ids = set()
        for module in self.modules():
            if isinstance(module, tensor_parallel.ColumnParallelLinear):
                ids.update(id(p) for p in module.parameters())
            elif isinstance(module, tensor_parallel.RowParallelLinear):
                ids.add(id(module.weight))
            elif isinstance(module, tensor_parallel.VocabParallelEmbedding):
                ids.add(id(module.weight))
        if self.lm_head is not None:
            ids.add(id(self.lm_head.weight))
        return ids

    def _mask_padding(self, logits: torch.Tensor) -> torch.Tensor:
        if self.padded_vocab_size == self.vocab_size:
            return logits
        ids = torch.arange(self.vocab_start, self.vocab_end, device=logits.device)
        return logits.masked_fill(ids >= self.vocab_size, torch.finfo(logits.dtype).min)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # BEGIN ASSIGN5_6_2
        if self.is_first:
            positions = torch.arange(x.size(1), device=x.device)[None]
            h = self.drop(self.wte(x) + self.wpe(positions))
        elif self.scatter_gather:
            h = tensor_parallel.gather_from_tensor_parallel_region(x, self.group)
        else:
            h = x
        bias = tensor_parallel.attention_bias(None, h.size(0), h.size(1), h.dtype, h.device)
        for block in self.h.values():
            h = block(h, bias)
        if self.is_last:
            h = tensor_parallel.copy_to_tensor_parallel_region(self.ln_f(h), self.group)
            return self._mask_padding(F.linear(h, self.head_weight()))
        if self.scatter_gather:
            h = tensor_parallel.scatter_to_tensor_parallel_region(h, self.group)
        return h
        # END ASSIGN5_6_2


class StageLoss:
    """The last stage's ``loss_fn(logits, target)`` for :class:`pipeline.StageRunner`: the
    vocabulary-parallel next-token cross-entropy summed over the micro-batch's counted
    tokens, divided by ``target = (labels, denominator)``'s denominator (so the
    micro-batch losses of a batch add up to its mean token loss)."""

    def __init__(self, group=None):
        self.group = group

    def __call__(self, logits: torch.Tensor, target) -> torch.Tensor:
        labels, denominator = target
        return tensor_parallel.vocab_parallel_lm_loss(logits, labels, reduction="sum", group=self.group) / denominator


def activation_bytes(micro_batch: int, seq: int, n_embd: int, element_size: int, tp: int,
                     scatter_gather: bool) -> int:
    """Bytes one rank sends per micro-batch across a stage boundary in one direction."""
    full = micro_batch * seq * n_embd * element_size
    return full // tp if scatter_gather else full


