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

The generators of the inputs' GPU are checked on the CPU too: on a GPU, dropout draws its masks from
that GPU's generator (``torch.cuda``'s), not the CPU's, so a function that saves and restores only the
CPU's random state recomputes a block with other masks there. A block whose input reports ``cuda:0``
(CPU storage) draws its mask from a stand-in for ``torch.cuda``'s random-number API (``get_rng_state``,
``set_rng_state`` and their ``_all`` forms, ``device``, ``device_count``, ``current_device``,
``is_available``, initialised; in ``torch.cuda`` and ``torch.cuda.random``; ``torch.utils.checkpoint``,
reentrant or not, passes it), one CPU generator per GPU: the
recomputation must draw the forward pass's mask, and leave the caller's GPU stream where it was.
(Planted and watched failing: saving and restoring only the CPU generator; restoring the GPU state
without ``fork_rng``.)
"""
import contextlib

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


class OnGpu(torch.Tensor):
    """A CPU tensor that reports ``cuda:0`` as its device: a block's input on a GPU, on a CPU-only machine."""

    @property
    def device(self):
        return torch.device("cuda", 0)

    def get_device(self) -> int:
        return 0


class FakeCudaRandom:
    """``torch.cuda``'s random-number API over CPU generators, one per (fake) GPU; ``gens[i]`` is what a
    dropout on GPU i draws from."""

    def __init__(self, gpus: int = 2):
        self.gens = [torch.Generator().manual_seed(100 + i) for i in range(gpus)]
        self.current = 0

    def index(self, device=None) -> int:
        if device is None:
            return self.current
        if isinstance(device, int):
            return device
        device = torch.device(device)
        return self.current if device.index is None else device.index

    def get_rng_state(self, device="cuda"):
        return self.gens[self.index(device)].get_state()

    def set_rng_state(self, state, device="cuda"):
        self.gens[self.index(device)].set_state(state)

    def get_rng_state_all(self):
        return [g.get_state() for g in self.gens]

    def set_rng_state_all(self, states):
        for g, state in zip(self.gens, states):
            g.set_state(state)

    @contextlib.contextmanager
    def device(self, device):
        before, self.current = self.current, self.index(device)
        try:
            yield
        finally:
            self.current = before

    def install(self, monkeypatch) -> None:
        for module in (torch.cuda, torch.cuda.random):
            for name in ("get_rng_state", "set_rng_state", "get_rng_state_all", "set_rng_state_all"):
                monkeypatch.setattr(module, name, getattr(self, name), raising=False)
        monkeypatch.setattr(torch.cuda, "device", self.device)
        monkeypatch.setattr(torch.cuda, "device_count", lambda: len(self.gens))
        monkeypatch.setattr(torch.cuda, "current_device", lambda: self.current)
        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
        monkeypatch.setattr(torch.cuda, "_initialized", True)  # torch.utils.checkpoint saves GPU states only then


def test_recomputation_on_a_gpu_draws_from_the_gpus_generator(monkeypatch):
    from memory.checkpointing import CheckpointFunction

    cuda = FakeCudaRandom()
    cuda.install(monkeypatch)
    masks = []

    def block(x):  # dropout on GPU 0: its mask comes from GPU 0's generator
        masks.append(torch.rand(x.shape, generator=cuda.gens[0]) >= 0.5)
        return x * masks[-1] * 2.0

    x = torch.randn(6, 5, generator=torch.Generator().manual_seed(1)).as_subclass(OnGpu).requires_grad_(True)
    assert x.device.type == "cuda"
    y = CheckpointFunction.apply(block, x)
    torch.rand(3, generator=cuda.gens[0])  # the caller goes on drawing (the next blocks' dropout)
    caller = cuda.gens[0].get_state()
    cpu = torch.get_rng_state()
    y.backward(torch.ones(6, 5))
    assert len(masks) == 2, f"the block ran {len(masks)} times (a forward pass and one recomputation expected)"
    assert torch.equal(masks[1], masks[0]), (
        "the recomputation drew another dropout mask than the forward pass: on a GPU dropout draws from the "
        "generator of the inputs' GPU (torch.cuda.get_rng_state / set_rng_state for that device), not only the CPU's")
    assert torch.equal(x.grad.as_subclass(torch.Tensor), masks[0] * 2.0), "the input's gradient is mask x 2"
    assert torch.equal(cuda.gens[0].get_state(), caller), (
        "the recomputation moved the caller's GPU random stream: restore the saved GPU state inside "
        "torch.random.fork_rng(devices=[the inputs' GPUs]), which puts the caller's back afterwards")
    assert torch.equal(torch.get_rng_state(), cpu), "the recomputation moved the caller's CPU random stream"
