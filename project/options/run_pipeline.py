"""The configuration of ``project/run_pipeline.py`` (torch-free: the script, ``modal run`` and the tests
import it)."""
from __future__ import annotations

from dataclasses import dataclass

from course.config import ConfigError, RunConfig, option
from course.environment import in_torchrun
from pipeline.schedules import SCHEDULES

SINGLE_PROCESS = ("model_parallel", "pipeline_parallel")
MODES = (*SINGLE_PROCESS, *SCHEDULES)
PIPELINE = "pipeline"


@dataclass
class PipelineConfig(RunConfig):
    """``project/run_pipeline.py``: GPT-2 cut into ``--pp`` stages, one process (Pipe) or one process per
    stage running a schedule of the registry."""

    description = "Pipeline-parallel GPT-2 training on Multi30k German→English (assignment 5.2)."
    mesh_options = ("pp", "micro_batches", "virtual_stages")
    world_option = "pp"

    max_batches: int | None = option(150, "stop each epoch after this many batches (quick runs)",
                                     group="model and training")
    pp: int | None = option(None, "pipeline stages (default: torchrun's WORLD_SIZE for the multi-process modes, "
                                  "else 2)", group="mesh")
    micro_batches: int = option(4, "micro-batches per batch (micro-batch size = batch_size // micro_batches)",
                                group="mesh")
    virtual_stages: int | None = option(None, "interleaved: model chunks (virtual stages) per process, default 2; "
                                              "other modes: 1", group="mesh")
    model_parallel_mode: str = option("pipeline_parallel", "model_parallel: stages one after another; "
                                                           "pipeline_parallel: Pipe with micro-batches in one "
                                                           "process; a schedule name: one process per stage running "
                                                           "that schedule", group=PIPELINE, choices=MODES)
    balance: str = option("count", "layers per stage: count = blocks spread evenly (embeddings on the first, head on "
                                   "the last stage); auto = from each layer's measured forward+backward time, the LM "
                                   "head's included (multi-process modes)", group=PIPELINE, choices=("count", "auto"))

    @property
    def multiprocess(self) -> bool:
        return self.model_parallel_mode in SCHEDULES

    @property
    def world_size(self) -> int:
        return self.pp if self.multiprocess else 1

    @property
    def results_prefix(self) -> str:
        return f"pipeline_{self.model_parallel_mode}_"

    def resolve(self, devices: int | None = None, *, here: bool = True) -> None:
        if self.pp is None and not self.multiprocess:
            self.pp = devices or 2  # stage s on device s, all in this process
        if self.virtual_stages is None:
            entry = SCHEDULES.get(self.model_parallel_mode)
            self.virtual_stages = entry.chunks_per_rank(2) if entry else 1
        super().resolve(devices, here=here)

    def check(self) -> None:
        super().check()
        if not self.multiprocess and in_torchrun():
            raise ConfigError(f"--model_parallel_mode {self.model_parallel_mode} runs in one process; under torchrun "
                              f"use one of {tuple(SCHEDULES)} (one process per stage)")
        if self.batch_size // self.micro_batches < 1:
            raise ConfigError(f"--micro_batches {self.micro_batches} is larger than --batch_size {self.batch_size}: "
                              f"the micro-batch size batch_size // micro_batches would be < 1; use --micro_batches <= "
                              f"{self.batch_size}")
        if self.batch_size % self.micro_batches:
            raise ConfigError(f"--batch_size {self.batch_size} is not divisible by --micro_batches "
                              f"{self.micro_batches}: every micro-batch must have batch_size // micro_batches rows; "
                              f"try --batch_size {self.batch_size // self.micro_batches * self.micro_batches}")
        chunks = self.multiprocess and SCHEDULES[self.model_parallel_mode].interleaved
        v_shaped = self.multiprocess and SCHEDULES[self.model_parallel_mode].placement == "v"
        if v_shaped:
            if self.virtual_stages != 2:
                raise ConfigError(f"--model_parallel_mode {self.model_parallel_mode} places two stages on every "
                                  f"process in a V (stages r and 2p - 1 - r); drop --virtual_stages "
                                  f"{self.virtual_stages} or set it to 2")
            if self.model_parallel_mode == "dualpipev" and self.micro_batches < 2 * self.pp:
                raise ConfigError(f"--micro_batches {self.micro_batches}: DualPipeV needs at least as many "
                                  f"micro-batches as its 2 x --pp = {2 * self.pp} stages; use --micro_batches >= "
                                  f"{2 * self.pp} (or --model_parallel_mode zbv, which takes any number)")
        elif self.virtual_stages != 1 and not chunks:
            raise ConfigError(f"--virtual_stages {self.virtual_stages}: more than one model chunk per process only "
                              "with --model_parallel_mode interleaved")
        if self.balance == "auto" and not self.multiprocess:
            raise ConfigError(f"--balance auto places the stages of the multi-process modes {tuple(SCHEDULES)}; "
                              f"--model_parallel_mode {self.model_parallel_mode} splits by count")
        if chunks:
            from pipeline.schedules import micro_batches_per_round
            try:
                micro_batches_per_round(self.pp, self.micro_batches)
            except ValueError as exc:
                raise ConfigError(f"--micro_batches {self.micro_batches}: {exc}") from None
        n_layer = self.model_shape["n_layer"]
        if self.pp * self.virtual_stages > n_layer:
            raise ConfigError(f"--pp {self.pp} x --virtual_stages {self.virtual_stages} (virtual) stages are more "
                              f"than the {n_layer} transformer blocks of preset {self.preset!r}; use fewer or a "
                              "bigger --preset")
