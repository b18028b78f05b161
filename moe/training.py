"""Training a GPT-2 with MoE MLPs on Multi30k under expert parallelism × data parallelism.

The run's ``D = dp`` ranks form one device mesh ``Mesh.build(dp=D, ep=ep)``; each takes its shard
of every global batch (:func:`shard_batches`), runs the :class:`moe.gpt2.MoEGPT2` forward pass —
whose MoE layers exchange tokens in the ep group — and the backward pass of its loss (next-token
cross-entropy plus the routers' weighted losses), then averages gradients: dense ones over the dp
group, each expert's over its replicas (:func:`moe.gradients.sync_moe_gradients`), and steps.
Evaluation runs a copy holding every expert (:meth:`moe.gpt2.MoEGPT2.gathered`), its validation
set and BLEU sentences shared out over the dp group. ``--dense`` trains the GPT-2 with the same
active parameters per token instead (:class:`moe.gpt2.DenseGPT2`), on the same batches, with the
same step, for comparison.

Besides the shared results (:func:`course.epoch_runner.run_epochs`), each results file holds what
the routers did at every step, summed over the ranks (``routing``: tokens per expert before
dropping, choices dropped, tokens routed, per MoE layer), the collectives per step by group, and
the parameter counts.
"""
from __future__ import annotations

import json

import torch

from course.collectives import CommCounter, all_reduce, group_rank, group_size
from course.epoch_runner import Evaluation, StepOutcome, TrainingMode, run_epochs, to_device
from course.launch import context
from course.loss import lm_loss
from course.mesh import Mesh
from course.task import build_model
from moe.config import MoEConfig
from moe.gpt2 import DenseGPT2, MoEGPT2, parameter_counts
from moe.gradients import sync_moe_gradients


def build_moe_model(config, vocab_size: int, group=None):
    """The run's model: :class:`moe.gpt2.MoEGPT2` over the ep ``group``, or with ``config.dense`` the
    :class:`moe.gpt2.DenseGPT2` of the same active parameters per token (same seed)."""
    hf = build_model(config, vocab_size)
    if config.dense:
        return DenseGPT2(hf, config.top_k, every=config.moe_every)
    return MoEGPT2(hf, MoEConfig.of_run(config), group, seed=config.seed, every=config.moe_every)


def shard_batches(dataset, batch_size: int, rank: int, world: int, collate, seed: int,
                  max_batches: int | None = None):
    """This rank's shard of every global batch of an epoch, and the number of steps.

    The epoch's order is ``torch.randperm(len(dataset))`` seeded with ``seed``, the same on every
    rank; global batch s is ``order[s * batch_size:(s + 1) * batch_size]`` (a last, incomplete
    one is left out) and rank r of ``world`` takes its entries ``r, r + world, ...``.

    Returns:
        ``(batches, steps)``: an iterator of collated batches and their number.

    Raises:
        ValueError: ``batch_size`` not divisible by ``world``.
    """
    if batch_size % world:
        raise ValueError(f"the batch size {batch_size} is not divisible by the {world} data-parallel ranks")
    order = torch.randperm(len(dataset), generator=torch.Generator().manual_seed(seed), device="cpu").tolist()
    steps = len(dataset) // batch_size
    steps = steps if max_batches is None else min(steps, max_batches)

    def batches():
        for s in range(steps):
            mine = order[s * batch_size:(s + 1) * batch_size][rank::world]
            yield collate([dataset[i] for i in mine])

    return batches(), steps


def moe_loss(model, batch: dict) -> tuple[torch.Tensor, torch.Tensor]:
    """``(loss to minimise, next-token loss)`` of a batch: the loss adds the routers' weighted losses."""
    out = model(batch["input_ids"], batch["attention_mask"])
    lm = lm_loss(out.logits, batch["labels"])
    return lm + model.router_loss(), lm


def accumulated_step(model, optimizer, shards: list[dict], device) -> list[float]:
    """What D ranks do in one step, done by one process: the mean over the D shards of their losses,
    backward, one optimizer step. Returns each shard's next-token loss (the reference of the tests)."""
    optimizer.zero_grad(set_to_none=True)
    losses = []
    for batch in shards:
        loss, lm = moe_loss(model, to_device(batch, device))
        (loss / len(shards)).backward()
        losses.append(lm.item())
    optimizer.step()
    return losses


def update_router_biases(model, group) -> None:
    """After an optimizer step: auxiliary-loss-free balancing of every DeepSeek router with a bias update
    speed (``--router_bias_update`` > 0; DeepSeek-V3, Sec. 2.1.2), from the loads of the step's tokens
    summed over ``group`` (dp x cp: every rank routed a share of them). Nothing otherwise."""
    for layer in getattr(model, "moe_layers", []):
        if layer.config.router == "deepseek" and layer.config.router_bias_update > 0:
            layer.router.update_bias(group)


def routing_stats(model) -> torch.Tensor:
    """(layers, E + 2) float64 of the last forward pass: tokens per expert before dropping, choices
    dropped, tokens routed, per MoE layer (zero rows for a dense model)."""
    rows = [torch.cat([layer.stats["per_expert"].double().cpu(),
                       torch.tensor([float(layer.stats["dropped"]), float(layer.stats["tokens"])], dtype=torch.float64,
                                    device="cpu")])
            for layer in model.moe_layers]  # host statistics (results files)
    return torch.stack(rows) if rows else torch.zeros(0, 2, dtype=torch.float64, device="cpu")


