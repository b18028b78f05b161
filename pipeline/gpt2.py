"""GPT-2 prepared for pipelining: the model as one ``nn.Sequential`` of stage-able layers.

``transformers.GPT2LMHeadModel`` is not a chain of layers: its forward builds the position
ids and the causal attention mask once and passes them to every block. To pipeline it,
every layer of the chain must take the hidden state (batch, seq, n_embd) alone and
return it alone:

* :class:`GPT2Embeddings` — token + position embeddings and dropout (first stage),
* :class:`GPT2BlockLayer` — one transformer block, which builds its own causal mask
  and reduces the block's output (a tuple in some ``transformers`` versions) to the
  hidden state,
* :class:`GPT2Head` — final layer norm and the language-model head (last stage). The
  head's weight is tied to the token embedding (Radford et al. 2019); the head reads
  the embedding's weight and copies it to its own device, so autograd sums both
  gradients into the one shared parameter.

The padding mask is not needed: the course pads on the right, and under causal
attention a real token never attends to the padding after it, so logits at real
positions are the same with or without it.

Source: Huang et al. 2019, GPipe, Sec. 2 (a network as a sequence of layers);
Radford et al. 2019 (GPT-2).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from pipeline.partition import balanced_sizes
from pipeline.pipe import Pipe


def causal_mask(seq_len: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """Additive causal mask (1, 1, seq, seq): 0 where query t may see key s <= t, the dtype's minimum elsewhere."""
    blocked = torch.ones(seq_len, seq_len, dtype=torch.bool, device=device).triu(1)
    mask = torch.zeros(seq_len, seq_len, dtype=dtype, device=device)
    return mask.masked_fill(blocked, torch.finfo(dtype).min)[None, None]


class GPT2Embeddings(nn.Module):
    """input_ids (batch, seq) -> hidden (batch, seq, n_embd): ``drop(wte(ids) + wpe(positions))``."""

    def __init__(self, wte: nn.Embedding, wpe: nn.Embedding, drop: nn.Dropout):
        super().__init__()
        self.wte, self.wpe, self.drop = wte, wpe, drop

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(input_ids.shape[1], device=input_ids.device)[None]
        return self.drop(self.wte(input_ids) + self.wpe(positions))


class GPT2BlockLayer(nn.Module):
    """One ``GPT2Block`` as a chain layer: hidden (batch, seq, n_embd) -> hidden (batch, seq, n_embd)."""

    def __init__(self, block: nn.Module):
        super().__init__()
        self.block = block

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        # BEGIN ASSIGN5_2_3
        mask = causal_mask(hidden.shape[1], hidden.dtype, hidden.device)
        out = self.block(hidden, attention_mask=mask)
        return out[0] if isinstance(out, tuple) else out
        # END ASSIGN5_2_3


class GPT2Head(nn.Module):
    """hidden (batch, seq, n_embd) -> logits (batch, seq, vocab): ``ln_f`` then the LM head.

    Args:
        ln_f: the final layer norm.
        lm_head: the ``nn.Linear`` head (bias-free). If its weight is the token
            embedding's (tied), the head does not register it as its own parameter
            (it stays with the embedding, on the first stage) and copies it to the
            hidden state's device at every call; see :meth:`untie` for stages in
            different processes.
        tied: whether ``lm_head.weight`` is the token embedding's weight.
    """

    def __init__(self, ln_f: nn.LayerNorm, lm_head: nn.Linear, tied: bool):
        super().__init__()
        self.ln_f = ln_f
        if tied:
            self._tied_head = [lm_head]  # a list hides it from .parameters() and .to()
            self.weight = None
        else:
            self._tied_head = None
            self.weight = lm_head.weight

    def head_weight(self) -> torch.Tensor:
        return self._tied_head[0].weight if self._tied_head is not None else self.weight

    def untie(self) -> nn.Parameter:
        """Give the head its own copy of the tied weight (for a last stage in another process).

        The two copies stay equal if their gradients are summed before each optimizer step
        (:class:`pipeline.gpt2_stages.TiedGradients`). Returns the new parameter.
        """
        if self._tied_head is not None:
            self.weight = nn.Parameter(self._tied_head[0].weight.detach().clone())
            self._tied_head = None
        return self.weight

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        hidden = self.ln_f(hidden)
        return F.linear(hidden, self.head_weight().to(hidden.device))


def gpt2_layers(model) -> nn.Sequential:
    """A ``GPT2LMHeadModel`` as a chain: ``[GPT2Embeddings, GPT2BlockLayer x n_layer, GPT2Head]``.

    The layers share their parameters with ``model``. Maps input_ids (batch, seq) to
    logits (batch, seq, vocab), equal to ``model(input_ids).logits``.
    """
    t = model.transformer
    tied = model.lm_head.weight is t.wte.weight
    # BEGIN ASSIGN5_2_3
    layers = [GPT2Embeddings(t.wte, t.wpe, t.drop)]
    layers += [GPT2BlockLayer(block) for block in t.h]
    layers.append(GPT2Head(t.ln_f, model.lm_head, tied))
    # END ASSIGN5_2_3
    return nn.Sequential(*layers)


