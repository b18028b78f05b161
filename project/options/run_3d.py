"""The configuration of ``project/run_3d.py`` (torch-free: the script, ``modal run`` and the tests
import it)."""
from __future__ import annotations

from dataclasses import dataclass

from course.config import ConfigError, RunConfig
from three_d import SCHEDULES, V_SCHEDULE_MESSAGE, V_SCHEDULES


@dataclass
class ThreeDConfig(RunConfig):
    """``project/run_3d.py``: ``dp x pp x tp`` ranks on one device mesh."""

    description = "3D-parallel (dp x pp x tp) GPT-2 training on Multi30k German→English (assignment 5.6)."
    results_prefix = "three_d_"  # its files: three_d_rank{r}_results_epoch{e}.json
    takes = ("dp", "pp", "tp", "micro_batches", "schedule", "scatter_gather", "max_grad_norm")
    defaults = {"pp": 4, "tp": 2, "micro_batches": 8, "schedule": "1f1b"}
    choices = {"schedule": tuple(SCHEDULES)}
    unlisted = {"schedule": V_SCHEDULES}  # refused by check() with what to run instead
    notes = {"schedule": "one model chunk per rank"}
    world_option = None

    def check(self) -> None:
        super().check()
        if self.schedule in V_SCHEDULES:
            raise ConfigError(V_SCHEDULE_MESSAGE.format(name=self.schedule))
        if not self.max_grad_norm > 0:
            raise ConfigError(f"--max_grad_norm must be positive, not {self.max_grad_norm}")

    def check_environment(self) -> None:
        if self.resume is not None:  # first: its message names the --tp or --dp x --pp to resume with
            try:
                check_resume_layout(self)
            except (ValueError, FileNotFoundError) as exc:  # no checkpoint, a damaged one: said as the others are
                raise exc if isinstance(exc, ConfigError) else ConfigError(str(exc)) from None
        super().check_environment()


def check_resume_layout(config: ThreeDConfig) -> None:
    """A checkpoint reshards across --dp and --pp, not across --tp or the number of ranks: refuse here if it would.

    Raises:
        ConfigError: naming what to change.
    """
    from course.checkpoint import checkpoint_root, resolve_resume
    from three_d.training import checkpoint_layout, tp_mismatch_message

    path = resolve_resume(config.resume, checkpoint_root(config.workdir, config.results_prefix))
    try:
        saved = checkpoint_layout(path)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    if saved["tp"] != config.tp:
        raise ConfigError(tp_mismatch_message(saved, config.tp))
    ranks = saved["dp"] * saved["pp"] * saved["tp"]
    if ranks != config.world_size:
        raise ConfigError(f"--resume: the checkpoint was written by dp={saved['dp']} x pp={saved['pp']} x "
                          f"tp={saved['tp']} = {ranks} ranks, this run has {config.world_size}; the progress and "
                          f"random generators are kept per rank: choose --dp and --pp with dp x pp = "
                          f"{ranks // saved['tp']}")
