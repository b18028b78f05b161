"""GPT-2 models built from named ``GPT2Config`` presets (no weights are downloaded).

Presets (``PRESETS``):

* ``tiny``   — 4 layers, 128 wide, 4 heads: the CPU default; an epoch of Multi30k
  takes a few minutes on 2 cores. Divisible for 2 or 4 pipeline stages and tp 2 or 4.
* ``small``  — 6 layers, 384 wide, 6 heads: a laptop-GPU size.
* ``gpt2``   — the 124M GPT-2 of Radford et al. 2019 (12 layers, 768 wide, 12 heads), for GPUs.
* ``gpt2-xl`` — the 1.5B GPT-2 (48 layers, 1600 wide, 25 heads; Radford et al. 2019, Table 2): a model
  for the planner (``python -m project.planner``) and for multi-GPU runs; 25 heads admit tp 1, 5 or 25 only.
* ``gpt3-6.7b`` — a 7B-class model: GPT-3 6.7B (32 layers, 4096 wide, 32 heads of 128; Brown et al.
  2020, Table 2.1), the GPT-2 architecture at that size (GPT-3's alternating locally banded sparse
  attention layers are not modelled: every layer attends densely here).
* ``llama-7b`` — GPT-2 blocks at Llama-7B's width, depth and heads (32 layers, 4096 wide, 32 heads; Touvron
  et al. 2023, Table 2), for the planner and the fake world (``python -m project.planner --preset llama-7b``). Llama's SwiGLU MLP has three
  4096 x 11008 matrices, 135.3M parameters per layer; the GPT-2 MLP here has two 4096 x 16384 ones, 134.2M
  (within 1 %), so its FLOPs and weight bytes are Llama's to 1 %; RMSNorm, rotary positions and the untied
  head are not modelled. Plan it with Llama's vocabulary of 32000 tokens (``--vocab_size 32000``, the
  planner's default for this preset).

The vocabulary size comes from the course tokenizer, and ``n_positions`` from
``--model_max_length``.
"""
from __future__ import annotations

from typing import Any

PRESETS: dict[str, dict[str, Any]] = {
    "tiny": dict(n_layer=4, n_embd=128, n_head=4),
    "small": dict(n_layer=6, n_embd=384, n_head=6),
    "gpt2": dict(n_layer=12, n_embd=768, n_head=12),
    "gpt2-xl": dict(n_layer=48, n_embd=1600, n_head=25),
    "gpt3-6.7b": dict(n_layer=32, n_embd=4096, n_head=32),
    "llama-7b": dict(n_layer=32, n_embd=4096, n_head=32, n_inner=16384),
}

DEFAULT_CPU_PRESET = "tiny"
DEFAULT_GPU_PRESET = "gpt2"


def default_preset(device_type: str) -> str:
    """``tiny`` on CPU, ``gpt2`` on CUDA."""
    return DEFAULT_GPU_PRESET if device_type == "cuda" else DEFAULT_CPU_PRESET


def gpt2_config(preset: str, vocab_size: int, n_positions: int = 128, dropout: float = 0.1, **overrides):
    """A ``transformers.GPT2Config`` for ``preset``.

    Args:
        preset: a key of ``PRESETS``.
        vocab_size: tokenizer vocabulary size (tokens).
        n_positions: longest sequence the model accepts (tokens).
        dropout: residual, embedding and attention dropout probability (0 for exact comparisons).
        **overrides: any other ``GPT2Config`` field (e.g. ``n_layer=2``).

    Raises:
        ValueError: unknown preset, or ``n_embd`` not divisible by ``n_head``.
    """
    from transformers import GPT2Config

    if preset not in PRESETS:
        raise ValueError(f"unknown preset {preset!r}; choose one of {sorted(PRESETS)}")
    fields = dict(PRESETS[preset])
    fields.update(overrides)
    if fields["n_embd"] % fields["n_head"]:
        raise ValueError(f"n_embd={fields['n_embd']} is not divisible by n_head={fields['n_head']}")
    return GPT2Config(vocab_size=vocab_size, n_positions=n_positions, resid_pdrop=dropout,
                      embd_pdrop=dropout, attn_pdrop=dropout, bos_token_id=None, eos_token_id=None,
                      **fields)


