"""Training GPT-2 on Multi30k with pipeline parallelism: what ``project/run_pipeline.py`` runs.

What runs:

* ``--single_process sequential`` — the model split over ``--pp`` stages, the whole batch going
  through them one stage after another (:class:`pipeline.gpt2.GPT2Pipeline` with a single
  micro-batch). One process.
* ``--single_process pipe`` (the default) — the same stages, the batch cut into ``--micro_batches``
  micro-batches that flow through the clock-cycle schedule (:class:`pipeline.pipe.Pipe`), one worker
  thread per stage. One process.
* ``--schedule NAME``, a schedule of the registry (``gpipe``, ``1f1b``, ``interleaved``, ``zb-h1``, ``zbv``, ``dualpipev``:
  :data:`pipeline.schedules.SCHEDULES`) — one process per stage, activations and gradients sent
  between neighbours in the ``pp`` group of the run's mesh, the per-stage action lists of
  the schedule (:mod:`pipeline.stage_runner`). Every rank trains :func:`stage_training`'s stage (through
  ``project/train.py --mode pipeline``).

All modes minimise the same loss — the batch's mean next-token loss on target tokens —
so with dropout 0 they compute the same updates. The shared epoch runner
(:func:`course.epoch_runner.run_epochs`) writes
``<workdir>/pipeline_<schedule or single_process>_rank{r}_results_epoch{e}.json``, here with the per-stage
timeline of the epoch's last full batch.
"""
from __future__ import annotations

import contextlib
import os

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader

from course import trace
from course.collectives import global_rank
from course.launch import context
from course.epoch_runner import Evaluation, StepOutcome, TrainingMode, run_epochs, supervised_step
from course.loss import count_target_tokens, lm_loss
from course.model import parameter_fingerprint
from course.task import build_model, prepare_data, worker_env_quiet
from pipeline.gpt2 import GPT2Pipeline, gpt2_measured_balance, stage_devices
from pipeline.gpt2_stages import TiedGradients, gpt2_chunks, gpt2_stage, named_stage_parameters
from pipeline.schedules import SCHEDULES, micro_batches_per_round
from pipeline.stage_runner import StageRunner
from pipeline.step import gather_stages, pipeline_step

def micro_batch_size(config) -> int:
    """Rows per micro-batch: the whole batch for ``--single_process sequential``, else ``batch_size // micro_batches``."""
    return config.batch_size if config.kind == "sequential" else config.batch_size // config.micro_batches


def train_loader(data, config, epoch: int) -> DataLoader:
    """The epoch's shuffled batches — the same on every rank (seed ``config.seed + epoch``)."""
    g = torch.Generator().manual_seed(config.seed + epoch)
    return DataLoader(data.train, batch_size=config.batch_size, shuffle=True, generator=g, collate_fn=data.collate)


def _steps(loader, config) -> int:
    return len(loader) if config.max_batches is None else min(len(loader), config.max_batches)


class PipelineMode(TrainingMode):
    """What both kinds of pipeline run share: the batches, the configuration; ``mode`` is what runs (the schedule,
    or ``pipe``/``sequential``)."""

    def __init__(self, config, data, device, **kwargs):
        super().__init__(config, data, device, **kwargs)
        self.mode = config.kind

    def epoch_batches(self, epoch: int):
        loader = train_loader(self.data, self.config, epoch)
        return loader, _steps(loader, self.config)

    def record(self, world_size: int = 1, **extra) -> dict:
        config = self.config
        return {**config.record(), "mode": self.mode, "world_size": world_size,
                "micro_batches": 1 if self.mode == "sequential" else config.micro_batches,
                "micro_batch_size": micro_batch_size(config), **extra}


# ---- one process: --single_process pipe and sequential -------------------------------------

