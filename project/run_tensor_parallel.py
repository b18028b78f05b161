"""Tensor-parallel GPT-2 training on Multi30k German→English (assignment 5.3).

    python project/run_tensor_parallel.py --tp_size 2
    python project/run_tensor_parallel.py --tp_size 2 --sequence_parallel
    python project/run_tensor_parallel.py --tp_size 2 --block_types tp,spd,parallel,parallel
    torchrun --standalone --nproc_per_node=4 project/run_tensor_parallel.py --tp_size 4

Spawns ``--tp_size`` processes (gloo on CPU, NCCL with one GPU each), or joins the group
torchrun made; every rank holds 1/tp_size of each split weight and all ranks process the
same batches. ``--block_types`` picks, per layer, exact Megatron blocks (``tp``), Sync-Point
Drop (``spd``, an approximation) or per-rank residual streams (``parallel``, a different
architecture): one name for all layers or one per layer, comma-separated. Writes
``<workdir>/tensor_parallel_rank{r}_results_epoch{e}.json`` (with the collectives per step).
"""
from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

if __name__ == "__main__":  # run as a file: import the packages of the tree this script sits in
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from course.config import ConfigError, RunConfig, option  # noqa: E402
from course.launch import RankFailure, launch  # noqa: E402
from course.results import print_epoch_table  # noqa: E402

RESULTS_PREFIX = "tensor_parallel_"


@dataclass
class TensorParallelConfig(RunConfig):
    """``project/run_tensor_parallel.py``: every GPT-2 layer split over ``--tp`` processes."""

    description = "Tensor-parallel GPT-2 training on Multi30k German→English (assignment 5.3)."
    results_prefix = RESULTS_PREFIX
    mesh_options = ("tp",)
    world_option = "tp"

    batch_size: int = option(32, "global batch size (sequences per optimizer step)", group="model and training")
    tp: int | None = option(None, "ranks the model is split over (default: torchrun's WORLD_SIZE, else 2)",
                            group="mesh", old=("tp_size",))
    sequence_parallel: bool = option(False, "also split layer norms and dropout along the sequence (Korthikanti et "
                                            "al. 2022)", group="tensor parallelism")
    block_types: str = option("tp", "tp, spd or parallel: one for every layer, or one per layer comma-separated",
                              group="tensor parallelism")

    @property
    def world_size(self) -> int:
        return self.tp

    def export_refusal(self) -> str | None:
        kinds = set(str(self.block_types).split(","))
        if kinds - {"tp"}:
            return (f"--block_types {self.block_types}: spd and parallel blocks compute another function than "
                    "GPT-2's with the same weights; only --block_types tp exports as transformers' GPT-2")
        return None

    def check(self) -> None:
        if self.tp >= 1 and self.sequence_parallel and self.model_max_length % self.tp:
            # Sequences are padded up to a multiple of tp; the longest (model_max_length) would then
            # run past the position embeddings, and a rank would crash mid-run.
            fit = self.model_max_length // self.tp * self.tp
            raise ConfigError(f"--sequence_parallel splits each sequence into --tp {self.tp} equal parts, but "
                              f"--model_max_length {self.model_max_length} is not divisible by {self.tp}; "
                              f"try --model_max_length {fit}")
        super().check()
        from tensor_parallel.gpt2 import validate_tp_config

        shape = self.model_shape
        config = SimpleNamespace(n_head=shape["n_head"], n_embd=shape["n_embd"], n_layer=shape["n_layer"],
                                 n_inner=None)
        try:
            kinds = validate_tp_config(config, self.tp, self.block_types)
        except ValueError as exc:
            raise ConfigError(f"--preset {self.preset} with --tp {self.tp}: {exc}") from None
        self.block_types = ",".join(kinds)


def parse_args(argv=None) -> TensorParallelConfig:
    """The run's :class:`TensorParallelConfig` from the command line (exits with a message on bad input)."""
    return TensorParallelConfig.from_command_line(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    from tensor_parallel.training import run_tp

    kinds = args.block_types
    print(f"tensor parallel: tp={args.tp} sequence_parallel={args.sequence_parallel} block_types={kinds} "
          f"device={args.device} backend={args.backend} preset={args.preset} batch={args.batch_size}", flush=True)
    try:
        launch(run_tp, args.tp, args, device=args.device, backend=args.backend, timeout=args.timeout,
               max_restarts=args.max_restarts)
    except RankFailure as exc:
        print(f"run failed: {exc}", file=sys.stderr)
        return 1
    print_epoch_table(args.workdir, prefix=RESULTS_PREFIX, n_epochs=args.n_epochs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
