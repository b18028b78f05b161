"""Assignment 5.5.4 — activation checkpointing: keep a block's input, recompute the rest in backward.

In the backward pass every operation needs tensors from its forward pass (the input of a
linear layer, the softmax of attention, the dropout mask): autograd keeps them from the
forward pass until the backward pass has used them, and for a transformer they outweigh the
parameters by far at long sequences (Korthikanti et al. 2022, "Reducing Activation
Recomputation in Large Transformer Models", Sec. 4: about ``s b h (34 + 5 a s / h)`` bytes per
layer in 16-bit). Checkpointing (Chen et al. 2016, "Training Deep Nets with Sublinear Memory
Cost") runs a block's forward pass *without* keeping anything but its input, and in the
backward pass runs the block's forward again (with the same random numbers, so that dropout
drops the same units), then back-propagates through that recomputation: one more forward
pass per block (about a third more compute) for activation memory of one block input per
block plus one block's worth at a time.

``torch.utils.checkpoint.checkpoint`` is PyTorch's implementation and the reference of the tests.
"""
from __future__ import annotations

import contextlib
import functools

import torch
from torch import nn


class CheckpointFunction(torch.autograd.Function):
    """``outputs = run(*inputs)`` computed without saving the intermediate tensors; recomputed in backward.

    ``forward(ctx, run, *inputs)``: saves only the tensor ``inputs`` (``ctx.save_for_backward``),
    the random-number state of the CPU and of every GPU the inputs live on (a GPU's generator
    draws its dropout masks), the autocast state of the inputs' device type and of the CPU, and
    runs ``run(*inputs)`` under ``torch.no_grad()``. ``run`` returns a tensor or a tuple of tensors
    (None allowed).

    ``backward(ctx, *grad_outputs)``: restores those random states (leaving the caller's untouched,
    ``torch.random.fork_rng``) and that autocast state — so the recomputation draws the same
    dropout masks and runs in the same precision as the forward pass, on CPU and on GPU alike —
    re-runs ``run`` with gradients enabled on detached copies of the inputs, back-propagates
    ``grad_outputs`` through it and returns the inputs' gradients (None for ``run`` and for
    inputs that need none). ``torch.utils.checkpoint.checkpoint`` does the same (its
    ``preserve_rng_state`` and its device and CPU autocast replay).
    """

    @staticmethod
    def forward(ctx, run, *inputs):
        # BEGIN ASSIGN5_5_4
        ctx.run = run
        gpus = sorted({x.device.index for x in inputs if torch.is_tensor(x) and x.device.type == "cuda"})
        ctx.gpus = gpus
        ctx.cpu_rng = torch.get_rng_state()
        ctx.gpu_rng = [torch.cuda.get_rng_state(g) for g in gpus]
        device_type = "cuda" if gpus else next((x.device.type for x in inputs if torch.is_tensor(x)), "cpu")
        ctx.autocast = {t: (torch.is_autocast_enabled(t), torch.get_autocast_dtype(t)) for t in {device_type, "cpu"}}
        ctx.save_for_backward(*inputs)
        with torch.no_grad():
            return run(*inputs)
        # END ASSIGN5_5_4

    @staticmethod
    def backward(ctx, *grad_outputs):
        # BEGIN ASSIGN5_5_4
        inputs = [x.detach().requires_grad_(x.requires_grad) if torch.is_tensor(x) else x for x in ctx.saved_tensors]
        with torch.random.fork_rng(devices=ctx.gpus):
            torch.set_rng_state(ctx.cpu_rng)
            for gpu, state in zip(ctx.gpus, ctx.gpu_rng):
                torch.cuda.set_rng_state(state, gpu)
            with torch.enable_grad(), contextlib.ExitStack() as replay:
                for device_type, (enabled, dtype) in ctx.autocast.items():
                    replay.enter_context(torch.autocast(device_type, dtype=dtype, enabled=enabled))
                outputs = ctx.run(*inputs)
        outputs = outputs if isinstance(outputs, tuple) else (outputs,)
        pairs = [(o, g) for o, g in zip(outputs, grad_outputs)
                 if torch.is_tensor(o) and o.requires_grad and g is not None]
        torch.autograd.backward([o for o, _ in pairs], [g for _, g in pairs])
        return (None, *[x.grad if torch.is_tensor(x) and x.requires_grad else None for x in inputs])
        # END ASSIGN5_5_4


def checkpointed(forward):
    """``forward`` (a module's bound forward) run through :class:`CheckpointFunction`.

    Positional tensor arguments go through the function (their gradients flow back); other
    positional arguments and the keyword arguments (attention masks, flags) are held by the
    closure (keyword tensors must not need gradients). A model's key/value cache would be
    filled twice: turn it off (``config.use_cache = False``), as Hugging Face does.
    """
    @functools.wraps(forward)
    def run(*args, **kwargs):
        if not torch.is_grad_enabled():
            return forward(*args, **kwargs)
        where = [i for i, a in enumerate(args) if torch.is_tensor(a)]

        def call(*tensors):
            full = list(args)
            for i, t in zip(where, tensors):
                full[i] = t
            return forward(*full, **kwargs)
        return CheckpointFunction.apply(call, *[args[i] for i in where])
    return run


def apply_activation_checkpointing(blocks) -> None:
    """Checkpoint every module of ``blocks`` (e.g. ``model.transformer.h``) in place.

    The module's ``forward`` is replaced by :func:`checkpointed` (``module.__call__`` and its hooks,
    e.g. :class:`memory.fsdp.FullyShardedModel`'s, still run around it); parameter names and the
    state dict are unchanged.
    """
    for block in blocks:
        if not getattr(block, "_checkpointed", False):
            block.forward = checkpointed(block.forward)
            block._checkpointed = True
