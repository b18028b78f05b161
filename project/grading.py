"""The assignment keys: topic, notebook, points and dependencies, declared in one place.

Used by ``project/release.py`` (stub messages), ``project/grade.py`` (points) and the
grading-integrity check. The pytest markers of the same names are declared in
pyproject.toml (COURSE_DESIGN.md §4).
"""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Key:
    key: str                 # e.g. "a5_1_2"; tests carry @pytest.mark.a5_1_2
    topic: str
    notebook: str
    points: int
    depends_on: tuple[str, ...] = field(default=())  # keys whose stubs may also make this key's tests fail

    @property
    def number(self) -> str:
        """``5.1.2`` for ``a5_1_2``."""
        return self.key[1:].replace("_", ".")

    @property
    def marker(self) -> str:
        """``ASSIGN5_1_2`` — the name used in ``# BEGIN``/``# END`` markers."""
        return "ASSIGN" + self.key[1:]


DP, PP, TP = "notebooks/01_data_parallel.ipynb", "notebooks/02_pipeline_parallel.ipynb", "notebooks/03_tensor_parallel.ipynb"

KEYS: dict[str, Key] = {k.key: k for k in [
    Key("a5_1_1", "dataset partitioning: Partition, DataPartitioner, partition_dataset", DP, 10),
    Key("a5_1_2", "process group set-up and all-reduce gradient averaging", DP, 10),
    Key("a5_1_3", "launching data-parallel training across processes", DP, 10, ("a5_1_1", "a5_1_2")),
    Key("a5_2_1", "clock-cycle schedule _clock_cycles and module splitting _split_module", PP, 10),
    Key("a5_2_2", "Pipe.forward / Pipe.compute over per-stage workers", PP, 10, ("a5_2_1",)),
    Key("a5_2_3", "GPT-2 pipeline preparation", PP, 10, ("a5_2_1", "a5_2_2")),
    Key("a5_2_4", "multi-process pipeline with GPipe and 1F1B schedules", PP, 10),
    Key("a5_3_1", "Megatron conjugate operators f and g, scatter/gather", TP, 10),
    Key("a5_3_2", "ColumnParallelLinear, RowParallelLinear", TP, 10, ("a5_3_1",)),
    Key("a5_3_3", "VocabParallelEmbedding and vocab-parallel cross-entropy", TP, 10, ("a5_3_1",)),
    Key("a5_3_4", "tensor-parallel GPT-2 block and model", TP, 10, ("a5_3_1", "a5_3_2", "a5_3_3")),
    Key("a5_3_5", "sequence parallelism", TP, 10, ("a5_3_1", "a5_3_2", "a5_3_3", "a5_3_4")),
]}

MARKERS = {k.marker: k for k in KEYS.values()}


def key_of_marker(name: str) -> Key | None:
    """The :class:`Key` of a marker name such as ``ASSIGN5_1_2`` (None if unknown)."""
    return MARKERS.get(name)
