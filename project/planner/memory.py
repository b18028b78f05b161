"""Memory per rank as the runner holds it: model state, and the activations the schedule keeps in flight.

* **Model state** (:func:`memory.accounting.model_state_bytes`): 4 + 4 + 8 bytes per parameter in fp32, 2 + 2 + 12 in
  mixed precision, divided by dp x cp where the ZeRO stage shards them (Rajbhandari et al. 2020, Table 1).
* **Activations per layer** (:func:`layer_activations`), by part, as Korthikanti et al. 2022 count them (Sec. 4,
  Table 2), extended to Llama's block: grouped-query K and V, the SwiGLU's saved tensors, FlashAttention's output
  and log-sum-exp instead of the ``s x s`` scores (Dao et al. 2022, Sec. 3.1), and each recomputation policy —
  none, selective (the attention core recomputed, Korthikanti et al. 2022, Sec. 5), every other matrix product
  (torchtitan's ``selective op`` policy) and full (each block's input kept, Sec. 4.3).
* **In flight** (:func:`in_flight_bytes`): the peak over one step of the activations a stage holds, walked along the
  same action lists the runner executes (``pipeline.SCHEDULES``): a (chunk, micro-batch) pair is held from its
  ``F`` to its ``B`` — or, where the list splits the backward, to its ``W``, since the course's runner keeps the
  graph until the weight gradient (ZB-H1). The first stage's embedding output (its dropout mask) and the last
  stage's head (its input and the fp32 logits of the cross-entropy) are held per micro-batch in flight like the
  blocks': GPipe's last stage holds all ``m`` micro-batches' logits.

:data:`ALLOCATOR_HEADROOM` of the device is left for the allocator's fragmentation, the CUDA context and the
communication buffers: a plan fits when its largest stage needs at most the rest.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from project.planner.layout import pipeline_actions, sizes, stage_layout

# Fraction of the device kept free for what the planner does not count (the caching allocator's fragmentation, the
# CUDA context, NCCL's buffers, the backward pass's transient gradients). A stated assumption, not a measurement:
# the course's GPU report measures the one-GPU step's peak against the planner's (project/tools/gpu_report.py).
ALLOCATOR_HEADROOM = 0.10
POLICIES = ("none", "attention", "alternate", "full")


RECOMPUTE_NAMES = {"none": "none", "attention": "the attention core (selective)",
                   "alternate": "every other matrix product (torchtitan's op policy)", "full": "every block (full)"}


def recompute_policy(config) -> str:
    """``none``, ``attention`` (Korthikanti et al.'s selective recomputation), ``alternate`` (every other matrix
    product and every elementwise operation: torchtitan's ``selective op`` policy) or ``full``."""
    if config.activation_checkpointing:
        return "full"
    return {"none": "none", "attention": "attention", "matmuls": "alternate"}[config.selective_checkpointing]


def linear_layers(config) -> list[tuple[str, int, int]]:
    """One block's matrix products in forward order, on one tp rank: ``(name, K, N)`` for ``x (T x K) @ W (K x N)``
    — GPT-2 (and Megatron-LM): the fused QKV, the output projection, the MLP's two; Llama (torchtitan's and
    transformers' modules): ``wq, wk, wv, wo`` and the SwiGLU's ``w1`` (gate), ``w3`` (up), ``w2`` (down)."""
    z = sizes(config)
    q, kv = z.a_t * z.d, z.kv_t * z.d
    if config.model.mlp == "swiglu":
        return [("wq", z.h, q), ("wk", z.h, kv), ("wv", z.h, kv), ("wo", q, z.h), ("w1", z.h, z.f_t),
                ("w3", z.h, z.f_t), ("w2", z.f_t, z.h)]
    return [("qkv", z.h, q + 2 * kv), ("proj", q, z.h), ("fc", z.h, z.f_t), ("fc_proj", z.f_t, z.h)]


def layer_activations(config, policy: str | None = None) -> dict[str, float]:
    """Bytes one block keeps for its backward pass, for one micro-batch, on one tp rank, by part:
    ``norm inputs``, ``dropout masks``, ``linear inputs`` (the QKV's and the MLP's first input), ``q k v``,
    ``attention output``, ``scores`` (softmax output and its dropout, or FlashAttention's log-sum-exp), ``mlp``
    and, under recomputation, ``kept for recomputation`` (the block's input; with the ``alternate`` policy also
    the outputs of the products it keeps). ``config.activation_model`` ``korthikanti`` (Megatron-LM's blocks) or
    ``course`` (transformers' GPT-2 blocks the course trains: its tanh GeLU keeps four inner-width tensors, and its
    column-parallel layer keeps the gathered input under sequence parallelism); equal to
    :func:`memory.accounting.layer_activation_bytes` for GPT-2 blocks (``tests/plan``). The norms' statistics are
    left out, as there."""
    policy = policy or recompute_policy(config)
    z, model = sizes(config), config.model
    e, t = z.e, z.t
    sp = t if config.sequence_parallel else 1
    m = z.mask if config.dropout > 0 else 0
    x = z.tokens * z.h                                      # one hidden state of the micro-batch (elements)
    if policy == "full":
        return {"kept for recomputation": e * x / sp}
    fused = config.fused_kernels
    if model.mlp == "swiglu":
        mlp = (3 if fused else 4) * e * z.tokens * z.f_t   # gate, up (and silu(gate) in eager) and the product
    else:
        mlp = (2 + (3 if config.activation_model == "course" else 0)) * e * z.tokens * z.f_t
    scores = 0.0
    if config.attention_kernel == "eager":
        elements = z.b * z.a_t * z.s * z.S / config.cp
        scores = elements * (e + (e + m if config.dropout > 0 else 0))
    else:
        scores = 4.0 * z.b * z.a_t * z.s                   # the fp32 log-sum-exp per query and head
    parts = {"norm inputs": 2 * e * x / sp, "dropout masks": 2 * m * x / sp,
             "linear inputs": 2 * e * x / (sp if config.activation_model == "korthikanti" else 1),
             "q k v": e * z.tokens * (z.a_t + 2 * z.kv_t) * z.d, "attention output": e * z.tokens * z.a_t * z.d,
             "scores": scores, "mlp": mlp}
    if policy == "attention" and config.attention_kernel == "eager":
        parts["scores"] = 0.0                               # the attention core is recomputed from Q, K, V
    if policy == "alternate":                               # every odd-numbered product's output and attention's
        kept = sum(e * z.tokens * n for i, (_, _, n) in enumerate(linear_layers(config)) if i % 2 == 0)
        parts = {"kept for recomputation": e * x / sp + kept, "attention output": parts["attention output"],
                 "scores": scores if config.attention_kernel != "eager" else 0.0}
    return parts


def stage_extra_activations(config, stage: int) -> dict[str, float]:
    """Per micro-batch, beyond the blocks: the embedding's dropout mask (first stage) and the head's input
    (final norm and LM head, gathered over tp) with the fp32 logits of the cross-entropy (Korthikanti et al.
    2022, Sec. 4.3: ``4 s b v / t``) on the last stage. Bytes."""
    z = sizes(config)
    out = {}
    if stage == 0 and config.dropout > 0:
        out["embedding dropout mask"] = z.mask * z.tokens * z.h / (z.t if config.sequence_parallel else 1)
    if stage == config.pp - 1:
        out["head input"] = 2 * z.e * z.tokens * z.h
        out["logits (fp32)"] = 4.0 * z.tokens * z.V_t
    return out


def held_until(actions) -> list[tuple[int, tuple]]:
    """The action list as changes of what is held: ``[(+1 or -1, (chunk, micro-batch))]``: ``F`` takes a pair, and
    the pair is let go at its ``W`` if the list has one for it (the runner keeps the graph for the weight
    gradient), else at its ``B`` (or ``BW``); a pair ``("F&B", forward, backward)`` is its two actions."""
    from pipeline.metrics import flatten_pairs

    flat = flatten_pairs(actions)
    key = lambda a: (a[2] if len(a) > 2 else 0, a[1])  # noqa: E731
    weighted = {key(a) for a in flat if a[0] == "W"}
    out = []
    for a in flat:
        if a[0] == "F":
            out.append((1, key(a)))
        elif a[0] == "W" or (a[0] in ("B", "BW") and key(a) not in weighted):
            out.append((-1, key(a)))
    return out


def peak_held(actions) -> int:
    """Most (chunk, micro-batch) pairs held at once along one stage's action list (:func:`held_until`), counted
    after each action as the runner counts them (``pipeline.stage_runner.StepResult.peak_in_flight``; a pair
    ``("F&B", forward, backward)`` runs as its forward, then its backward)."""
    held = peak = 0
    for sign, _ in held_until(actions):
        held += sign
        peak = max(peak, held)
    return peak


def in_flight(config, stage: int) -> int:
    """Most (chunk, micro-batch) pairs stage ``stage`` holds at once (:func:`peak_held` of its action list)."""
    return peak_held(pipeline_actions(config)[stage])


def in_flight_bytes(config, stage: int, unit: dict[int, float]) -> tuple[float, int]:
    """``(peak bytes, pairs held at that peak)`` of stage ``stage`` along its action list, a pair of chunk ``c``
    weighing ``unit[c]`` bytes (:func:`held_until`)."""
    held, peak, count, best = 0.0, 0.0, 0, 0
    for sign, (chunk, _) in held_until(pipeline_actions(config)[stage]):
        held += sign * unit[chunk]
        count += sign
        if held > peak:
            peak, best = held, count
    return peak, best


@dataclass
class StageMemory:
    """Bytes one rank of a stage holds: model state, ``activations`` (at their peak in flight) and ``recompute``
    (the recomputed block's activations during its backward, for a moment); ``parts`` splits the activations of
    one micro-batch by part (:func:`layer_activations` summed over the stage's blocks, and the stage's extras)."""

    params: float
    grads: float
    optimizer: float
    activations: float
    recompute: float
    in_flight: int
    parts: dict = field(default_factory=dict)

    @property
    def total(self) -> float:
        return self.params + self.grads + self.optimizer + self.activations + self.recompute

    def categories(self) -> dict[str, float]:
        return {"params": self.params, "grads": self.grads, "optimizer": self.optimizer,
                "activations": self.activations, "recompute": self.recompute}


def stage_memory(config, stage: int) -> StageMemory:
    """Bytes one rank of ``stage`` holds (module docstring). Adam's step counters (4 bytes per parameter tensor)
    are left out."""
    from memory.accounting import model_state_bytes

    lay = stage_layout(config, stage)
    dense = model_state_bytes(config.zero, lay.dense_params, config.dp * config.cp, config.precision)
    experts = model_state_bytes(config.zero, lay.expert_params, config.dp * config.cp // config.ep, config.precision)
    per_layer = layer_activations(config)
    chunks = config.virtual_stages if config.pp > 1 else 1  # one stage runs its micro-batches whole
    chunk = {k: v * lay.blocks / chunks for k, v in per_layer.items()}
    extra = stage_extra_activations(config, stage)
    unit = {c: sum(chunk.values()) for c in range(chunks)}
    if "embedding dropout mask" in extra:
        unit[0] += extra["embedding dropout mask"]
    head = extra.get("head input", 0.0) + extra.get("logits (fp32)", 0.0)
    unit[chunks - 1] += head
    peak, count = in_flight_bytes(config, stage, unit)
    policy = recompute_policy(config)
    recompute = 0.0
    if policy in ("full", "alternate"):
        recompute = sum(layer_activations(config, "none").values())
    elif policy == "attention":
        recompute = layer_activations(config, "none")["scores"]
    return StageMemory(params=dense["params"] + experts["params"], grads=dense["grads"] + experts["grads"],
                       optimizer=dense["optimizer"] + experts["optimizer"], activations=peak, recompute=recompute,
                       in_flight=count, parts={**chunk, **extra})
