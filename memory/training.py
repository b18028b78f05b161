"""The memory options of a data-parallel run: ``--zero {0,1,2,3}``, ``--hsdp REPLICAS``, ``--zeropp LIST``,
``--activation_checkpointing``, ``--precision {fp32,bf16}``, as one object that does a training step
(and writes and loads the sharded state of a checkpoint, :mod:`memory.sharded_checkpoint`).

:class:`ShardedStep` is built by the run script's worker and handed to
``data_parallel.DataParallelTraining(sharding=...)``; with ``zero=0`` it is plain data
parallelism (gradients all-reduced and divided by dp, every rank stepping the whole model).

Mixed precision (Micikevicius et al. 2018, "Mixed Precision Training", Sec. 3): the forward
and backward matrix products run in bfloat16 under ``torch.autocast``, while the parameters
(the *master weights*), their gradients, the reductions over dp and Adam's state stay fp32
— a sum of many small bf16 gradients would lose their low bits (8 bits of mantissa), and the
update ``lr · m / sqrt(v)`` is far below a bf16 weight's resolution. bf16 has fp32's exponent
range, so gradients do not underflow and need no loss scaling (fp16, 5 exponent bits, does).
"""
from __future__ import annotations

import contextlib

import torch

from course import collectives
from course.collectives import CommCounter
from course.epoch_runner import StepOutcome, to_device
from course.loss import model_loss
from memory.checkpointing import apply_activation_checkpointing
from memory.fsdp import FullyShardedModel
from memory.hsdp import HybridShardedModel
from memory.zeropp import ZeroPPModel
from course.saved_tensors import storage_bytes
from memory.sharded_checkpoint import ZERO_FLAT, ZERO_UNITS, check_names, flat_state, gather_flat
from memory.zero import ZeroOptimizer, unique_parameters

PRECISIONS = ("fp32", "bf16")


def model_blocks(model):
    """The transformer blocks of a GPT-2 (``model.transformer.h``), or ``model.blocks``."""
    if hasattr(model, "transformer"):
        return model.transformer.h
    return model.blocks


def autocast(device, precision: str):
    """``torch.autocast`` to bfloat16 for ``precision="bf16"``, nothing for ``"fp32"``.

    Raises:
        ValueError: an unknown precision.
    """
    if precision not in PRECISIONS:
        raise ValueError(f"--precision must be one of {PRECISIONS}, not {precision!r}")
    device_type = torch.device(device).type
    return torch.autocast(device_type, dtype=torch.bfloat16, enabled=precision == "bf16")