def build_gpt2(preset: str, vocab_size: int, n_positions: int = 128, dropout: float = 0.1, seed: int = 0,
               **overrides):
    """A freshly initialised ``transformers.GPT2LMHeadModel`` (same weights for the same seed).

    The model maps ``input_ids`` (batch, seq) to ``logits`` (batch, seq, vocab_size).
    Eager attention is used so that the single-device reference and the hand-written
    parallel versions compute attention the same way.
    """
    import torch
    from transformers import GPT2LMHeadModel

    config = gpt2_config(preset, vocab_size, n_positions, dropout, **overrides)
    config._attn_implementation = "eager"
    torch.manual_seed(seed)
    return GPT2LMHeadModel(config)


def estimate_parameters(preset: str, vocab_size: int, n_positions: int = 128, **overrides) -> int:
    """Parameters of the GPT-2 of ``preset`` without building it (tied embedding/head counted once):
    ``V h + P h + L (12 h^2 + 13 h) + 2 h`` for vocabulary V, positions P, width h, L blocks
    (inner width 4 h; Radford et al. 2019)."""
    fields = dict(PRESETS[preset], **overrides)
    h, layers = fields["n_embd"], fields["n_layer"]
    inner = fields.get("n_inner") or 4 * h
    per_block = 4 * h + (3 * h * h + 3 * h) + (h * h + h) + (h * inner + inner) + (inner * h + h)
    return vocab_size * h + n_positions * h + layers * per_block + 2 * h


def matmul_parameters(preset: str, vocab_size: int, **overrides) -> dict[str, int]:
    """The weights that take part in matrix products, per token: ``{"blocks": L (4 h^2 + 2 h inner),
    "head": V h}`` — attention's QKV (3 h^2) and output projection (h^2), the MLP's two matrices
    (2 h inner) in each of L blocks, and the LM head (tied to the embedding: V h; the embedding lookup
    itself multiplies nothing). Biases, layer norms and position embeddings are left out (O(h) per token)."""
    fields = dict(PRESETS[preset], **overrides)
    h, layers = fields["n_embd"], fields["n_layer"]
    inner = fields.get("n_inner") or 4 * h
    return {"blocks": layers * (4 * h * h + 2 * h * inner), "head": vocab_size * h}


def model_flops_per_token(preset: str, vocab_size: int, seq_len: int, **overrides) -> float:
    """Model FLOPs of one token's forward and backward pass: ``6 N + 12 L h s``.

    ``N`` = :func:`matmul_parameters` (blocks and LM head): each weight costs 2 FLOPs per token in the
    forward pass (a multiply and an add) and 4 in the backward pass (the input's and the weight's
    gradients); ``12 L h s`` is attention's ``Q K^T`` and ``softmax · V`` (2 · 2 s h FLOPs per token and
    layer forward, times 3). Activation recomputation is not counted (these are *model* FLOPs, the
    numerator of MFU; Chowdhery et al. 2022, PaLM, Appendix B; Narayanan et al. 2021, Sec. 5.1).
    The full s x s attention matrix is counted, as the course's eager attention computes it.
    """
    fields = dict(PRESETS[preset], **overrides)
    n = sum(matmul_parameters(preset, vocab_size, **overrides).values())
    return 6.0 * n + 12.0 * fields["n_layer"] * fields["n_embd"] * seq_len


def count_parameters(model) -> int:
    """Number of trainable parameters (tied weights counted once)."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


def parameter_fingerprint(model) -> str:
    """SHA-256 of every parameter's bytes, in order: equal on two ranks iff their weights are bit-identical."""
    import hashlib

    digest = hashlib.sha256()
    for p in model.parameters():
        digest.update(p.detach().cpu().contiguous().numpy().tobytes())
    return digest.hexdigest()
