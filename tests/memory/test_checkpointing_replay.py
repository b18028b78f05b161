"""Assignment 5.5.4 (activation checkpointing), graded: the recomputation replays the forward pass exactly.

One process, CPU, GPT-2 with dropout 0.1 under bfloat16 autocast (``--precision bf16
--activation_checkpointing``). The recomputation in the backward pass must run in the precision the
forward pass ran in (the autocast state of the inputs' device type) and draw the same dropout masks
(the random state restored), so:

* every block's recomputed output equals, bit for bit and in dtype, the output its forward pass produced;
* the loss and the gradients equal those of the same model without checkpointing, and of
  ``torch.utils.checkpoint.checkpoint``;
* the caller's random stream afterwards is the one it would be without checkpointing.

Wrong solutions this fails on (planted and watched failing): the autocast state not replayed (the
recomputation runs in fp32: other activations), the random state not restored (other dropout masks),
the random state restored without ``fork_rng`` (the caller's stream is moved back).
On a GPU the same is checked with CUDA inputs by the GPU tier (``tests/gpu``), where replaying only the
CPU's autocast state would fail.
"""
import pytest
import torch
from torch.utils.checkpoint import checkpoint

pytestmark = pytest.mark.a5_5_4

VOCAB, SEQ, DROPOUT = 300, 24, 0.1


def make_model():
    from course.model import build_gpt2

    model = build_gpt2("tiny", VOCAB, n_positions=SEQ, dropout=DROPOUT, seed=0, n_layer=2)
    model.config.use_cache = False
    return model.train()


def batch():
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(0, VOCAB, (4, SEQ), generator=g, device="cpu")
    return ids, torch.ones_like(ids)


def run(model, seed=5):
    """Loss (bf16 autocast), the gradients, the next random numbers of the caller's stream."""
    ids, mask = batch()
    torch.manual_seed(seed)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits = model(input_ids=ids, attention_mask=mask).logits
        loss = torch.nn.functional.cross_entropy(logits[:, :-1].flatten(0, 1).float(), ids[:, 1:].flatten())
    loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return float(loss.detach()), grads, torch.rand(4)


def record_block_outputs(model) -> dict:
    """{block index: [output of each call]} — the forward pass's, then the recomputation's."""
    calls: dict = {}
    for i, block in enumerate(model.transformer.h):
        block.mlp.register_forward_hook(lambda m, a, out, i=i: calls.setdefault(i, []).append(out.detach().clone()))
    return calls


def test_recomputation_replays_bf16_autocast_and_dropout():
    from memory.checkpointing import apply_activation_checkpointing

    model = make_model()
    calls = record_block_outputs(model)
    apply_activation_checkpointing(model.transformer.h)
    run(model)
    for i, outputs in calls.items():
        assert len(outputs) == 2, f"block {i} ran {len(outputs)} times (a forward pass and one recomputation expected)"
        forward, recomputed = outputs
        assert forward.dtype == torch.bfloat16, "the forward pass ran under bf16 autocast"
        assert recomputed.dtype == forward.dtype, (
            f"block {i} was recomputed in {recomputed.dtype}, the forward pass ran in {forward.dtype}: replay the "
            "autocast state the forward pass had (for the inputs' device type)")
        assert torch.equal(recomputed, forward), (
            f"block {i}'s recomputed activations differ from its forward pass's (largest difference "
            f"{float((recomputed.float() - forward.float()).abs().max()):.3g}): restore the random state, so dropout "
            "drops the same units")


def test_bf16_gradients_equal_plain_and_torch_checkpoint():
    from memory.checkpointing import apply_activation_checkpointing

    plain = run(make_model())
    reference_model = make_model()
    for block in reference_model.transformer.h:
        block.forward = (lambda f: lambda *a, **k: checkpoint(f, *a, use_reentrant=False, **k))(block.forward)
    reference = run(reference_model)
    model = make_model()
    apply_activation_checkpointing(model.transformer.h)
    got = run(model)
    assert got[0] == plain[0]
    assert sorted(got[1]) == sorted(plain[1])
    for name, g in plain[1].items():
        assert torch.equal(got[1][name], g), (
            f"gradient of {name} differs from the run without checkpointing by "
            f"{float((got[1][name] - g).abs().max()):.3g} (same precision and dropout masks in the recomputation?)")
        assert torch.equal(got[1][name], reference[1][name]), f"gradient of {name} differs from torch.utils.checkpoint"
    assert torch.equal(got[2], plain[2]), "the recomputation must leave the caller's random stream as it was"
