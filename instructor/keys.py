"""The assignment keys: topic, notebook, points and dependencies, declared in one place.

This is the only list of the keys. The repository's ``conftest.py`` registers one pytest
marker per key from it (``pytest -k a5_1_2`` / ``-m a5_1_2`` select a key's tests), and it
is read by ``instructor/release.py`` (stub messages), ``instructor/grade.py`` (points), the
grading-integrity check and a test that keeps the README's table of keys in step with it
(docs/architecture.md, "Assignment keys").
"""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Key:
    key: str                 # e.g. "a5_1_2"; tests carry @pytest.mark.a5_1_2
    topic: str
    notebook: str
    points: int
    # keys whose code this key's tests also run: their stubs make this key's tests fail too, and this
    # key's grading copy keeps their reference solutions (instructor/submission.py)
    depends_on: tuple[str, ...] = field(default=())

    @property
    def number(self) -> str:
        """``5.1.2`` for ``a5_1_2``."""
        return self.key[1:].replace("_", ".")

    @property
    def marker(self) -> str:
        """``ASSIGN5_1_2`` — the name used in ``# BEGIN``/``# END`` markers."""
        return "ASSIGN" + self.key[1:]


DP, PP, TP = "notebooks/01_data_parallel.ipynb", "notebooks/02_pipeline_parallel.ipynb", "notebooks/03_tensor_parallel.ipynb"
COMM = "notebooks/04_communication.ipynb"
MEM = "notebooks/05_memory.ipynb"
THREE_D = "notebooks/06_3d_parallelism.ipynb"
CP = "notebooks/07_context_parallelism.ipynb"
MOE = "notebooks/08_mixture_of_experts.ipynb"
HANGS = "notebooks/10_debugging_hangs.ipynb"
FAILURES = "notebooks/11_training_through_failures.ipynb"

