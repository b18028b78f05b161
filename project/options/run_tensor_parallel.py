"""The configuration of ``project/run_tensor_parallel.py`` (torch-free: the script, ``modal run`` and the tests
import it)."""
from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace

from course.config import ConfigError, RunConfig


@dataclass
class TensorParallelConfig(RunConfig):
    """``project/run_tensor_parallel.py``: every GPT-2 layer split over ``--tp`` processes."""

    description = "Tensor-parallel GPT-2 training on Multi30k German→English (assignment 5.3)."
    results_prefix = "tensor_parallel_"  # its files: tensor_parallel_rank{r}_results_epoch{e}.json
    takes = ("tp", "sequence_parallel", "block_types")
    defaults = {"batch_size": 32, "tp": None}
    world_option = "tp"

    def export_refusal(self) -> str | None:
        kinds = set(str(self.block_types).split(","))
        if kinds - {"tp"}:
            return (f"--block_types {self.block_types}: spd and parallel blocks compute another function than "
                    "GPT-2's with the same weights; only --block_types tp exports as transformers' GPT-2")
        return None

    def check(self) -> None:
        super().check()  # first the mesh and the heads: a --model_max_length fit is no fix for a --tp they refuse
        from tensor_parallel.rules import validate_tp_config

        shape = self.model_shape
        config = SimpleNamespace(n_head=shape["n_head"], n_embd=shape["n_embd"], n_layer=shape["n_layer"],
                                 n_inner=None)
        try:
            kinds = validate_tp_config(config, self.tp, self.block_types)
        except ValueError as exc:
            raise ConfigError(f"--preset {self.preset} with --tp {self.tp}: {exc}") from None
        self.block_types = ",".join(kinds)
        if self.sequence_parallel and self.model_max_length % self.tp:
            # Sequences are padded up to a multiple of tp; the longest (model_max_length) would then
            # run past the position embeddings, and a rank would crash mid-run.
            fit = self.model_max_length // self.tp * self.tp
            raise ConfigError(f"--sequence_parallel splits each sequence into --tp {self.tp} equal parts, but "
                              f"--model_max_length {self.model_max_length} is not divisible by {self.tp}; "
                              f"try --model_max_length {fit}")
