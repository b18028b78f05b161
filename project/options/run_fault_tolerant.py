"""The configuration of ``project/run_fault_tolerant.py`` (torch-free: the script and the tests import it)."""
from __future__ import annotations

from dataclasses import dataclass, field

from course.config import DRILL, FAULT_TOLERANCE, ConfigError, RunConfig, options_in
from course.preflight import check_workdir


@dataclass
class FaultTolerantConfig(RunConfig):
    """``project/run_fault_tolerant.py``: ``--replicas`` replica groups of ``--dp`` ranks each, coordinated by
    torchft's lighthouse; a group that fails leaves the quorum at the next step and heals from a live peer when
    it returns."""

    description = ("Fault-tolerant GPT-2 training on Multi30k: replica groups under torchft's lighthouse, "
                   "gradients averaged over the live quorum every step (notebook 11).")
    results_prefix = "ft_replica0_"  # group 0's files (the table printed at the end); group g: group_prefix(g)
    takes = ("dp", *options_in(FAULT_TOLERANCE, DRILL))
    world_option = "replicas"  # default: torchrun's WORLD_SIZE, the machine's GPUs (modal), else 2

    # Not an option: True in the copy each replica group's ranks get, whose mesh is the group's (--dp ranks).
    in_group: bool = field(default=False, repr=False)

    @property
    def world_size(self) -> int:
        return self.replicas * self.dp

    @property
    def dims(self):
        """The whole run's ranks (``replicas x dp``), or in a replica group's copy (``in_group``) the group's mesh."""
        from course.dims import ParallelDims

        return ParallelDims(dp=self.dp if self.in_group else self.replicas * self.dp)

    def for_group(self) -> "FaultTolerantConfig":
        """The copy a replica group's ranks train with (its mesh: ``--dp`` ranks)."""
        import dataclasses

        return dataclasses.replace(self, in_group=True)

    def faults(self) -> tuple:
        """The drill as :class:`course.replica_groups.Fault` s (none without ``--kill_group``)."""
        if self.kill_group is None:
            return ()
        from course.replica_groups import Fault

        restart = None if self.recovery == "restart_all" else \
            (self.restart_step if self.restart_step is not None else self.kill_step + 2)
        return (Fault(self.kill_group, self.kill_step, restart),)

    def check(self) -> None:
        super().check()
        if self.replicas < 1:
            raise ConfigError(f"--replicas must be >= 1 replica groups, not {self.replicas}")
        if not 1 <= self.min_replicas <= self.replicas:
            raise ConfigError(f"--min_replicas {self.min_replicas} must be between 1 and --replicas {self.replicas}")
        if self.batch_size % (self.replicas * self.dp):
            raise ConfigError(f"--batch_size {self.batch_size} is not divisible by --replicas x --dp = "
                              f"{self.replicas * self.dp}: each rank takes an equal share; try --batch_size "
                              f"{max(1, self.batch_size // (self.replicas * self.dp)) * self.replicas * self.dp}")
        if self.quorum_timeout <= 0 or self.heartbeat_timeout_ms <= 0:
            raise ConfigError("--quorum_timeout and --heartbeat_timeout_ms must be positive")
        if self.kill_group is not None:
            if not 0 <= self.kill_group < self.replicas:
                raise ConfigError(f"--kill_group {self.kill_group}: the groups are 0 .. {self.replicas - 1}")
            if self.replicas < 2:
                raise ConfigError("--kill_group needs --replicas >= 2: one group must live on")
            if self.kill_step < 0 or (self.max_batches is not None and self.kill_step >= self.max_batches * self.n_epochs):
                raise ConfigError(f"--kill_step {self.kill_step} must be a step the run takes (0 .. "
                                  f"{(self.max_batches or 10 ** 9) * self.n_epochs - 1})")
            restart = self.faults()[0].restart_at_step
            if restart is not None and restart <= self.kill_step:
                raise ConfigError(f"--restart_step {restart} must come after --kill_step {self.kill_step}")
            last = None if self.max_batches is None else self.max_batches * self.n_epochs - 1
            if restart is not None and last is not None and restart >= last:
                raise ConfigError(f"--restart_step {restart}: the killed group heals at the step after it, and the run's "
                                  f"last step is {last}; give --restart_step <= {last - 1} or more --max_batches")
            if self.recovery == "restart_all" and not self.checkpoint_every:
                raise ConfigError("--recovery restart_all restarts every group from its latest checkpoint: also give "
                                  "--checkpoint_every N")
        if self.max_restarts:
            raise ConfigError("--max_restarts restarts every rank; replica groups recover by themselves (--recovery)")

    @staticmethod
    def group_prefix(group: int) -> str:
        """The prefix of replica group ``group``'s results files and checkpoints (``ft_replica<g>_``)."""
        return f"ft_replica{group}_"

    def check_environment(self) -> None:
        super().check_environment()  # group 0's files
        for group in range(1, self.replicas):  # every group writes files of its own prefix
            check_workdir(self.workdir, self.group_prefix(group), self.overwrite, resuming=self.resume is not None)
