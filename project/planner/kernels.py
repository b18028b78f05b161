"""Every kernel of a training step, as a list: FLOPs, bytes and, for matrix products, the shape.

For one micro-batch on one rank of a pipeline stage, :func:`stage_kernels` lists the kernels of the forward pass
(``F``), the backward pass (``B``: the inputs' gradients, and the recomputed forward ``R`` the policy asks for),
the weights' gradients (``W``: separate so that ZB-H1 can defer them) and, once per step, the optimizer (``O``):

* **matrix products** (:func:`project.planner.memory.linear_layers`: GPT-2's fused QKV or Llama's ``wq wk wv``, the
  output projection, the MLP's two or three), each forward ``(T x K) @ (K x N)`` and its two gradients, and the LM
  head's; ``2 M N K`` FLOPs, ``e (M K + K N + M N)`` bytes;
* **attention**: FlashAttention (Dao et al. 2022; one kernel forward, one backward of 2.5 times its FLOPs, which
  recomputes the scores: Dao 2023, Sec. 4.1; causal: the blocks above the diagonal are skipped, so ``1/2 + 64/S`` of
  the ``s x S`` products are done with its 128-row blocks) or the unfused path (``Q K^T`` and ``P V`` as batched
  products over the full ``s x S`` — causal masking saves nothing there — with the scaling, mask, softmax and
  dropout as memory-bound kernels over the scores: transformers' eager GPT-2 as separate kernels, Megatron-LM's
  fused scale-mask-softmax as one);
* **memory-bound kernels** (bytes read and written, no FLOPs counted): the norms, residual adds, dropouts, GeLU (the
  course's blocks run transformers' tanh GeLU, eight operations; ``--activation_model korthikanti`` torch's or
  Megatron-LM's, one kernel) or SwiGLU, rotary embeddings, Llama's ``repeat_kv`` for grouped-query attention, the embedding lookup, the
  cross-entropy over this rank's vocabulary (fp32 logits), and AdamW's update (each of the parameter, gradient and
  two moments read once and the parameter and moments written once, in fp32 with a bf16 copy in mixed precision,
  plus a read of the gradient for the norm clip and a write to zero it: 36 bytes per parameter). ``eager`` runs
  each elementwise operation as its own kernel; ``--fused_kernels`` (torch.compile, Megatron-LM's fused kernels)
  reads each chain's inputs once and writes its outputs once. The norms follow ``--norm_kernel``: one kernel
  (LayerNorm, a fused RMSNorm) or RMSNorm as the reference Llama code writes it (torchtitan's ``RMSNorm``,
  transformers' ``LlamaRMSNorm``: the input cast to fp32, squared, averaged, ``rsqrt``, multiplied, cast back,
  times the weight — eight kernels, :func:`norm_bytes`).

Per-element byte counts are those of the operations as the frameworks run them; they are counts, not fitted
numbers.
"""
from __future__ import annotations

from project.planner.layout import sizes, stage_layout
from project.planner.memory import linear_layers, recompute_policy
from project.planner.pricing import Kernel

ADAM_BYTES = 36  # per parameter and step (module docstring)
FLASH_BLOCK = 128  # FlashAttention-2's query / key block (rows)


def attention_kernel(config) -> str:
    """``flash`` or ``eager``: ``--attention_kernel``, where ``auto`` is eager for the course's own GPT-2 blocks
    (``--activation_model course``: transformers' eager attention) and flash elsewhere; context parallelism is
    always blockwise (an online softmax keeps no ``s x S`` scores)."""
    return config.attention_kernel


def gemm(name: str, phase: str, m: int, n: int, k: int, e: int, batch: int = 1, extra_bytes: float = 0.0) -> Kernel:
    return Kernel(name, "gemm", phase, 2.0 * m * n * k * batch, e * batch * (m * k + k * n + m * n) + extra_bytes,
                  (m, n, k, batch))


def memory(name: str, phase: str, nbytes: float) -> Kernel:
    return Kernel(name, "memory", phase, 0.0, float(nbytes))


def linear_kernels(config, name: str, k: int, n: int, tokens: int, e: int) -> list[Kernel]:
    """A linear layer's forward, input gradient and weight gradient (accumulated into an fp32 gradient)."""
    return [gemm(name, "F", tokens, n, k, e), gemm(f"{name} (input grad)", "B", tokens, k, n, e),
            gemm(f"{name} (weight grad)", "W", k, n, tokens, e, extra_bytes=8.0 * k * n - e * k * n)]


