"""The model shapes the planner takes: GPT-2's block and Llama's, by preset or by size.

A :class:`ModelShape` says what a transformer block is made of, not just its width: the MLP (GPT-2's GeLU of
width ``n_inner``, Llama's SwiGLU of width ``n_inner``: three matrices), the attention heads and the key/value
heads (``n_kv_head < n_head``: grouped-query attention, Ainslie et al. 2023; ``1``: multi-query), the norm
(LayerNorm with a bias, RMSNorm without), the positions (learned embeddings, or rotary: no parameters), biases
in the linear layers (GPT-2's) or none (Llama's), and whether the LM head is the embedding's matrix (tied) or
its own. Its parameter counts equal ``transformers``' ``GPT2LMHeadModel`` and ``LlamaForCausalLM`` of the same
configuration (``tests/plan/test_model_shapes.py`` builds both on the meta device).

Presets (:data:`MODELS`):

* the course's GPT-2 presets (:data:`course.model.PRESETS`: ``tiny``, ``small``, ``gpt2``, ``gpt2-xl``,
  ``gpt3-6.7b``, and ``llama-7b``: GPT-2 blocks at Llama-7B's size), which the fake world and ``--measure``
  build;
* ``gpt2-medium`` and ``gpt2-large``: Radford et al. 2019, Table 2 (24 x 1024, 36 x 1280; 16 and 20 heads);
* ``llama3.2-3b``, ``llama3-8b``, ``llama3-70b``, ``llama3-405b``: Llama 3 / 3.1 (Dubey et al. 2024, "The Llama 3
  Herd of Models", Table 3: 32 x 4096, 80 x 8192, 126 x 16384, MLP 14336, 28672, 53248, 32 / 64 / 128 heads, 8
  key/value heads, vocabulary 128,256; Llama 3.1 keeps the shapes) and Llama 3.2 3B (its model card's
  configuration: 28 x 3072, MLP 8192, 24 heads, 8 key/value heads, tied head).

A free shape starts from a preset and replaces sizes: ``--n_layer --n_embd --n_head --n_kv_head --n_inner
--mlp --vocab_size`` (:meth:`ModelShape.replace`).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

GPT2 = "Radford et al. 2019, GPT-2, Table 2"
LLAMA3 = "Dubey et al. 2024, The Llama 3 Herd of Models, Table 3"


@dataclass(frozen=True)
class ModelShape:
    """One decoder-only transformer's shape (sizes in elements; see the module docstring).

    Attributes:
        n_layer, n_embd, n_head, n_kv_head, n_inner: blocks, width ``h``, query heads ``a``, key/value heads,
            MLP width ``f``.
        mlp: ``"gelu"`` (two matrices ``h x f``, ``f x h``) or ``"swiglu"`` (three: gate, up, down).
        norm: ``"layernorm"`` (weight and bias) or ``"rmsnorm"`` (weight only).
        positions: ``"learned"`` (an ``n_positions x h`` table) or ``"rotary"`` (none).
        tied: the LM head is the token embedding's matrix.
        bias: the linear layers have biases (GPT-2's attention and MLP).
        vocab_size: the preset's vocabulary (None: the course tokenizer's, ``--vocab_size``).
        source: where the shape comes from.
    """

    n_layer: int
    n_embd: int
    n_head: int
    n_kv_head: int
    n_inner: int
    mlp: str = "gelu"
    norm: str = "layernorm"
    positions: str = "learned"
    tied: bool = True
    bias: bool = True
    vocab_size: int | None = None
    source: str = ""

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_head

    @property
    def kv_width(self) -> int:
        """Width of the keys (and of the values): ``n_kv_head x head_dim``."""
        return self.n_kv_head * self.head_dim

    @property
    def norm_params(self) -> int:
        return 2 * self.n_embd if self.norm == "layernorm" else self.n_embd

    def replace(self, **sizes) -> "ModelShape":
        """This shape with the given fields replaced (None values ignored); ``n_embd`` without ``n_inner`` keeps
        GPT-2's ``4 h`` for a GeLU MLP; ``n_head`` without ``n_kv_head`` keeps multi-head attention when the
        preset had it."""
        sizes = {k: v for k, v in sizes.items() if v is not None}
        if "n_embd" in sizes and "n_inner" not in sizes and self.mlp == "gelu":
            sizes["n_inner"] = 4 * sizes["n_embd"]
        if "n_head" in sizes and "n_kv_head" not in sizes and self.n_kv_head == self.n_head:
            sizes["n_kv_head"] = sizes["n_head"]
        return dataclasses.replace(self, **sizes, source=f"{self.source}, resized" if sizes else self.source)

    def check(self) -> None:
        """Raises ValueError naming what to change: heads that do not divide the width, key/value heads that
        do not divide the query heads, an unknown MLP, norm or positions."""
        if min(self.n_layer, self.n_embd, self.n_head, self.n_kv_head, self.n_inner) < 1:
            raise ValueError("--n_layer, --n_embd, --n_head, --n_kv_head and --n_inner must be >= 1")
        if self.n_embd % self.n_head:
            raise ValueError(f"the width {self.n_embd} does not split into {self.n_head} heads: change --n_embd or "
                             f"--n_head")
        if self.n_head % self.n_kv_head:
            raise ValueError(f"{self.n_kv_head} key/value heads do not divide the {self.n_head} query heads (grouped-"
                             f"query attention shares each among a whole group): change --n_kv_head")
        for name, value, allowed in (("mlp", self.mlp, ("gelu", "swiglu")), ("norm", self.norm, ("layernorm", "rmsnorm")),
                                     ("positions", self.positions, ("learned", "rotary"))):
            if value not in allowed:
                raise ValueError(f"--{name} must be one of {allowed}, not {value!r}")

    # ---- parameters ----------------------------------------------------------------------------------

    def attention_params(self) -> int:
        """One block's attention: Q, K, V and the output projection (with GPT-2's biases)."""
        h, kv = self.n_embd, self.kv_width
        return h * (h + 2 * kv) + h * h + ((h + 2 * kv) + h if self.bias else 0)

    def mlp_params(self) -> int:
        h, f = self.n_embd, self.n_inner
        if self.mlp == "swiglu":
            return 3 * h * f + (2 * f + h if self.bias else 0)
        return 2 * h * f + (f + h if self.bias else 0)

    def block_params(self) -> int:
        return self.attention_params() + self.mlp_params() + 2 * self.norm_params

    def parameters(self, vocab_size: int, n_positions: int) -> dict[str, int]:
        """``{"embedding", "positions", "blocks", "final_norm", "head", "total"}``: the head is 0 when tied (the
        embedding's matrix, counted once, as ``model.parameters()`` does)."""
        parts = {"embedding": vocab_size * self.n_embd,
                 "positions": n_positions * self.n_embd if self.positions == "learned" else 0,
                 "blocks": self.n_layer * self.block_params(), "final_norm": self.norm_params,
                 "head": 0 if self.tied else vocab_size * self.n_embd}
        return parts | {"total": sum(parts.values())}

    def matmul_weights(self, vocab_size: int) -> dict[str, int]:
        """The weights that multiply activations, per token: ``{"blocks", "head"}`` (no embedding lookup, biases,
        norms or positions): the ``N`` of ``6 N`` (Kaplan et al. 2020, Sec. 2.1; Chowdhery et al. 2022, App. B)."""
        h, kv, f = self.n_embd, self.kv_width, self.n_inner
        per_block = h * (h + 2 * kv) + h * h + (3 if self.mlp == "swiglu" else 2) * h * f
        return {"blocks": self.n_layer * per_block, "head": vocab_size * h}

    def model_flops_per_token(self, vocab_size: int, seq_len: int) -> float:
        """Model FLOPs of one token's forward and backward pass as PaLM defines them for MFU (Chowdhery et al.
        2022, App. B): ``6 N + 12 L a d s`` — every multiplying weight 2 FLOPs forward and 4 backward, and
        attention's two ``s x s`` products over the query width ``a d`` (causal attention counted whole, no
        recomputation)."""
        n = sum(self.matmul_weights(vocab_size).values())
        return 6.0 * n + 12.0 * self.n_layer * self.n_head * self.head_dim * seq_len

    # ---- transformers' configuration (for the parameter-count test) ----------------------------------------

    def transformers_config(self, vocab_size: int, n_positions: int):
        """The ``transformers`` configuration of this shape: ``GPT2Config`` for GPT-2 blocks, ``LlamaConfig`` for
        Llama blocks.

        Raises:
            ValueError: a mix the two libraries' models do not build (e.g. SwiGLU with learned positions)."""
        if (self.mlp, self.norm, self.positions, self.bias) == ("gelu", "layernorm", "learned", True) and self.tied \
                and self.n_kv_head == self.n_head:
            from transformers import GPT2Config

            return GPT2Config(vocab_size=vocab_size, n_positions=n_positions, n_embd=self.n_embd,
                              n_layer=self.n_layer, n_head=self.n_head, n_inner=self.n_inner)
        if (self.mlp, self.norm, self.positions, self.bias) == ("swiglu", "rmsnorm", "rotary", False):
            from transformers import LlamaConfig

            return LlamaConfig(vocab_size=vocab_size, hidden_size=self.n_embd, intermediate_size=self.n_inner,
                               num_hidden_layers=self.n_layer, num_attention_heads=self.n_head,
                               num_key_value_heads=self.n_kv_head, tie_word_embeddings=self.tied,
                               max_position_embeddings=n_positions)
        raise ValueError(f"no transformers model has this block ({self.mlp}, {self.norm}, {self.positions}, "
                         f"bias={self.bias})")


def _gpt2(n_layer: int, n_embd: int, n_head: int, n_inner: int | None = None, source: str = GPT2,
          vocab_size: int | None = None) -> ModelShape:
    return ModelShape(n_layer, n_embd, n_head, n_head, n_inner or 4 * n_embd, vocab_size=vocab_size, source=source)


def _llama(n_layer: int, n_embd: int, n_head: int, n_kv_head: int, n_inner: int, tied: bool = False,
           source: str = LLAMA3) -> ModelShape:
    return ModelShape(n_layer, n_embd, n_head, n_kv_head, n_inner, mlp="swiglu", norm="rmsnorm", positions="rotary",
                      tied=tied, bias=False, vocab_size=128256, source=source)


def _course_presets() -> dict[str, ModelShape]:
    from course.model import PRESETS

    return {name: _gpt2(p["n_layer"], p["n_embd"], p["n_head"], p.get("n_inner"), source=f"course.model.PRESETS[{name!r}]")
            for name, p in PRESETS.items()}


MODELS: dict[str, ModelShape] = _course_presets() | {
    "gpt2-medium": _gpt2(24, 1024, 16, vocab_size=50257),
    "gpt2-large": _gpt2(36, 1280, 20, vocab_size=50257),
    "llama3.2-3b": _llama(28, 3072, 24, 8, 8192, tied=True,
                          source="Meta Llama 3.2 3B model card configuration (28 x 3072, MLP 8192, 24 heads, 8 key/"
                                 "value heads, tied embeddings)"),
    "llama3-8b": _llama(32, 4096, 32, 8, 14336),
    "llama3-70b": _llama(80, 8192, 64, 8, 28672),
    "llama3-405b": _llama(126, 16384, 128, 8, 53248),
}
MODELS["gpt2"] = dataclasses.replace(MODELS["gpt2"], source=f"{GPT2} (course.model.PRESETS['gpt2'])")
MODELS["gpt2-xl"] = dataclasses.replace(MODELS["gpt2-xl"], source=f"{GPT2} (course.model.PRESETS['gpt2-xl'])")
# the shapes the course's own runs build (course.model.build_gpt2): the fake world and --measure take only these
COURSE_PRESETS = tuple(_course_presets())