def gpt2_balance(n_layer: int, n_stages: int) -> list[int]:
    """Chain layers per stage: the blocks spread evenly, plus the embeddings on the first
    stage and the head on the last, e.g. (4 blocks, 2 stages) -> [3, 3].

    Raises:
        ValueError: ``n_stages`` < 1 or more stages than transformer blocks.
    """
    if n_stages > n_layer:
        raise ValueError(f"{n_stages} pipeline stages need at least {n_stages} transformer blocks, but the model "
                         f"has {n_layer}; use --n_stages <= {n_layer} or a bigger --preset")
    balance = balanced_sizes(n_layer, n_stages)
    balance[0] += 1
    balance[-1] += 1
    return balance


def stage_devices(device_type: str, n_stages: int) -> list[torch.device]:
    """One device per stage: ``cuda:0 .. cuda:{n-1}`` (cycling if fewer GPUs), or ``cpu`` for every stage."""
    if device_type == "cuda":
        count = torch.cuda.device_count()
        return [torch.device("cuda", s % count) for s in range(n_stages)]
    return [torch.device("cpu")] * n_stages


class GPT2Pipeline(nn.Module):
    """A ``GPT2LMHeadModel`` run through :class:`pipeline.pipe.Pipe`.

    Args:
        model: the GPT-2 (its parameters are shared, and moved to the stage devices).
        n_stages: number of pipeline stages (<= n_layer).
        split_size: micro-batch size (rows).
        devices: device of each stage (default: ``cpu`` for every stage).

    Shapes:
        ``forward(input_ids)``: (batch, seq) -> logits (batch, seq, vocab) on the last stage's device.
    """

    def __init__(self, model, n_stages: int, split_size: int, devices: list | None = None):
        super().__init__()
        devices = list(devices) if devices is not None else stage_devices("cpu", n_stages)
        if len(devices) != n_stages:
            raise ValueError(f"{n_stages} stages but {len(devices)} devices")
        self.config = model.config
        self.pipe = Pipe(gpt2_layers(model), split_size, devices=devices,
                         balance=gpt2_balance(model.config.n_layer, n_stages))

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        """Logits (batch, seq, vocab); ``attention_mask`` is accepted and not needed (right padding)."""
        return self.pipe(input_ids)


def gpt2_measured_balance(model, n_stages: int, sample_input_ids: torch.Tensor,
                          repeats: int = 3, group=None) -> tuple[list[int], list[float]]:
    """Layers per stage for ``n_stages`` stages of :func:`gpt2_layers` from measured costs (``--balance auto``).

    Each layer's forward + backward is timed on ``sample_input_ids`` (batch, seq) — a
    micro-batch of the run — on the model's device
    (:func:`pipeline.partition.measure_layer_costs`); the last layer's cost is the final
    layer norm, the LM head and the loss (cross-entropy over the vocabulary), which on a
    small model can cost several transformer blocks. Then the chain is cut into contiguous
    stages minimising the slowest stage (:func:`pipeline.partition.linear_partition`).
    The model's gradients are cleared afterwards.

    With ``group`` (the pipeline's process group; collective: every rank of it calls), every
    rank measures at the same time — so the machine is as busy as it will be in the run:
    a memory-bound layer such as the LM head costs more when the other ranks compete for
    the caches and memory than when it runs alone — and every rank gets the partition of
    the per-layer medians over the ranks.

    Returns:
        ``(balance, costs)``: layers per stage and the measured seconds per layer.

    Raises:
        ValueError: more stages than layers of the chain.
    """
    import statistics

    import torch.distributed as dist

    from pipeline.partition import linear_partition, measure_layer_costs

    layers = gpt2_layers(model)
    vocab = model.config.vocab_size
    targets = torch.zeros_like(sample_input_ids)

    def loss(logits):
        return F.cross_entropy(logits.flatten(0, 1), targets.flatten().to(logits.device) % vocab)

    device = next(model.parameters()).device
    if group is not None and dist.is_initialized():
        dist.barrier(group=group)  # start together: the ranks measure under the run's load
    costs = measure_layer_costs(layers, sample_input_ids.to(device), loss_fn=loss, repeats=repeats)
    model.zero_grad(set_to_none=True)
    if group is not None and dist.is_initialized() and dist.get_world_size(group) > 1:
        gathered = [None] * dist.get_world_size(group)
        dist.all_gather_object(gathered, costs, group=group)
        costs = [statistics.median(layer) for layer in zip(*gathered)]
    return linear_partition(costs, n_stages), costs
