"""The configuration of ``project/run_pipeline.py`` (torch-free: the script, ``modal run`` and the tests
import it)."""
from __future__ import annotations

from dataclasses import dataclass

from course.config import ConfigError, RunConfig
from course.environment import in_torchrun
from pipeline.schedules import SCHEDULES


@dataclass
class PipelineConfig(RunConfig):
    """``project/run_pipeline.py``: GPT-2 cut into ``--pp`` stages, either one process per stage running a
    schedule of the registry (``--schedule``) or all stages in this process (``--single_process``, the
    default: ``pipe``)."""

    description = "Pipeline-parallel GPT-2 training on Multi30k German→English (assignment 5.2)."
    takes = ("pp", "micro_batches", "virtual_stages", "schedule", "single_process", "balance")
    defaults = {"max_batches": 150, "pp": None, "micro_batches": 4, "virtual_stages": None}
    choices = {"schedule": tuple(SCHEDULES)}
    notes = {"virtual_stages": "default: 2 with --schedule interleaved, else 1",
             "single_process": "the default without --schedule: pipe", "balance": "auto: with --schedule"}
    world_option = "pp"

    @property
    def multiprocess(self) -> bool:
        """One process per stage (``--schedule``)."""
        return self.schedule is not None

    @property
    def kind(self) -> str:
        """What runs: the schedule's name, or the single-process way (``pipe``, ``sequential``)."""
        return self.schedule or self.single_process or "pipe"

    @property
    def world_size(self) -> int:
        return self.pp if self.multiprocess else 1

    @property
    def results_prefix(self) -> str:
        return f"pipeline_{self.kind}_"

    def resolve(self, devices: int | None = None, *, here: bool = True) -> None:
        if self.schedule is not None and self.single_process is not None:
            raise ConfigError(f"--schedule {self.schedule} runs one process per stage, --single_process "
                              f"{self.single_process} every stage in this process: give one of them")
        if self.schedule is None and self.single_process is None:
            self.single_process = "pipe"
        if self.pp is None and not self.multiprocess:
            self.pp = devices or 2  # stage s on device s, all in this process
        if self.virtual_stages is None:
            self.virtual_stages = SCHEDULES[self.schedule].chunks_per_rank(2) if self.multiprocess else 1
        super().resolve(devices, here=here)

    def check(self) -> None:
        super().check()
        if not self.multiprocess and in_torchrun():
            raise ConfigError(f"--single_process {self.single_process} runs in one process; under torchrun give a "
                              f"--schedule, one of {tuple(SCHEDULES)} (one process per stage)")
        interleaved = self.multiprocess and SCHEDULES[self.schedule].interleaved
        if self.multiprocess and SCHEDULES[self.schedule].placement == "v":
            if self.virtual_stages != 2:
                raise ConfigError(f"--schedule {self.schedule} places two stages on every process in a V (stages r "
                                  f"and 2p - 1 - r); drop --virtual_stages {self.virtual_stages} or set it to 2")
            if self.schedule == "dualpipev" and self.micro_batches < 2 * self.pp:
                raise ConfigError(f"--micro_batches {self.micro_batches}: DualPipeV needs at least as many "
                                  f"micro-batches as its 2 x --pp = {2 * self.pp} stages; use --micro_batches >= "
                                  f"{2 * self.pp} (or --schedule zbv, which takes any number)")
        elif self.virtual_stages != 1 and not interleaved:
            raise ConfigError(f"--virtual_stages {self.virtual_stages}: more than one model chunk per process only "
                              "with --schedule interleaved")
        if self.balance == "auto" and not self.multiprocess:
            raise ConfigError(f"--balance auto places the stages of a --schedule run (one process per stage); "
                              f"--single_process {self.single_process} splits by count")
        if interleaved:
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