class ShardedStep:
    """One training step of ZeRO stage ``zero`` over ``group`` (the dp group).

    Args:
        model: this rank's replica (same initial weights on every rank).
        zero: 0 (plain data parallelism), 1, 2 (:class:`memory.zero.ZeroOptimizer`) or 3
            (:class:`memory.fsdp.FullyShardedModel`, each block of ``blocks`` a unit).
        group: the dp group.
        optimizer_class, **optimizer_options: e.g. ``torch.optim.AdamW, lr=...``.
        blocks: the units of ZeRO-3 and of checkpointing (default :func:`model_blocks`).
        activation_checkpointing: recompute each block in backward (:mod:`memory.checkpointing`).
        precision: ``"fp32"`` or ``"bf16"`` (autocast; fp32 master weights and reductions).
        hybrid: ``(shard group, replicate group)`` for hybrid sharding with ``zero=3``
            (:class:`memory.hsdp.HybridShardedModel`; :meth:`course.mesh.Mesh.hybrid_shard_groups`);
            None: ZeRO-3 over the whole ``group``.
        zeropp: ZeRO++'s options with ``zero=3`` (a subset of ``("qwz", "hpz", "qgz")``,
            :class:`memory.zeropp.ZeroPPModel`); ``hpz_group``: hpZ's node-sized group.

    Raises:
        ValueError: ``zero`` not in 0..3, an unknown precision, ``hybrid`` or ``zeropp`` without ``zero=3``,
            or both.
    """

    def __init__(self, model, zero: int, group=None, optimizer_class=torch.optim.AdamW, blocks=None,
                 activation_checkpointing: bool = False, precision: str = "fp32", hybrid=None, zeropp=(), hpz_group=None,
                 **optimizer_options):
        if zero not in (0, 1, 2, 3):
            raise ValueError(f"--zero must be 0, 1, 2 or 3, not {zero}")
        if hybrid is not None and zero != 3:
            raise ValueError(f"hybrid sharding is ZeRO-3 inside a shard group: use zero=3, not {zero}")
        if zeropp and (zero != 3 or hybrid is not None):
            raise ValueError(f"ZeRO++ ({', '.join(zeropp)}) is ZeRO-3 over the dp group: use zero=3 without hybrid")
        autocast("cpu", precision)  # checks the name
        self.model, self.zero, self.group, self.precision = model, zero, group, precision
        self.hybrid, self.zeropp = hybrid, tuple(zeropp)
        self.checkpointing = activation_checkpointing
        self.dp = collectives.group_size(group)
        blocks = model_blocks(model) if blocks is None else blocks
        if activation_checkpointing:
            if getattr(getattr(model, "config", None), "use_cache", False):
                model.config.use_cache = False  # the recomputation would fill the cache twice
            apply_activation_checkpointing(blocks)
        self.fsdp = None
        if zero == 0:
            self.optimizer = optimizer_class(model.parameters(), **optimizer_options)
        elif zero in (1, 2):
            self.optimizer = ZeroOptimizer(model.parameters(), optimizer_class, group=group, stage=zero,
                                           **optimizer_options)
        elif self.zeropp:
            self.fsdp = ZeroPPModel(model, blocks, group=group, options=self.zeropp, hpz_group=hpz_group)
        elif hybrid is None:
            self.fsdp = FullyShardedModel(model, blocks, group=group)
        else:
            self.fsdp = HybridShardedModel(model, blocks, shard_group=hybrid[0], replicate_group=hybrid[1])
        if self.fsdp is not None:
            self.optimizer = optimizer_class(self.fsdp.shard_parameters(), **optimizer_options)
        self._evaluating = None
        self.counter = None  # the communication of the training steps (training()), per group

    # -- the step -----------------------------------------------------------------------------------

    def forward_backward(self, batch: dict, device, loss_fn=None) -> torch.Tensor:
        """Zero the gradients, forward (autocast per precision), backward, and reduce the gradients over dp."""
        self.end_evaluation()
        self.optimizer.zero_grad(set_to_none=True)
        with autocast(device, self.precision):
            loss = (loss_fn or model_loss)(self.model, batch)
        loss.backward()
        self.reduce_gradients()
        return loss

    def reduce_gradients(self) -> None:
        if self.zero == 0:
            for p in unique_parameters(self.model.parameters()):
                if p.grad is not None:
                    p.grad = collectives.all_reduce(p.grad, group=self.group) / self.dp
        elif self.zero in (1, 2):
            self.optimizer.reduce_gradients()
        else:
            self.fsdp.finish_backward()

    def train_step(self, batch: dict, device, loss_fn=None) -> StepOutcome:
        batch = to_device(batch, device)
        loss = self.forward_backward(batch, device, loss_fn)
        self.optimizer.step()
        return StepOutcome(loss.item(), int(batch["attention_mask"].sum()))

    # -- evaluation (ZeRO-3: every parameter gathered while evaluating) -----------------------------

    def begin_evaluation(self) -> None:
        """ZeRO-3: gather every unit until the next training step (evaluation and decoding run a
        different number of forward passes on each rank, which per-unit gathering cannot)."""
        if self.fsdp is not None and self._evaluating is None:
            self._evaluating = self.fsdp.summon_full_params()
            self._evaluating.__enter__()

    def end_evaluation(self) -> None:
        if self._evaluating is not None:
            self._evaluating.__exit__(None, None, None)
            self._evaluating = None

    def summon_full_params(self):
        return self.fsdp.summon_full_params() if self.fsdp is not None else contextlib.nullcontext(self.model)

    # -- what it holds (memory.accounting) ------------------------------------------------------------

    def category_tensors(self) -> dict[str, list[torch.Tensor]]:
        """The tensors this rank holds now, per category: ``params``, ``grads``, ``optimizer``."""
        params = list(self.model.parameters())
        grads = [p.grad for p in params]
        if self.zero in (1, 2):
            params += [self.optimizer.shard]
            grads = self.optimizer.grad_tensors()
        elif self.zero == 3:
            shards = self.fsdp.shard_parameters()
            params += shards
            grads += [s.grad for s in shards]
        inner = getattr(self.optimizer, "optimizer", self.optimizer)
        state = [t for s in inner.state.values() for t in s.values() if torch.is_tensor(t)]
        return {"params": params, "grads": [g for g in grads if g is not None], "optimizer": state}

    def record(self) -> dict:
        """What the results files record about the memory options."""
        found = {"zero": self.zero, "precision": self.precision,
                 "activation_checkpointing": bool(getattr(self, "checkpointing", False))}
        if self.hybrid is not None:
            found["hsdp"] = {"replicas": collectives.group_size(self.hybrid[1]),
                             "shard": collectives.group_size(self.hybrid[0])}
        if self.zeropp:
            found["zeropp"] = list(self.zeropp)
            if "hpz" in self.zeropp:
                found["zeropp_group"] = collectives.group_size(self.fsdp.hpz_group)
        return found

    # -- what the results files record ----------------------------------------------------------------

    def training(self):
        """A communication counter around an epoch's training steps (counts and bytes; no GPU sync)."""
        self.counter = CommCounter()
        return self.counter

    def epoch_extra(self, steps: int) -> dict:
        """``model_state_bytes``: parameters, gradients and optimizer state this rank holds now, counted by
        storage (:func:`memory.accounting.storage_bytes`; gradients as of the last step's reduction);
        ``comm_per_step``: the collectives of a training step per group and kind (count, bytes, ring
        traffic bytes of this rank)."""
        held = {k: storage_bytes(v) for k, v in self.category_tensors().items()}
        per_step = {}
        if self.counter is not None:
            per_step = {name: {kind: {k: v / max(1, steps) for k, v in summary.items()} for kind, summary in kinds.items()}
                        for name, kinds in self.counter.by_group().items()}
        return {"model_state_bytes": held, "comm_per_step": per_step}

    # -- checkpoints (memory.sharded_checkpoint) -------------------------------------------------------

    def checkpoint_state(self) -> dict:
        """ZeRO-1/2/3's state keyed independently of the number of ranks (:mod:`memory.sharded_checkpoint`):
        every flat buffer and its Adam state as a ``DTensor`` of its global length, sharded as the ranks
        hold it. (ZeRO-0 keeps the per-parameter layout of ``torch.distributed.checkpoint.state_dict``:
        :meth:`course.epoch_runner.TrainingMode.checkpoint_state`.)

        Raises:
            ValueError: ``zero=0`` (nothing sharded).
        """
        if self.zero == 0:
            raise ValueError("ZeRO-0 checkpoints are the training mode's (nothing is sharded)")
        names = {id(p): n for n, p in self.model.named_parameters()}
        if self.zero in (1, 2):
            opt = self.optimizer
            return {ZERO_FLAT: flat_state(opt.shard, opt.numel, opt.optimizer, self.group,
                                          [names[id(p)] for p in opt.params])}
        group = self.fsdp.group
        return {ZERO_UNITS: {u.name: flat_state(u.shard, u.numel, self.optimizer, group, [names[id(p)] for p in u.params])
                             for u in self.fsdp.units}}

    def load_checkpoint_state(self, state: dict) -> None:
        """After DCP loaded :meth:`checkpoint_state` in place (each rank its new slices): check that the
        buffers hold this model's parameters; ZeRO-1/2: all-gather the slices into every rank's whole
        flat buffer (its parameters).

        Raises:
            ValueError: the checkpoint's buffers hold other parameters (another model).
        """
        names = {id(p): n for n, p in self.model.named_parameters()}
        if self.zero in (1, 2):
            opt = self.optimizer
            check_names(state[ZERO_FLAT]["names"], [names[id(p)] for p in opt.params], "flat buffer")
            gather_flat(opt.flat, opt.shard, self.group)
        else:
            for u in self.fsdp.units:
                check_names(state[ZERO_UNITS][u.name]["names"], [names[id(p)] for p in u.params], f"unit {u.name}")


