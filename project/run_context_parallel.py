"""Context-parallel GPT-2 training on packed Multi30k sequences (assignment 5.7).

    python project/run_context_parallel.py --cp 2                        # ring attention, zig-zag layout
    python project/run_context_parallel.py --cp 2 --attention ulysses    # DeepSpeed-Ulysses
    python project/run_context_parallel.py --dp 2 --cp 2 --seq_len 2048  # 4 ranks: dp x cp
    torchrun --standalone --nproc_per_node=4 project/run_context_parallel.py --dp 2 --cp 2

Spawns ``--dp x --cp`` processes (gloo on CPU, NCCL with one GPU each), or joins the group
torchrun made. Translation pairs are packed into sequences of ``--seq_len`` tokens (several pairs
per sequence, attention causal across them: ``context_parallel/packing.py``); every sequence is
cut over the cp group — ``--layout zigzag`` (default) or ``contiguous`` for the ring, contiguous
for Ulysses — and attention runs across it with ``--attention ring`` (Liu et al. 2023) or
``ulysses`` (Jacobs et al. 2023). Gradients are averaged over dp x cp. ``--batch_size`` counts
packed sequences: the default, 2 of 1024 tokens, is about the 64 pairs per step of the other
scripts' default batch, so an epoch takes as many optimizer steps. Validation loss and BLEU
are measured on single pairs, as in the other modes. Writes
``<workdir>/context_parallel_rank{r}_results_epoch{e}.json`` (with the communication per step and
group) and ``context_parallel_translations_epoch{e}.json``.
"""
from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path

if __name__ == "__main__":  # run as a file: import the packages of the tree this script sits in
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from course.config import ConfigError, RunConfig, option  # noqa: E402
from course.launch import RankFailure, in_torchrun, launch  # noqa: E402
from course.results import print_epoch_table  # noqa: E402

RESULTS_PREFIX = "context_parallel_"
CP = "context parallelism"


@dataclass
class ContextParallelConfig(RunConfig):
    """``project/run_context_parallel.py``: ``--dp x --cp`` ranks, each sequence cut over the cp group."""

    description = "Context-parallel GPT-2 training on packed Multi30k sequences (assignment 5.7)."
    results_prefix = RESULTS_PREFIX
    mesh_options = ("dp", "cp")
    world_option = None  # --cp defaults to torchrun's WORLD_SIZE / --dp (resolve)

    batch_size: int = option(2, "global batch size (packed sequences of --seq_len tokens per optimizer step; 2 x 1024 "
                                "tokens is about the other scripts' 64 pairs)", group="model and training")
    dp: int | None = option(1, "data-parallel replicas (each of --cp ranks)", group="mesh")
    cp: int | None = option(None, "ranks each sequence is cut over (default: torchrun's WORLD_SIZE / --dp, else 2)",
                            group="mesh")
    attention: str = option("ring", "ring attention (K/V blocks travel the ring) or Ulysses (all-to-all to heads)",
                            group=CP, choices=("ring", "ulysses"))
    layout: str | None = option(None, "which chunks of a sequence each rank holds: zigzag (the ring's default; "
                                      "balances causal work) or contiguous (Ulysses always)", group=CP,
                                choices=("zigzag", "contiguous"))
    seq_len: int = option(1024, "tokens per packed training sequence", group=CP)
    block_size: int = option(128, "ring: tile size of the blockwise attention (tokens)", group=CP)

    def resolve(self) -> None:
        if self.dp is None:
            self.dp = 1
        if self.cp is None:
            self.cp = max(1, int(os.environ["WORLD_SIZE"]) // max(1, self.dp)) if in_torchrun() else 2
        if self.layout is None:
            self.layout = "zigzag" if self.attention == "ring" else "contiguous"
        super().resolve()

    def check(self) -> None:
        from context_parallel.ulysses import check_heads

        super().check()
        if self.attention == "ulysses" and self.layout != "contiguous":
            raise ConfigError(f"--layout {self.layout} is for the ring; Ulysses always uses the contiguous layout "
                              "(leave --layout out)")
        if self.block_size < 1:
            raise ConfigError(f"--block_size must be >= 1 (tokens), not {self.block_size}")
        if self.seq_len < self.model_max_length:
            raise ConfigError(f"--seq_len {self.seq_len} is shorter than one pair may be (--model_max_length "
                              f"{self.model_max_length}); use a longer --seq_len")
        if self.batch_size % self.dp:
            raise ConfigError(f"--batch_size {self.batch_size} is not divisible by --dp {self.dp}; each dp rank takes "
                              f"batch_size / dp sequences: try --batch_size {max(1, self.batch_size // self.dp) * self.dp}")
        chunks = 2 * self.cp if self.layout == "zigzag" else self.cp
        if self.seq_len % chunks:
            fit = max(chunks, self.seq_len // chunks * chunks)
            raise ConfigError(f"--seq_len {self.seq_len} must be divisible by {chunks} (the {self.layout} layout cuts "
                              f"each sequence into {chunks} equal chunks over --cp {self.cp}); try --seq_len {fit}")
        if self.attention == "ulysses":
            try:
                check_heads(self.model_shape["n_head"], self.cp)
            except ValueError as exc:
                raise ConfigError(f"--preset {self.preset} with --cp {self.cp}: {exc}") from None


def parse_args(argv=None) -> ContextParallelConfig:
    """The run's :class:`ContextParallelConfig` from the command line (exits with a message on bad input)."""
    return ContextParallelConfig.from_command_line(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    from context_parallel.training import run_cp

    world = args.dp * args.cp
    print(f"context parallel: dp={args.dp} cp={args.cp} attention={args.attention} layout={args.layout} "
          f"seq_len={args.seq_len} device={args.device} backend={args.backend} preset={args.preset} "
          f"batch={args.batch_size} sequences", flush=True)
    try:
        launch(run_cp, world, args, device=args.device, backend=args.backend, timeout=args.timeout,
               max_restarts=args.max_restarts)
    except RankFailure as exc:
        print(f"run failed: {exc}", file=sys.stderr)
        return 1
    print_epoch_table(args.workdir, prefix=RESULTS_PREFIX, n_epochs=args.n_epochs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