def attention_kernels(config) -> list[Kernel]:
    """The attention core of one block (module docstring)."""
    z = sizes(config)
    e, bh = z.e, z.b * z.a_t
    S = z.S if config.cp == 1 else z.S  # every query attends to the whole sequence's keys
    if attention_kernel(config) == "flash":
        causal = 0.5 + FLASH_BLOCK / (2 * z.S) if z.S > FLASH_BLOCK else 1.0
        flops = 4.0 * bh * z.s * S * z.d * causal
        read = e * z.b * (z.s * z.a_t * z.d + 2 * S * z.kv_t * z.d)
        moved = read + e * z.tokens * z.a_t * z.d + 4.0 * bh * z.s
        return [Kernel("flash attention", "attention", "F", flops, moved, (S,)),
                Kernel("flash attention (backward)", "attention", "B", 2.5 * flops, 2 * moved, (S,))]
    scores = bh * z.s * S
    m = z.mask if config.dropout > 0 else 0
    dropout = (2 * e + m) * scores if config.dropout > 0 else 0.0
    fwd_bytes, bwd_bytes = (2 * e, 3 * e) if config.fused_kernels else (7 * e, 7 * e)
    out = [gemm("q k^T", "F", z.s, S, z.d, e, bh),
           memory("scale, mask, softmax, dropout", "F", fwd_bytes * scores + dropout),
           gemm("p v", "F", z.s, z.d, S, e, bh),
           gemm("p v (grads)", "B", z.s, S, z.d, e, bh), gemm("p v (grads)", "B", S, z.d, z.s, e, bh),
           memory("scale, mask, softmax, dropout (backward)", "B", bwd_bytes * scores + dropout),
           gemm("q k^T (grads)", "B", z.s, z.d, S, e, bh), gemm("q k^T (grads)", "B", S, z.d, z.s, e, bh)]
    return out


def norm_bytes(config) -> tuple[float, float]:
    """Bytes per element of one norm, ``(forward, backward)``: one kernel reads its input and writes its output
    (``2e``; backward ``3e``: the output's gradient and the input read, the input's gradient written), or, with
    ``--norm_kernel composite``, RMSNorm's eight operations on fp32 intermediates (4 bytes):

    forward ``x.float()`` e+4, ``pow(2)`` 8, ``mean`` 4, ``x * rsqrt`` 8, ``type_as`` 4+e, ``* weight`` 2e: 4e + 28;
    backward, the same in reverse through autograd: the weight's product 2e and its gradient 4e, the cast e+4, the
    ``rsqrt`` product 8 and its row sum 16, ``mean``'s expansion 4, ``pow``'s 12, the two gradients added 12, the
    cast back 4+e: 8e + 60."""
    e = sizes(config).e
    if config.norms == "composite":
        return 4 * e + 28, 8 * e + 60
    return 2 * e, 3 * e


def elementwise_kernels(config) -> list[Kernel]:
    """The memory-bound kernels of one block, forward and backward (module docstring)."""
    z, model = sizes(config), config.model
    e, fused = z.e, config.fused_kernels
    x = z.tokens * z.h / (z.t if config.sequence_parallel else 1)   # a hidden state (split with SP)
    f = z.tokens * z.f_t
    m = z.mask if config.dropout > 0 else 0
    norm_f, norm_b = norm_bytes(config)
    out = [memory("norms", "F", 2 * norm_f * x), memory("norms (backward)", "B", 2 * norm_b * x)]
    if config.dropout > 0 and fused:  # Megatron-LM's bias-dropout-add: one kernel per residual
        out += [memory("dropout + residual", "F", 2 * (3 * e + m) * x),
                memory("dropout + residual (backward)", "B", 2 * (2 * e + m) * x + 2 * 3 * e * x)]
    else:
        out += [memory("residual adds", "F", 2 * 3 * e * x), memory("residual adds (backward)", "B", 2 * 3 * e * x)]
        if config.dropout > 0:
            out += [memory("dropouts", "F", 2 * (2 * e + m) * x), memory("dropouts (backward)", "B", 2 * (2 * e + m) * x)]
    if model.mlp == "swiglu":
        out += [memory("swiglu", "F", (3 if fused else 5) * e * f),
                memory("swiglu (backward)", "B", (5 if fused else 8) * e * f)]
    else:  # transformers' tanh GeLU (the course's blocks) is eight elementwise operations; torch's GeLU, Megatron's
        eight = config.activation_model == "course" and not fused  # bias-GeLU and a compiled one are one kernel
        out += [memory("gelu", "F", (18 if eight else 2) * e * f),
                memory("gelu (backward)", "B", (30 if eight else 3) * e * f)]
    if model.positions == "rotary":
        qk = z.tokens * (z.a_t + z.kv_t) * z.d
        out += [memory("rotary", "F", (2 if fused else 6) * e * qk),
                memory("rotary (backward)", "B", (2 if fused else 6) * e * qk)]
    if z.kv_t < z.a_t:  # repeat_kv: K and V copied to every query head (Llama's modules), summed back in backward
        copy = e * z.tokens * z.d * 2 * (z.kv_t + z.a_t)
        out += [memory("repeat_kv", "F", copy), memory("repeat_kv (backward)", "B", copy)]
    return out