def build_sharding(model, config, group, mesh=None) -> ShardedStep:
    """The sharded step of ``project/run_data_parallel.py`` (:func:`data_parallel.training.dp_training`): a
    :class:`ShardedStep` from the options ``--zero``, ``--hsdp``, ``--activation_checkpointing``, ``--precision``
    with AdamW at ``--learning_rate`` (as plain data parallelism). ``--hsdp R`` > 1 takes its shard and replicate groups
    from ``mesh`` (:meth:`course.mesh.Mesh.hybrid_shard_groups`; collective the first time). ``--zeropp`` with
    hpz takes its node-sized group, ``--zeropp_group`` ranks, from the same layout (its shard group)."""
    replicas = getattr(config, "hsdp", 1) or 1
    hybrid = mesh.hybrid_shard_groups(replicas) if replicas > 1 else None
    zeropp = config.zeropp_options() if hasattr(config, "zeropp_options") else ()
    hpz_group = mesh.hybrid_shard_groups(config.dp // config.hpz_group_size())[0] if "hpz" in zeropp else None
    return ShardedStep(model, config.zero, group, torch.optim.AdamW,
                       activation_checkpointing=config.activation_checkpointing, precision=config.precision,
                       hybrid=hybrid, zeropp=zeropp, hpz_group=hpz_group, lr=config.learning_rate)
