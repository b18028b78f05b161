"""The configuration of ``project/run_context_parallel.py`` (torch-free: the script, ``modal run`` and the tests
import it)."""
from __future__ import annotations

import os
from dataclasses import dataclass

from course.config import ConfigError, RunConfig
from course.environment import in_torchrun


@dataclass
class ContextParallelConfig(RunConfig):
    """``project/run_context_parallel.py``: ``--dp x --cp`` ranks, each sequence cut over the cp group."""

    description = "Context-parallel GPT-2 training on packed Multi30k sequences (assignment 5.7)."
    results_prefix = "context_parallel_"  # its files: context_parallel_rank{r}_results_epoch{e}.json
    takes = ("dp", "cp", "attention", "layout", "seq_len", "block_size")
    defaults = {"batch_size": 2, "cp": None}
    notes = {"batch_size": "packed sequences of --seq_len tokens; 2 x 1024 tokens is about the other scripts' 64 "
                           "pairs", "cp": "default: torchrun's WORLD_SIZE / --dp, else 2"}
    world_option = None  # --cp defaults to torchrun's WORLD_SIZE / --dp (resolve)

    def resolve(self, devices: int | None = None, *, here: bool = True) -> None:
        if self.dp is None:
            self.dp = 1
        if self.cp is None:
            world = devices or (int(os.environ["WORLD_SIZE"]) if in_torchrun() else None)
            self.cp = max(1, world // max(1, self.dp)) if world else 2
        if self.layout is None:
            self.layout = "zigzag" if self.attention == "ring" else "contiguous"
        super().resolve(devices, here=here)

    def check(self) -> None:
        from context_parallel.rules import check_heads

        super().check()
        if self.attention == "ulysses" and self.layout != "contiguous":
            raise ConfigError(f"--layout {self.layout} is for the ring; Ulysses always uses the contiguous layout "
                              "(leave --layout out)")
        if self.attention == "ulysses":  # first: no --seq_len or --batch_size fixes a --cp that splits no heads
            try:
                check_heads(self.model_shape["n_head"], self.cp)
            except ValueError as exc:
                raise ConfigError(f"--preset {self.preset} with --cp {self.cp}: {exc}") from None
        if self.block_size < 1:
            raise ConfigError(f"--block_size must be >= 1 (tokens), not {self.block_size}")
        if self.seq_len < self.model_max_length:
            raise ConfigError(f"--seq_len {self.seq_len} is shorter than one pair may be (--model_max_length "
                              f"{self.model_max_length}); use a longer --seq_len")
        chunks = 2 * self.cp if self.layout == "zigzag" else self.cp
        if self.seq_len % chunks:
            fit = max(chunks, self.seq_len // chunks * chunks)
            raise ConfigError(f"--seq_len {self.seq_len} must be divisible by {chunks} (the {self.layout} layout cuts "
                              f"each sequence into {chunks} equal chunks over --cp {self.cp}); try --seq_len {fit}")