def block_kernels(config) -> list[Kernel]:
    """One block's kernels for one micro-batch on one rank, with the recomputed forward (phase ``R``) of the
    recomputation policy (:func:`project.planner.memory.recompute_policy`)."""
    z = sizes(config)
    linears = []
    for i, (name, k, n) in enumerate(linear_layers(config)):
        linears.append(linear_kernels(config, name, k, n, z.tokens, z.e))
    attention, elementwise = attention_kernels(config), elementwise_kernels(config)
    out = [k for group in linears for k in group] + attention + elementwise
    policy = recompute_policy(config)
    forward = [k for k in out if k.phase == "F"]
    if policy == "full":
        again = forward
    elif policy == "attention":
        again = [k for k in attention if k.phase == "F"] if attention_kernel(config) == "eager" else []
    elif policy == "alternate":  # every other product (the 2nd, 4th, ...) and every elementwise kernel
        again = [group[0] for i, group in enumerate(linears) if i % 2 == 1] + [k for k in elementwise if k.phase == "F"]
    else:
        again = []
    return out + [Kernel(k.name, k.kind, "R", k.flops, k.bytes, k.shape) for k in again]


def stage_kernels(config, stage: int) -> list[Kernel]:
    """Every kernel of one micro-batch on one rank of ``stage`` (all its chunks), counted per micro-batch, and the
    optimizer's once per step (phase ``O``, ``count`` 1 / micro-batches so that the per-micro-batch sums times the
    micro-batches give one step)."""
    z, lay, model = sizes(config), stage_layout(config, stage), config.model
    e, tokens = z.e, z.tokens
    out = [k.times(lay.blocks - lay.moe_blocks) for k in block_kernels(config)]
    if lay.moe_blocks:  # routed experts: the MLP's products over top_k copies of the tokens, balanced over ep
        routed = tokens * config.top_k
        for name, k, n in linear_layers(config)[(4 if model.mlp == "swiglu" else 2):]:
            down = name in ("w2", "fc_proj")  # the expert holds its whole MLP: undo tp's split of the width
            k_e, n_e = (k * config.tp, n) if down else (k, n * config.tp)
            out += [kernel.times(lay.moe_blocks) for kernel in linear_kernels(config, f"expert {name}", k_e, n_e, routed, e)]
        attention_only = [k for k in block_kernels(config) if not k.name.startswith(("w1", "w3", "w2", "fc"))]
        out += [k.times(lay.moe_blocks) for k in attention_only]
    x = tokens * z.h
    if lay.embedding:
        out += [memory("embedding", "F", 2 * e * x + (3 * e * x if z.P else 0)),
                memory("embedding (backward)", "B", x * (e + 8) + (e * x if z.P else 0))]
    if lay.head:
        norm_f, norm_b = norm_bytes(config)
        out += [memory("final norm", "F", norm_f * x), memory("final norm (backward)", "B", norm_b * x)]
        out += linear_kernels(config, "lm head", z.h, z.V_t, tokens, e)
        logits = tokens * z.V_t
        out += [memory("cross-entropy (fp32)", "F", (e + 12) * logits),
                memory("cross-entropy (backward)", "B", (e + 16) * logits)]
    params = lay.dense_params / (config.dp * config.cp if config.zero >= 1 else 1)
    params += lay.expert_params / (config.dp * config.cp // config.ep if config.zero >= 1 else 1)
    out.append(Kernel("adamw", "optimizer", "O", 0.0, ADAM_BYTES * params, None, 1.0 / config.micro_batches))
    return out


def stage_flops(config, stage: int, *, model_only: bool = False) -> float:
    """FLOPs one rank of ``stage`` computes per step: the kernels' (hardware FLOPs: recomputation and attention as
    they run), or with ``model_only`` the model FLOPs of PaLM's MFU (``6 N + 12 L a d s`` per token, this rank's
    share: Chowdhery et al. 2022, App. B)."""
    z, lay = sizes(config), stage_layout(config, stage)
    if not model_only:
        return sum(k.flops * k.count for k in stage_kernels(config, stage)) * config.micro_batches
    dense = lay.blocks - lay.moe_blocks
    block = sum(2 * k * n for _, k, n in linear_layers(config))
    mlp = sum(2 * k * n for name, k, n in linear_layers(config) if name in ("w1", "w3", "w2", "fc", "fc_proj"))
    per_token = dense * block + lay.moe_blocks * (block - mlp + config.top_k * mlp * config.tp)
    per_token += lay.blocks * 4 * z.a_t * z.d * z.S       # attention's two products, forward
    if lay.head:
        per_token += 2 * z.V_t * z.h
    return 3 * per_token * tokens_per_step(config)


def tokens_per_step(config) -> float:
    """Tokens one rank of a stage processes per step: ``b s`` per micro-batch, ``micro_batches`` of them."""
    z = sizes(config)
    return z.tokens * config.micro_batches