class MoETraining(TrainingMode):
    """Expert parallelism × data parallelism: a shard per rank, MoE layers over the ep group, two gradient groups."""

    mode = "moe"

    def __init__(self, config, data, device, model, mesh: Mesh, **kwargs):
        super().__init__(config, data, device, **kwargs)
        self.model, self.mesh = model, mesh
        self.optimizer = torch.optim.AdamW(model.parameters(), lr=config.learning_rate)
        self.counter = CommCounter()
        self.routing: list[torch.Tensor] = []

    @property
    def checkpoint_key(self) -> str:
        return f"ep{self.mesh.ep_rank}"  # the experts differ between the ranks of an ep group

    def epoch_batches(self, epoch: int):
        group = self.mesh.dp_cp_group
        return shard_batches(self.data.train, self.config.batch_size, group_rank(group), group_size(group),
                             self.data.collate, seed=self.config.seed + epoch, max_batches=self.config.max_batches)

    def training(self, epoch: int):
        self.counter, self.routing = CommCounter(), []
        return self.counter

    def train_step(self, batch: dict) -> StepOutcome:
        batch = to_device(batch, self.device)
        self.optimizer.zero_grad(set_to_none=True)
        loss, lm = moe_loss(self.model, batch)
        loss.backward()
        sync_moe_gradients(self.model, self.mesh.dp_cp_group, self.mesh.edp_group)
        self.optimizer.step()
        update_router_biases(self.model, self.mesh.dp_cp_group)
        self.routing.append(routing_stats(self.model))
        return StepOutcome(lm.item(), int(batch["attention_mask"].sum()))

    def evaluation(self) -> Evaluation:
        return Evaluation(self.model.gathered(), self.device, group=self.mesh.dp_cp_group)

    def export_state(self) -> dict:
        """``--dense --top_k 1`` (``project/run_moe.py`` refuses the rest): the GPT-2 itself, for ``--export_hf``."""
        if not (isinstance(self.model, DenseGPT2) and self.model.top_k == 1):
            raise NotImplementedError("only the dense GPT-2 of top-1 (--dense --top_k 1) is transformers' GPT-2")
        return {name: t.detach() for name, t in self.model.model.state_dict().items()}

    def epoch_extra(self, epoch: int, stats: dict) -> dict:
        steps = max(1, stats["steps"])
        routing = None
        if self.routing:  # summed over the ranks, on the device the group's back-end serves (NCCL: CUDA only)
            routing = all_reduce(torch.stack(self.routing).to(self.device), group=self.mesh.dp_cp_group).cpu()
        per_step = {name: {kind: {k: v / steps for k, v in s.items()} for kind, s in summary.items()}
                    for name, summary in self.counter.by_group().items()}
        extra = {"comm_per_step": per_step, "parameters": parameter_counts(self.model),
                 "moe_blocks": list(self.model.blocks)}
        if routing is not None and routing.shape[1]:
            extra["routing"] = {"tokens_per_expert": routing[:, :, :-2].tolist(),
                                "dropped": routing[:, :, -2].tolist(), "tokens": routing[:, :, -1].tolist()}
        return extra

    def record(self) -> dict:
        config, dims = self.config, self.mesh.dims
        return {**config.record(), "world_size": self.mesh.world_size, "mode": self.mode, "dp": dims.dp,
                "ep": dims.ep, "dense": bool(config.dense), "num_experts": config.num_experts, "top_k": config.top_k,
                "capacity_factor": config.capacity_factor,
                "normalize_gates": bool(MoEConfig.of_run(config).normalize_gates),
                "aux_loss_coef": config.aux_loss_coef, "z_loss_coef": config.z_loss_coef, "moe_every": config.moe_every,
                "per_rank_batch_size": config.batch_size // dims.dp, "mesh": self.mesh.describe()}

    def progress_desc(self, epoch: int) -> str:
        kind = "dense" if self.config.dense else f"E={self.config.num_experts} k={self.config.top_k}"
        return f"epoch {epoch} ({kind}, dp {self.mesh.dims.dp}, ep {self.mesh.dims.ep})"


def moe_training(config, data, mesh: Mesh) -> MoETraining:
    """This rank's :class:`MoETraining` on ``mesh`` (its ep, dp x cp and edp groups): the model of
    :func:`build_moe_model` on the worker's device. What ``project/train.py --mode moe`` trains; the parity
    harness (``project/tools/parity.py``) steps it directly."""
    device = context().device
    model = build_moe_model(config, data.tokenizer.vocab_size, mesh.ep_group).to(device)
    return MoETraining(config, data, device, model, mesh, rank=mesh.rank, world_group=mesh.group("world"),
                       throughput_group=mesh.dp_cp_group, show_progress=mesh.rank == 0)


def train_moe(rank: int, world_size: int, config, data, mesh: Mesh | None = None, keep_model: bool = False) -> dict:
    """:func:`moe_training`'s epochs on prepared data (:func:`course.task.prepare_data`) and, optionally, a built
    mesh (default: ``dp = world_size``, ``ep = config.ep``); with ``keep_model`` the result also holds the trained
    ``"model"`` (in this process only: it is not picklable).

    Returns:
        ``{"results": [paths], "train_losses": [...], "validation_loss": [...]}`` (and ``"model"``).
    """
    mesh = mesh or Mesh.build(dp=world_size, ep=config.ep)
    mode = moe_training(config, data, mesh)
    model = mode.model
    written = run_epochs(mode)
    results = [json.loads(open(path).read()) for path in written]
    out = {"results": written, "train_losses": [x for r in results for x in r["train_losses"]],
           "validation_loss": [r["validation_loss"] for r in results]}
    return {**out, "model": model} if keep_model else out
