"""The registry of training modes: every way the course trains GPT-2, registered once.

A :class:`Mode` names what one kind of run is made of:

* ``name`` — what ``python project/train.py --mode NAME`` calls it (``dp``, ``pipeline``, ``tp``, ``3d``, ``cp``,
  ``moe``);
* ``config`` — its options: a :class:`course.config.RunConfig` subclass of ``project/options`` (torch-free), whose
  ``results_prefix`` is the one home of the prefix of the run's files
  (``<workdir>/{prefix}rank{r}_results_epoch{e}.json``);
* ``builder`` — the part's ``build(config, data, mesh) -> TrainingMode`` (the same signature for every mode), called
  on every rank inside the one worker of ``project/train.py`` (:func:`train_worker`), once the mesh
  (``config.dims``) and the data are made: the part's :class:`course.epoch_runner.TrainingMode` that
  :func:`course.epoch_runner.run_epochs` then trains;
* the rest of what differs: the line printed before the run, the launcher's collective timeout, what a rank does
  after the epochs, and a configuration that runs in the calling process instead of on ranks.

Everything that starts runs reads this table: ``project/train.py`` and the six documented commands
``project/run_*.py`` over it, ``modal_run.py`` (:mod:`project.tools.modal_support`: its modes, their options and
checks), the Slurm script (``project/slurm/torchrun.sbatch --mode NAME``) and torchrun
(``torchrun ... project/train.py --mode NAME``). A new mode is one :func:`register` call here (and its options
module, and its part's builder): it then runs from all of them.

This module imports no torch (``modal run`` checks a request on a laptop without it, as the schedule registry
:data:`pipeline.schedules.SCHEDULES` does for schedules): the builders import their part when a rank calls them.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from project.options.run_3d import ThreeDConfig
from project.options.run_context_parallel import ContextParallelConfig
from project.options.run_data_parallel import DataParallelConfig
from project.options.run_fault_tolerant import FaultTolerantConfig
from project.options.run_moe import MoERunConfig
from project.options.run_pipeline import PipelineConfig
from project.options.run_tensor_parallel import TensorParallelConfig


@dataclass(frozen=True)
class Mode:
    """One training mode (see the module docstring).

    Attributes:
        name: its ``--mode`` name.
        config: its configuration class (a :class:`course.config.RunConfig`; torch-free).
        script: its documented command, ``project/<script>.py`` (a few lines over this registry).
        builder: ``"module:function"``, the part's ``build(config, data, mesh)`` -> this rank's
            :class:`course.epoch_runner.TrainingMode` (e.g. ``"data_parallel.training:dp_training"``); :meth:`build`
            calls it on every rank with the run's :class:`course.mesh.Mesh` of ``config.dims`` and
            :func:`course.task.prepare_data`'s data.
        describe: ``describe(config)`` -> the line printed before the run starts.
        collective_timeout: seconds a rank may wait in one collective (None: the launcher's default,
            :data:`course.launch.DEFAULT_COLLECTIVE_TIMEOUT`).
        finish: ``finish(training, config, mesh)`` on every rank after the epochs (None: nothing).
        in_process: ``in_process(config)`` -> True for a configuration that runs in the calling process, without
            ranks, through ``run_in_process(config)`` (None: every configuration runs on ranks).
        run_in_process: see ``in_process``.
        builder_when: ``{option: "module:function"}``: a builder of the same signature that replaces
            :attr:`builder` when that option is set (dp's ``--elastic``: ``data_parallel.elastic:elastic_training``).
    """

    name: str
    config: type
    script: str
    builder: str
    describe: Callable[[Any], str]
    collective_timeout: float | None = None
    finish: Callable[[Any, Any, Any], None] | None = None
    in_process: Callable[[Any], bool] | None = None
    run_in_process: Callable[[Any], Any] | None = None
    builder_when: dict[str, str] = field(default_factory=dict)

    @property
    def script_path(self) -> str:
        """``project/<script>.py``."""
        return f"project/{self.script}.py"

    def build(self, config, data, mesh):
        """This rank's training: the part's builder (:attr:`builder`, or the one of :attr:`builder_when` whose option
        is set; imported now) called as ``build(config, data, mesh)``."""
        import importlib

        builder = next((b for option, b in self.builder_when.items() if getattr(config, option, None) is not None),
                       self.builder)
        module, _, name = builder.partition(":")
        return getattr(importlib.import_module(module), name)(config, data, mesh)

    def runs_in_process(self, config) -> bool:
        """Whether ``config`` runs in the calling process (no ranks: :attr:`run_in_process`)."""
        return self.in_process is not None and self.in_process(config)


MODES: dict[str, Mode] = {}


def register(mode: Mode) -> Mode:
    """Add ``mode`` to :data:`MODES`.

    Raises:
        ValueError: its name or configuration class is another mode's already.
    """
    for other in MODES.values():
        if mode.name == other.name:
            raise ValueError(f"mode {mode.name!r} is registered already; choose another name")
        if mode.config is other.config:
            raise ValueError(f"mode {mode.name!r}: {mode.config.__name__} is mode {other.name!r}'s configuration "
                             "already; every mode has its own")
    MODES[mode.name] = mode
    return mode


def mode_named(name: str) -> Mode:
    """The registered mode called ``name``.

    Raises:
        ValueError: no mode has that name (the message lists the modes).
    """
    if name not in MODES:
        raise ValueError(f"unknown mode {name!r}: choose one of {', '.join(MODES)}")
    return MODES[name]


def mode_of(config) -> Mode:
    """The registered mode whose configuration ``config`` is.

    Raises:
        ValueError: a configuration of no registered mode.
    """
    for mode in MODES.values():
        if type(config) is mode.config:
            return mode
    raise ValueError(f"{type(config).__name__} is the configuration of no registered mode "
                     f"({', '.join(f'{m.name}: {m.config.__name__}' for m in MODES.values())})")


def train_worker(rank: int, world_size: int, name: str, config) -> dict:
    """The one worker of every mode, which ``project/train.py`` launches on every rank: the run's mesh of
    ``config.dims``, the data, mode ``name``'s training (``Mode.build``), its epochs
    (:func:`course.epoch_runner.run_epochs`) and ``Mode.finish``. It lives here, not in ``project/train.py``, so
    that the ranks import it by this module's name also when ``project/train.py`` runs as ``__main__``; its imports
    wait for a rank (this module stays torch-free).

    Returns:
        ``{"results": [the results files this rank wrote]}``.
    """
    from course.epoch_runner import run_epochs
    from course.mesh import Mesh
    from course.task import prepare_data, worker_env_quiet

    worker_env_quiet()
    mode = mode_named(name)
    mesh = Mesh(config.dims)  # collective: every rank, the same sizes
    training = mode.build(config, prepare_data(config), mesh)
    written = run_epochs(training)
    if mode.finish is not None:
        mode.finish(training, config, mesh)
    return {"results": written}


# ---- the modes ------------------------------------------------------------------------------------------------
# Each mode's builder is its part's own ``build(config, data, mesh)``, registered by name ("module:function") and
# imported when a rank calls it (this module stays torch-free for modal_run.py); what else differs is described here.

def _placed(c) -> str:
    """Where and what a run of ranks trains, as every mode's line before the run prints it: its device, backend
    and model preset."""
    return f"device={c.device} backend={c.backend} preset={c.preset}"


def _describe_dp(c: DataParallelConfig) -> str:
    sync = ("average_gradients" if not c.communication_options() else f"compression={c.compression}"
            if c.compression != "none" else f"buckets of {c.bucket_mb or 25.0} MB, overlap={c.overlap}")
    split = (f"{c.batch_size // c.dp} per rank" if c.elastic is None else
             f"elastic {c.elastic} nodes: micro-batches accumulated")
    return (f"data parallel: dp={c.dp} {_placed(c)} "
            f"global batch={c.batch_size} ({split}), "
            f"gradients: {sync if not c.zero else f'ZeRO-{c.zero}'}"
            f"{f' (HSDP: {c.hsdp} replicas x {c.dp // c.hsdp})' if c.hsdp > 1 else ''}"
            f"{f' (ZeRO++: {c.zeropp})' if c.zeropp else ''}, precision={c.precision}, "
            f"activation_checkpointing={c.activation_checkpointing}")


def _finish_dp(training, config: DataParallelConfig, mesh) -> None:
    from data_parallel.training import save_final_checkpoint

    save_final_checkpoint(training, mesh)


def _run_pipe(config: PipelineConfig):
    from pipeline.training import run_single_process

    return run_single_process(config)


def _describe_pipeline(c: PipelineConfig) -> str:
    return (f"{c.kind}: pp={c.pp} micro_batches={1 if c.kind == 'sequential' else c.micro_batches} "
            f"batch={c.batch_size} device={c.device} preset={c.preset} max_batches={c.max_batches}")


def _describe_tp(c: TensorParallelConfig) -> str:
    return (f"tensor parallel: tp={c.tp} sequence_parallel={c.sequence_parallel} block_types={c.block_types} "
            f"{_placed(c)} batch={c.batch_size}")


def _describe_3d(c: ThreeDConfig) -> str:
    return (f"3d: dp={c.dp} pp={c.pp} tp={c.tp} schedule={c.schedule} micro_batches={c.micro_batches} "
            f"batch={c.batch_size} device={c.device} preset={c.preset} max_batches={c.max_batches}")


def _describe_cp(c: ContextParallelConfig) -> str:
    return (f"context parallel: dp={c.dp} cp={c.cp} attention={c.attention} layout={c.layout} "
            f"seq_len={c.seq_len} {_placed(c)} batch={c.batch_size} sequences")


def _describe_moe(c: MoERunConfig) -> str:
    kind = "dense" if c.dense else f"{c.num_experts} experts, top-{c.top_k}, capacity factor " \
                                   f"{c.capacity_factor or 'dropless'}"
    return f"mixture of experts: dp={c.dp} ep={c.ep} {kind} {_placed(c)} batch={c.batch_size}"


def _finish_ft(training, config: FaultTolerantConfig, mesh) -> None:
    from fault_tolerance.training import finish

    finish(training, config, mesh)


def run_replica_groups(config: FaultTolerantConfig):
    """The ft mode's ranks: ``config.replicas`` replica groups of :func:`train_worker`, started with torchft's
    lighthouse by :func:`course.replica_groups.launch_replica_groups` (not :func:`course.launch.launch`: every group
    is a process group of its own), with the drill's fault; prints what the fault cost. Returns the
    :class:`course.replica_groups.ReplicaRun`."""
    from course.replica_groups import launch_replica_groups
    from course.task import prepare_data
    from fault_tolerance.recovery import recovery_summary

    prepare_data(config)  # the tokenizer, trained once here: every group's rank 0 would train it at the same time
    run = launch_replica_groups(train_worker, config.replicas, config.dp, "ft", config.for_group(),
                                faults=config.faults(),
                                policy=config.recovery, min_replicas=config.min_replicas, device=config.device,
                                backend=config.backend, timeout=config.timeout,
                                collective_timeout=config.quorum_timeout,
                                heartbeat_timeout_ms=config.heartbeat_timeout_ms)
    for fault in config.faults():
        print(recovery_summary(run, fault, config.recovery)["sentence"], flush=True)
    return run


def _describe_ft(c: FaultTolerantConfig) -> str:
    drill = "" if c.kill_group is None else (f", drill: replica group {c.kill_group} killed in step {c.kill_step}, "
                                              f"recovery {c.recovery}")
    return (f"fault tolerant: {c.replicas} replica groups x dp={c.dp} (torchft lighthouse, quorum >= "
            f"{c.min_replicas}) {_placed(c)} global batch={c.batch_size} "
            f"({c.batch_size // c.replicas} per group){drill}")


PIPELINE_COLLECTIVE_TIMEOUT = 600.0  # seconds: a stage waits for its neighbours' whole forward/backward passes

register(Mode("dp", DataParallelConfig, "run_data_parallel", "data_parallel.training:dp_training",
              _describe_dp, finish=_finish_dp,
              builder_when={"elastic": "data_parallel.elastic:elastic_training"}))  # under project/elastic.py
register(Mode("pipeline", PipelineConfig, "run_pipeline", "pipeline.training:stage_training",
              _describe_pipeline, collective_timeout=PIPELINE_COLLECTIVE_TIMEOUT, in_process=lambda c: not c.multiprocess,
              run_in_process=_run_pipe))
register(Mode("tp", TensorParallelConfig, "run_tensor_parallel", "tensor_parallel.training:tp_training",
              _describe_tp))
register(Mode("3d", ThreeDConfig, "run_3d", "three_d.training:three_d_training", _describe_3d,
              collective_timeout=PIPELINE_COLLECTIVE_TIMEOUT))
register(Mode("cp", ContextParallelConfig, "run_context_parallel", "context_parallel.training:cp_training",
              _describe_cp))
register(Mode("moe", MoERunConfig, "run_moe", "moe.training:moe_training", _describe_moe))
# Replica groups start their own ranks (one process group each, under torchft's lighthouse): run_in_process.
register(Mode("ft", FaultTolerantConfig, "run_fault_tolerant", "fault_tolerance.training:ft_training", _describe_ft,
              finish=_finish_ft, in_process=lambda c: True, run_in_process=run_replica_groups))