KEYS: dict[str, Key] = {k.key: k for k in [
    Key("a5_1_1", "dataset partitioning: Partition, DataPartitioner, partition_dataset", DP, 10),
    Key("a5_1_2", "process group set-up and all-reduce gradient averaging", DP, 10),
    Key("a5_1_3", "launching data-parallel training across processes", DP, 10, ("a5_1_1", "a5_1_2")),
    Key("a5_1_4", "DiLoCo: H inner AdamW steps per replica group, outer Nesterov SGD on the averaged pseudo-gradient",
        FAILURES, 10),
    Key("a5_2_1", "clock-cycle schedule _clock_cycles and module splitting _split_module", PP, 10),
    Key("a5_2_2", "Pipe.forward / Pipe.compute over per-stage workers", PP, 10, ("a5_2_1",)),
    Key("a5_2_3", "GPT-2 pipeline preparation (tied embedding / LM head included)", PP, 10, ("a5_2_1", "a5_2_2")),
    Key("a5_2_4", "multi-process pipeline with GPipe and 1F1B schedules", PP, 10, ("a5_2_3",)),  # rendezvous: GPT-2
    Key("a5_2_5", "interleaved 1F1B: virtual stages, Megatron's action order", PP, 10, ("a5_2_3", "a5_2_4")),
    Key("a5_2_6", "zero-bubble ZB-H1: backward split into input and weight gradients", PP, 10, ("a5_2_3", "a5_2_4")),
    Key("a5_2_7", "V-shaped schedules: DualPipeV (paired forward and backward) and ZB-V", PP, 10,
        ("a5_2_3", "a5_2_4", "a5_2_6")),
    Key("a5_3_1", "Megatron conjugate operators f and g, scatter/gather", TP, 10),
    Key("a5_3_2", "ColumnParallelLinear, RowParallelLinear", TP, 10, ("a5_3_1",)),
    Key("a5_3_3", "VocabParallelEmbedding and vocab-parallel cross-entropy", TP, 10, ("a5_3_1",)),
    Key("a5_3_4", "tensor-parallel GPT-2 block and model", TP, 10, ("a5_3_1", "a5_3_2", "a5_3_3")),
    Key("a5_3_5", "sequence parallelism", TP, 10, ("a5_3_1", "a5_3_2", "a5_3_3", "a5_3_4")),
    Key("a5_4_1", "ring all-reduce and recursive doubling from send/recv", COMM, 10),
    Key("a5_4_2", "bucketed gradient all-reduce overlapped with the backward pass", COMM, 10),
    Key("a5_4_3", "top-k gradient compression with error feedback", COMM, 10),
    Key("a5_4_4", "the first divergence of a hung run from its flight-recorder dumps", HANGS, 10),
    Key("a5_5_1", "ZeRO-1: optimizer state sharded over dp (flat padded buffer, slice step, all-gather)", MEM, 10),
    Key("a5_5_2", "ZeRO-2: gradients reduce-scattered, each rank keeps its slice", MEM, 10, ("a5_5_1",)),
    Key("a5_5_3", "ZeRO-3 / FSDP: parameters sharded, gathered per block in forward and backward", MEM, 10, ("a5_5_1",)),
    Key("a5_5_4", "activation checkpointing: drop a block's activations, recompute in backward", MEM, 10),
    Key("a5_5_5", "ZeRO++: int8 blockwise weight all-gather (qwZ), node-group secondary slices (hpZ), int8 "
        "gradient all-to-all (qgZ)", MEM, 10, ("a5_5_1", "a5_5_3")),
    Key("a5_6_1", "3D mesh rank arithmetic: coordinates and dp/pp/tp groups of a rank", THREE_D, 10),
    Key("a5_6_2", "tensor-parallel pipeline stage, activations peer-to-peer or scatter-gather", THREE_D, 10,
        ("a5_2_4", "a5_3_1", "a5_3_2", "a5_3_3", "a5_3_4")),
    Key("a5_6_3", "3D training step: dp-only averaging, tied sum, global grad-norm clip", THREE_D, 10,
        ("a5_2_4", "a5_3_1", "a5_3_2", "a5_3_3", "a5_3_4", "a5_6_2")),
    Key("a5_7_1", "blockwise attention with an online softmax (causal, by block), own backward", CP, 10),
    Key("a5_7_2", "ring attention across the cp group (overlapped, NCCL-safe), zig-zag load balance", CP, 10,
        ("a5_7_1",)),
    Key("a5_7_3", "Ulysses: all-to-all between sequence and head sharding", CP, 10),
    Key("a5_8_1", "router (top-k gating, capacity, auxiliary and z-losses) and single-process MoE layer", MOE, 10),
    Key("a5_8_2", "expert parallelism: count exchange, all-to-all dispatch and combine", MOE, 10, ("a5_8_1",)),
    Key("a5_8_3", "EP x DP on the mesh: dense and expert gradient groups; MoE GPT-2 training", MOE, 10,
        ("a5_8_1", "a5_8_2")),
    Key("a5_8_4", "DeepSeek-style MoE: sigmoid gating, selection bias and its update, group-limited routing, "
        "shared experts", MOE, 10, ("a5_8_1", "a5_8_2")),
]}

MARKERS = {k.marker: k for k in KEYS.values()}

# Markers that are not assignment keys.
OTHER_MARKERS = {
    "needs_solution": "ungraded, but calls reference-solution code (expected to fail in the student release "
                      "until the assignments are done)",
}


def marker_lines() -> list[str]:
    """The ``name: description`` lines pytest registers (``config.addinivalue_line("markers", ...)``)."""
    return ([f"{k.key}: Assignment {k.number} {k.topic}" for k in KEYS.values()]
            + [f"{name}: {text}" for name, text in OTHER_MARKERS.items()])


def requirements(key: str) -> set[str]:
    """The keys ``key`` depends on, directly or through other keys (``depends_on``, followed to the end)."""
    found, todo = set(), list(KEYS[key].depends_on)
    while todo:
        k = todo.pop()
        if k not in found:
            found.add(k)
            todo += KEYS[k].depends_on
    return found


def key_of_marker(name: str) -> Key | None:
    """The :class:`Key` of a marker name such as ``ASSIGN5_1_2`` (None if unknown)."""
    return MARKERS.get(name)
