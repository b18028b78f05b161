"""Assignment 5.5.4 (activation checkpointing), graded.

One process. With dropout on (so the recomputation must replay the random numbers), the
checkpointed model's loss and gradients must equal those of the plain model and of the
model whose blocks go through ``torch.utils.checkpoint.checkpoint``; and what autograd
saves for the backward pass (counted with saved-tensor hooks, by storage) must be only the
block's input for one checkpointed block, and no more than ``torch.utils.checkpoint`` saves
for the whole model. With dropout and bfloat16 autocast at once, every recomputed activation
equals (bit for bit, in dtype) the one the forward pass computed, and the gradients equal the
plain run's: the recomputation replays the random state and the autocast state.
"""
import pytest
import torch
from torch.utils.checkpoint import checkpoint

from course.saved_tensors import SavedTensorBytes
from tests.support.memory import PER_RANK, batch, lm_loss, make_model

pytestmark = pytest.mark.a5_5_4

DROPOUT = 0.3


def loss_and_grads(model, ids, seed=7):
    torch.manual_seed(seed)
    loss = lm_loss(model, ids)
    loss.backward()
    return float(loss), {n: p.grad.clone() for n, p in model.named_parameters()}


def torch_checkpointed_model():
    model = make_model(DROPOUT)
    for block in model.blocks:
        block.forward = (lambda f: lambda x: checkpoint(f, x, use_reentrant=True))(block.forward)
    return model


def saved_bytes(model, ids, seed=7):
    torch.manual_seed(seed)
    with SavedTensorBytes(exclude=list(model.parameters())) as saved:
        loss = lm_loss(model, ids)
    loss.backward()
    return saved.activation_bytes


def test_checkpointed_gradients_equal_plain_and_torch_checkpoint_with_dropout():
    from memory.checkpointing import apply_activation_checkpointing

    ids = batch(0, 2)
    plain = loss_and_grads(make_model(DROPOUT), ids)
    reference = loss_and_grads(torch_checkpointed_model(), ids)
    model = make_model(DROPOUT)
    apply_activation_checkpointing(model.blocks)
    got = loss_and_grads(model, ids)
    # The recomputation runs the same forward ops on the same inputs with the same random state (the values are equal
    # bit for bit: checked below with torch.equal); the backward may accumulate a block's gradient parts in
    # another order: sums of a few terms, a few 2^-24 ~ 6e-8 relative, inside rtol 1e-5 (atol 1e-7 for near-zero ones)
    assert got[0] == pytest.approx(plain[0], rel=1e-6)
    for name, g in plain[1].items():
        assert torch.allclose(got[1][name], reference[1][name], rtol=1e-5, atol=1e-7), (
            f"gradient of {name} differs from torch.utils.checkpoint (is the random state restored before the "
            "recomputation, so dropout drops the same units?)")
        assert torch.allclose(got[1][name], g, rtol=1e-5, atol=1e-7), f"gradient of {name} differs from no checkpointing"
    # the caller's random stream is left as it would be without checkpointing
    fresh = make_model(DROPOUT)
    torch.manual_seed(7)
    lm_loss(fresh, ids).backward()
    want = torch.rand(3)
    torch.manual_seed(7)
    lm_loss(model, ids).backward()
    assert torch.equal(torch.rand(3), want), "the recomputation must not advance the caller's random state"


def test_a_checkpointed_block_saves_only_its_input():
    from memory.checkpointing import CheckpointFunction

    block = make_model(DROPOUT).blocks[0]
    x = torch.randn(PER_RANK, 5, block.ln.normalized_shape[0], requires_grad=True)
    with SavedTensorBytes(exclude=list(block.parameters())) as plain:
        block(x).sum().backward()
    x.grad = None
    with SavedTensorBytes(exclude=list(block.parameters())) as saved:
        y = CheckpointFunction.apply(block.forward, x)
    assert saved.activation_bytes <= x.numel() * x.element_size(), (
        f"a checkpointed block saved {saved.activation_bytes} bytes of activations for the backward pass; only its "
        f"input ({x.numel() * x.element_size()} bytes) may be kept (the block without checkpointing saves "
        f"{plain.activation_bytes})")
    y.sum().backward()
    assert x.grad is not None and torch.isfinite(x.grad).all()


def test_checkpointed_model_saves_no_more_than_torch_checkpoint_and_less_than_plain():
    from memory.checkpointing import apply_activation_checkpointing

    ids = batch(0, 2)
    model = make_model(DROPOUT)
    apply_activation_checkpointing(model.blocks)
    got, reference, plain = saved_bytes(model, ids), saved_bytes(torch_checkpointed_model(), ids), \
        saved_bytes(make_model(DROPOUT), ids)
    assert got <= reference < plain, (
        f"saved activations: {got} bytes checkpointed, {reference} with torch.utils.checkpoint, {plain} without")


def _block_outputs(model) -> dict:
    """``{block index: [output of its MLP's down projection at each call]}``: the forward pass's, then the
    recomputation's (the projection's own hooks run in both)."""
    calls: dict = {}
    for i, block in enumerate(model.blocks):
        block.down.register_forward_hook(lambda m, a, out, i=i: calls.setdefault(i, []).append(out.detach().clone()))
    return calls


def _bf16_run(model, ids, seed=7):
    torch.manual_seed(seed)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = lm_loss(model, ids)
    loss.backward()
    return float(loss), {n: p.grad.clone() for n, p in model.named_parameters()}, torch.rand(3)


def test_the_recomputation_under_bf16_autocast_with_dropout_replays_the_forward_pass():
    from memory.checkpointing import apply_activation_checkpointing

    ids = batch(0, 2)
    plain = _bf16_run(make_model(DROPOUT), ids)
    model = make_model(DROPOUT)
    apply_activation_checkpointing(model.blocks)
    calls = _block_outputs(model)
    got = _bf16_run(model, ids)
    for i, outputs in calls.items():
        assert len(outputs) == 2, f"block {i}: computed {len(outputs)} times; forward, then once again in backward"
        forward, recomputed = outputs
        assert recomputed.dtype == forward.dtype == torch.bfloat16, (
            f"block {i}: the forward pass ran in {forward.dtype}, the recomputation in {recomputed.dtype}: replay "
            "the autocast state of the forward pass")
        assert torch.equal(recomputed, forward), (
            f"block {i}: the recomputed activation differs from the forward pass's (max diff "
            f"{float((recomputed.float() - forward.float()).abs().max()):.2e}): same random state and autocast state")
    assert got[0] == plain[0], "the checkpointed loss differs from the plain run's"
    for name, g in plain[1].items():
        assert torch.allclose(got[1][name], g, rtol=1e-5, atol=1e-7), f"gradient of {name} differs from the plain run"
    assert torch.equal(got[2], plain[2]), "the recomputation must not move the caller's random stream"
