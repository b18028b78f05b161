"""Measurements that notebooks/05_memory.ipynb puts beside the formulas of :mod:`memory.formulas`.

* :func:`mixed_precision_state_bytes` — the model state of one mixed-precision Adam step laid out
  as the ZeRO paper counts it (16-bit parameters and gradients, fp32 master weights and moments),
  counted by storage: the 2 + 2 + 12 bytes per parameter, measured.
* :func:`activation_bytes_per_block` — the bytes autograd keeps for the backward pass inside each
  GPT-2 block, for several sequence lengths, with or without activation checkpointing: against
  Korthikanti et al. 2022's count per layer.

Both run in this process (one rank, no process group) on the CPU.
"""
from __future__ import annotations

import torch

from course.loss import model_loss
from course.saved_tensors import SavedTensorBytes, storage_bytes
from memory.accounting import optimizer_state_tensors


def mixed_precision_state_bytes(model, batch: dict, dtype: torch.dtype = torch.bfloat16) -> dict[str, int]:
    """One Adam step of ``model`` in mixed precision (ZeRO Sec. 3.1; Micikevicius et al. 2018, Sec. 3),
    and the bytes each category holds at the optimizer step, counted by storage.

    The model's parameters are cast to ``dtype`` (the copy that runs forward and backward), the
    backward pass leaves ``dtype`` gradients, and ``torch.optim.Adam`` steps an fp32 *master* copy
    of every parameter (its gradient is the 16-bit one, cast for the step and dropped after it);
    the updated master weights are copied back into the 16-bit parameters.

    Returns ``{"params": 16-bit parameters, "grads": 16-bit gradients, "optimizer": fp32 master
    weights + Adam's moments + its step counters}`` in bytes (``model`` is left in ``dtype``).
    """
    params = list({id(p): p for p in model.parameters()}.values())
    master = [p.detach().float().clone().requires_grad_(True) for p in params]
    for p in params:
        p.data = p.data.to(dtype)
    optimizer = torch.optim.Adam(master, lr=1e-3)
    loss = model_loss(model, batch)
    loss.backward()
    held = {"params": storage_bytes(params), "grads": storage_bytes([p.grad for p in params])}
    for m, p in zip(master, params):
        m.grad = p.grad.float()
    optimizer.step()
    for m, p in zip(master, params):
        m.grad = None
        p.data.copy_(m.detach())
    held["optimizer"] = storage_bytes(master + optimizer_state_tensors(optimizer))
    return held


def activation_bytes_per_block(seq_lens=(32, 64, 128), batch_size: int = 4, n_embd: int = 128, n_head: int = 4,
                               n_layer: int = 2, dropout: float = 0.1, checkpointing: bool = False,
                               vocab_size: int = 256) -> list[dict]:
    """For each sequence length: the activation bytes each block of a GPT-2 (``build_gpt2("tiny", ...)``
    with the given sizes, fp32) saves for the backward pass, measured with
    :class:`memory.accounting.SavedTensorBytes` entered around every block (parameters excluded,
    each storage once), averaged over the blocks.

    With ``checkpointing`` the blocks go through :func:`memory.checkpointing.apply_activation_checkpointing`
    (assignment 5.5.4): a block then keeps only its input.

    Returns ``[{"s", "b", "h", "a", "dropout", "checkpointing", "bytes_per_block",
    "tensors": [{"shape", "dtype", "bytes"}] (the first block's saved storages)}]``.
    """
    from course.model import build_gpt2

    rows = []
    for s in seq_lens:
        model = build_gpt2("tiny", vocab_size, n_positions=s, dropout=dropout, seed=0, n_embd=n_embd,
                           n_head=n_head, n_layer=n_layer)
        model.config.use_cache = False
        if checkpointing:
            from memory.checkpointing import apply_activation_checkpointing

            apply_activation_checkpointing(model.transformer.h)
        params = list(model.parameters())
        counters: list[SavedTensorBytes] = []
        tensors: list[dict] = []

        def enter(module, args, index=None):
            counter = SavedTensorBytes(exclude=params)
            if index == 0:  # also list the first block's storages, with the shape each was saved as
                pack = counter._pack

                def listing(t):
                    before = counter.activation_bytes
                    out = pack(t)
                    if counter.activation_bytes > before:  # a new storage that is not a parameter
                        tensors.append({"shape": tuple(t.shape), "dtype": str(t.dtype).replace("torch.", ""),
                                        "bytes": counter.activation_bytes - before})
                    return out

                counter._pack = listing
            counters.append(counter.__enter__())

        def leave(module, args, output):
            counters[-1].__exit__(None, None, None)

        for i, block in enumerate(model.transformer.h):
            block.register_forward_pre_hook(lambda m, a, i=i: enter(m, a, i))
            block.register_forward_hook(leave)
        gen = torch.Generator().manual_seed(1)
        ids = torch.randint(0, vocab_size, (batch_size, s), generator=gen, device="cpu")  # this process, the CPU
        loss = model_loss(model, {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids})
        loss.backward()
        per_block = [c.activation_bytes for c in counters]
        rows.append({"s": s, "b": batch_size, "h": n_embd, "a": n_head, "dropout": dropout,
                     "checkpointing": checkpointing, "bytes_per_block": sum(per_block) / len(per_block),
                     "tensors": tensors})
    return rows