def cpu_threads_per_stage(config) -> int | None:
    """On CPU, give each stage ``cores // pp`` threads, as the 1f1b processes get
    (:mod:`course.launch`): a stage owns its share of the cores like it would own a GPU,
    and the stage threads of one clock cycle do not fight over the same cores. Returns the
    thread count (None on GPU)."""
    if config.device != "cpu":
        return None
    threads = max(1, (os.cpu_count() or 1) // config.pp)
    torch.set_num_threads(threads)
    return threads


class PipeTraining(PipelineMode):
    """``--single_process sequential`` / ``pipe``: :class:`pipeline.gpt2.GPT2Pipeline` in this process.

    With ``--device cuda`` stage s runs on ``cuda:s`` (:func:`pipeline.gpt2.stage_devices`): the epoch's
    clock synchronises every stage's GPU before it is read, and the results give each GPU's peak memory
    (``peak_memory_bytes_by_device``) beside the largest (``peak_memory_bytes``, on ``peak_memory_device``).
    """

    def __init__(self, config, data, model, piped, devices, threads, optimizer):
        super().__init__(config, data, devices[0], devices=devices)  # the clock and the memory meter: every stage's
        self.model, self.piped, self.devices, self.threads, self.optimizer = model, piped, devices, threads, optimizer

    def train_mode(self):
        self.piped.train()

    @contextlib.contextmanager
    def training(self, epoch: int):
        """Keep the timeline of the epoch's last training batch (evaluation runs the Pipe again)."""
        yield
        self.timeline = [dict(stage=s, kind=k, micro_batch=i, start=a, end=b)
                         for s, k, i, a, b in self.piped.pipe.timeline]

    def train_step(self, batch: dict) -> StepOutcome:
        outcome = supervised_step(self.piped, self.optimizer, batch, self.device, loss_fn=self._loss)
        if trace.active():  # course.trace: the stage threads' tasks of this step, a row per stage
            pipe = self.piped.pipe
            for stage, kind, i, start, end in pipe.timeline:
                trace.record(f"{kind}{i}", f"stage {stage}", pipe.timeline_origin + start,
                             pipe.timeline_origin + end, kind=kind, micro_batch=i, stage=stage)
        return outcome

    @staticmethod
    def _loss(piped, batch):
        logits = piped(batch["input_ids"])
        return lm_loss(logits, batch["labels"].to(logits.device))

    def evaluation(self) -> Evaluation:
        return Evaluation(self.piped, self.device,
                          logits_fn=lambda m, batch: m(batch["input_ids"]).to(batch["input_ids"].device))

    def epoch_extra(self, epoch: int, stats: dict) -> dict:
        return {"timeline": self.timeline, "timeline_note": "forward of the epoch's last batch, one row per stage task",
                "param_sha256": parameter_fingerprint(self.model)}

    def record(self) -> dict:
        return super().record(1, devices=[str(d) for d in self.devices], threads_per_stage=self.threads)


def run_single_process(config) -> list[str]:
    """Train with :class:`pipeline.gpt2.GPT2Pipeline` in this process; returns the results files.

    On CPU, torch's thread count is set to ``cores // pp`` for the run and restored after.
    """
    previous_threads = torch.get_num_threads()
    try:
        return _run_single_process(config)
    finally:
        torch.set_num_threads(previous_threads)


def _run_single_process(config) -> list[str]:
    worker_env_quiet()
    threads = cpu_threads_per_stage(config)
    torch.manual_seed(config.seed)
    data = prepare_data(config)
    model = build_model(config, data.tokenizer.vocab_size)
    devices = stage_devices(config.device, config.pp)
    piped = GPT2Pipeline(model, config.pp, micro_batch_size(config), devices=devices)
    piped.pipe.record_timeline = True
    optimizer = torch.optim.AdamW(model.parameters(), lr=config.learning_rate)
    return run_epochs(PipeTraining(config, data, model, piped, devices, threads, optimizer))


# ---- one process per stage: --schedule ------------------------------------------------------

class StageTraining(PipelineMode):
    """``--schedule NAME``: this rank trains its stage with the schedule's action list.

    Every rank reads the same batches; the first stage feeds the input_ids of each
    micro-batch, the last takes the labels and computes the loss. The tied embedding/head
    gradient is summed in the embedding group before each optimizer step. For evaluation
    the stages' weights are gathered in the pp group into every rank's full copy of the
    model, which is then evaluated with the sentences shared out over the pp group.
    """

    def __init__(self, config, data, device, mesh, model, stage, tied):
        super().__init__(config, data, device, rank=mesh.rank, world_group=mesh.group("world"),
                         show_progress=mesh.is_last_stage)
        self.mesh, self.model, self.stage, self.tied = mesh, model, stage, tied
        self.balance = None  # layers per (virtual) stage if --balance auto
        self.sync_tied = TiedGradients(mesh.embedding_group)
        self.optimizer = torch.optim.AdamW(stage.parameters(), lr=config.learning_rate)
        self.runner = StageRunner(stage, device, group=mesh.pp_group,
                                  loss_fn=lambda logits, t: lm_loss(logits, t[0], reduction="sum") / t[1],
                                  placement=SCHEDULES[self.mode].placement)

    def train_mode(self):
        self.stage.train()

    @property
    def checkpoint_key(self) -> str:
        return f"stage{self.runner.stage_index}"  # each stage saves its own layers and optimizer

    def checkpoint_module(self):
        return self.stage

    def training(self, epoch: int):
        self.timeline, self.peak_in_flight, self.peak_bytes = [], 0, 0
        return super().training(epoch)

    def train_step(self, batch: dict) -> StepOutcome:
        config, runner = self.config, self.runner
        inputs = list(batch["input_ids"].split(micro_batch_size(config)))
        micro_batches = len(inputs)
        labels = list(batch["labels"].split(micro_batch_size(config)))
        if SCHEDULES[self.mode].interleaved and micro_batches != valid_interleaved_micro(runner.n_stages, micro_batches):
            # a short last batch: fewer, unequal micro-batches that the interleaved schedule accepts
            micro_batches = valid_interleaved_micro(runner.n_stages, micro_batches)
            inputs = list(batch["input_ids"].tensor_split(micro_batches))
            labels = list(batch["labels"].tensor_split(micro_batches))
        schedule = self.mode
        if self.mode == "dualpipev" and micro_batches < 2 * runner.n_stages:  # a short last batch
            if len(batch["input_ids"]) >= 2 * runner.n_stages:  # DualPipeV takes at least 2p micro-batches
                micro_batches = 2 * runner.n_stages
                inputs = list(batch["input_ids"].tensor_split(micro_batches))
                labels = list(batch["labels"].tensor_split(micro_batches))
            else:  # fewer rows than stages: ZB-V, on the same V placement, takes any number
                schedule = "zbv"
        n_target = max(1, count_target_tokens(batch["labels"]))
        targets = [(t.to(self.device), n_target) for t in labels] if runner.is_last else None
        result = pipeline_step(runner, schedule, micro_batches, inputs, targets, lambda: self.sync_tied(self.tied))
        self.optimizer.step()
        self.peak_in_flight = max(self.peak_in_flight, result.peak_in_flight)
        self.peak_bytes = max(self.peak_bytes, result.peak_activation_bytes)
        if micro_batches == config.micro_batches or not self.timeline:
            self.timeline = result.timeline(runner.stage_index, "chunk")
        loss = sum(result.losses.values()) if runner.is_last else None
        return StepOutcome(loss, int(batch["attention_mask"].sum()))

    def batch_losses(self, losses):
        box = [losses]
        group = self.mesh.pp_group
        dist.broadcast_object_list(box, src=global_rank(group, self.runner.last_rank), group=group)
        return box[0]

    def gather_model(self):
        """Every stage's parameters gathered in the pp group into this rank's full GPT-2 (``self.model``,
        moved to the device); collective over pp. Returns the model."""
        gather_stages(self.model, named_stage_parameters(self.model, self.stage), self.mesh.pp_group)
        return self.model.to(self.device)

    def export_state(self) -> dict:
        """The stages gathered over pp (:meth:`gather_model`) as the GPT-2's state dict."""
        return {name: t.detach() for name, t in self.gather_model().state_dict().items()}

    def evaluation(self) -> Evaluation:
        return Evaluation(self.gather_model(), self.device, logits_fn=lambda m, b: m(input_ids=b["input_ids"]).logits,
                          group=self.mesh.pp_group)

    def epoch_extra(self, epoch: int, stats: dict) -> dict:
        return {"timeline": self.timeline, "peak_in_flight": self.peak_in_flight,
                "peak_activation_bytes": self.peak_bytes,
                "timeline_note": "forward and backward of every micro-batch of the epoch's last full batch on this stage",
                "param_sha256": parameter_fingerprint(self.model)}

    def record(self) -> dict:
        return super().record(self.runner.n_stages, schedule=self.mode, stage_rank=self.runner.stage_index,
                              stage_layers=sum(len(c) for c in self.runner.chunks),
                              balance=self.balance, mesh=self.mesh.describe())

    def progress_desc(self, epoch: int) -> str:
        return f"{self.mode} epoch {epoch} (last stage)"


def stage_training(config, data, mesh) -> StageTraining:
    """This rank's :class:`StageTraining` on ``mesh`` (its pp group), on the worker's device: the whole GPT-2 built
    (same seed on every rank), cut into this rank's stage (or ``config.virtual_stages`` chunks for a schedule that
    takes them), placed by layer count or, with ``config.balance == "auto"``, by measured cost. What
    ``project/train.py --mode pipeline`` trains (:mod:`project.modes`); the parity harness
    (``project/tools/parity.py``) steps it directly."""
    device = context().device
    world_size = mesh.dims.pp
    model = build_model(config, data.tokenizer.vocab_size)
    balance = None
    if config.balance == "auto":
        balance = measured_balance(config, data, model, device, mesh, world_size * config.virtual_stages)
    entry = SCHEDULES[config.schedule]
    if entry.interleaved or entry.placement == "v":
        chunks, tied = gpt2_chunks(model, mesh.stage, world_size, entry.chunks_per_rank(config.virtual_stages),
                                   balance, placement=entry.placement)
        stage = torch.nn.ModuleList(chunks)
    else:
        stage, tied = gpt2_stage(model, mesh.stage, world_size, balance)
    stage.to(device)
    training = StageTraining(config, data, device, mesh, model, stage, tied)
    training.balance = balance
    return training


def valid_interleaved_micro(n_stages: int, micro_batches: int) -> int:
    """The largest number of micro-batches ``<= micro_batches`` that interleaved 1F1B accepts
    (``micro_batches`` itself if valid)."""
    while micro_batches > 1:
        try:
            micro_batches_per_round(n_stages, micro_batches)
            return micro_batches
        except ValueError:
            micro_batches -= 1
    return 1


def measured_balance(config, data, model, device, mesh, n_parts: int) -> list[int]:
    """``--balance auto``: layers per (virtual) stage from the measured cost of each layer on a
    micro-batch of the first training batch (:func:`pipeline.gpt2.gpt2_measured_balance`), with
    this rank's threads. Every rank of the pp group measures at once, under the load of the run,
    and all get the partition of the per-layer medians."""
    batch = next(iter(train_loader(data, config, 0)))
    sample = batch["input_ids"][:micro_batch_size(config)]
    model.to(device)
    balance, _ = gpt2_measured_balance(model, n_parts, sample, group=mesh.pp_group)
    model.to("cpu")
    return balance
