"""The one epoch runner: train, evaluate, translate and score, write the results — for every mode.

Every run script (data, pipeline, tensor parallel, and their combinations) trains the same
way, epoch after epoch:

1. take the epoch's batches (:meth:`TrainingMode.epoch_batches`),
2. run the mode's training step on each (:meth:`TrainingMode.train_step`), with a tqdm
   progress bar on one rank,
3. evaluate: validation loss, greedy translations and corpus BLEU, the work shared out over
   a group of ranks if the mode says so (:meth:`TrainingMode.evaluation`),
4. write one results file per rank (:func:`course.results.write_results`) and the scored
   translations — into the run's own staging folder, moved into the work directory by rank 0 once every rank
   has finished (:func:`course.results.publish_results`): a failed run replaces no results.

What differs between modes — how a batch is cut up, what one step does, which groups
communicate — lives in the part's ``training.py`` as a :class:`TrainingMode` subclass;
:func:`run_epochs` does the rest. See docs/architecture.md, "The epoch runner".

With ``--trace FILE`` the run's event recorder (:mod:`course.trace`) is active throughout: each step,
forward, backward, optimizer step, collective, evaluation and checkpoint is a span, and the ranks'
spans end up in one Chrome/Perfetto trace. With ``--profile`` each rank also profiles a few steps of
its first epoch with ``torch.profiler`` (:mod:`course.profiler`).
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, Subset

from course import trace
from course.collectives import group_rank, group_size
from course.decoding import corpus_bleu, translate
from course.loss import count_target_tokens, lm_loss, model_loss
from course.measure import MemoryMeter, now, timer_name
from course.results import prepare_staging, publish_results, staging_dir, write_json, write_results


def to_device(batch: dict, device) -> dict:
    return {k: v.to(device, non_blocking=True) if torch.is_tensor(v) else v for k, v in batch.items()}


@dataclass
class StepOutcome:
    """What one training step reports: the batch loss this rank saw (None if it saw none,
    e.g. a pipeline stage before the last) and the non-padding input tokens it processed."""

    loss: float | None
    tokens: int


def supervised_step(model, optimizer, batch: dict, device, *, loss_fn: Callable | None = None,
                    after_backward: Callable | None = None) -> StepOutcome:
    """One optimizer step: ``zero_grad``, ``loss = loss_fn(model, batch)``, ``backward``,
    ``after_backward(model)`` (e.g. gradient averaging), ``optimizer.step()``.

    ``batch`` holds (batch, seq) tensors (see :class:`course.collate.Collate`); ``loss_fn``
    defaults to :func:`course.loss.model_loss`.
    """
    batch = to_device(batch, device)
    optimizer.zero_grad(set_to_none=True)
    with trace.span("forward", "compute", device):  # course.trace: spans while a recorder is active
        loss = (loss_fn or model_loss)(model, batch)
    with trace.span("backward", "compute", device):
        loss.backward()
    if after_backward is not None:  # the gradients' synchronisation: a span of its own (collectives inside it nest)
        with trace.span("gradient sync", "communication", device, kind="after_backward"):
            after_backward(model)
    optimizer.step()  # a span too (the recorder's optimizer-step hook)
    return StepOutcome(loss.item(), int(batch["attention_mask"].sum()))


def _progress(batches, total, desc, show):
    """``iter(batches)``, wrapped in a tqdm bar when ``show``.

    The loader is iterated exactly once here: handing tqdm the DataLoader itself draws from
    a shuffling loader's generator an extra time, so the rank with the bar would see a
    different batch order than the others.
    """
    batches = iter(batches)
    if not show:
        return batches
    from tqdm.auto import tqdm

    return tqdm(batches, total=total, desc=desc, dynamic_ncols=True, leave=True)


def train_epoch(step: Callable[[dict], StepOutcome], batches: Iterable, n_steps: int, *, desc: str = "train",
                show_progress: bool = True, done: dict | None = None, before_first: Callable | None = None,
                after_step: Callable[[int, dict], None] | None = None, device=None, first_step: int = 0) -> dict:
    """Run ``step(batch)`` on the first ``n_steps`` batches of ``batches``.

    Args:
        device: the device the steps run on, or a list of them (a one-process pipeline's stages): the
            clock is read after their queued work has run (:func:`course.measure.now`), so ``time`` is
            the steps' own on GPUs too.
        done: resuming: ``{"steps", "losses", "tokens", "time"}`` of this epoch's steps already
            taken; their batches are skipped (the iterator is advanced past them).
        before_first: called once, after the skip, before the first step is run (where a resumed
            run restores its random generators).
        after_step: ``after_step(steps_done, stats)`` after every step (e.g. to checkpoint).
        first_step: the run's number of this epoch's first step (optimizer steps before it): the
            event recorder's steps are numbered through the run (:func:`course.trace.step`).

    Returns:
        dict with ``losses`` (per step; None where this rank saw no loss), ``loss`` (their
        mean), ``tokens`` (non-padding input tokens this rank processed), ``steps`` and
        ``time`` (seconds).
    """
    done = done or {}
    losses, tokens, skip = list(done.get("losses", [])), int(done.get("tokens", 0)), int(done.get("steps", 0))
    earlier = float(done.get("time", 0.0))
    bar = _progress(batches, n_steps, desc, show_progress)
    if skip and show_progress:
        bar.update(skip)
    start, paused = now(device), 0.0  # paused: seconds spent in after_step (checkpoints), not training
    for n, batch in zip(range(n_steps), bar):
        if n < skip:
            continue
        if n == skip and before_first is not None:
            before_first()
        with trace.step(first_step + n, device):  # course.trace: the step's span, while a recorder is active
            outcome = step(batch)
        losses.append(outcome.loss)
        tokens += outcome.tokens
        elapsed = earlier + now(device) - start - paused
        if show_progress:
            shown = {} if outcome.loss is None else {"loss": f"{outcome.loss:.3f}"}
            bar.set_postfix(**shown, tok_s=f"{tokens / elapsed:.0f}")
        if after_step is not None:
            began = now(device)
            after_step(n + 1, {"steps": n + 1, "losses": losses, "tokens": tokens, "time": elapsed})
            paused += now(device) - began
    if show_progress and hasattr(bar, "close"):
        bar.close()
    elapsed = earlier + now(device) - start - paused
    seen = [x for x in losses if x is not None]
    return {"loss": sum(seen) / max(1, len(seen)), "losses": losses, "tokens": tokens,
            "steps": len(losses), "time": elapsed}


def _reduce(values: list[float], group, op) -> list[float]:
    if group is None or not dist.is_initialized() or group_size(group) == 1:
        return values
    # Sums and maxima of a few floats the host already holds: a host tensor, reduced over the group's gloo
    # back-end (docs/architecture.md, "Devices and back-ends"), with no copy to a GPU and back.
    t = torch.tensor(values, dtype=torch.float64, device="cpu")
    dist.all_reduce(t, op=op, group=group)
    return t.tolist()


@torch.no_grad()
def evaluate_loss(model, loader, device, *, logits_fn: Callable | None = None, max_batches: int | None = None,
                  group=None) -> float:
    """Mean target-token loss over ``loader`` (nats/token).

    ``logits_fn(model, batch)`` returns (batch, seq, vocab) logits (default
    ``model(input_ids, attention_mask).logits``). With ``group``, each rank of it passes
    its own share of the validation set and the sums are all-reduced in ``group``, so the
    result is the mean over all of them.
    """
    model.eval()
    loss_sum, count = 0.0, 0
    for step, batch in enumerate(loader):
        if max_batches is not None and step >= max_batches:
            break
        batch = to_device(batch, device)
        logits = logits_fn(model, batch) if logits_fn else model(
            input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
        loss_sum += lm_loss(logits, batch["labels"], reduction="sum").item()
        count += count_target_tokens(batch["labels"])
    loss_sum, count = _reduce([loss_sum, float(count)], group, dist.ReduceOp.SUM)
    return loss_sum / max(1.0, count)


@dataclass
class Evaluation:
    """How a mode evaluates after an epoch.

    Attributes:
        model: what ``logits_fn`` runs (in eval mode).
        device: where its inputs go.
        logits_fn: ``(model, batch) -> (batch, seq, vocab)`` full logits; None: ``model(...).logits``.
        group: share the validation set and the BLEU sentences out over the ranks of this
            group (None: every rank evaluates everything).
    """

    model: torch.nn.Module
    device: torch.device
    logits_fn: Callable | None = None
    group: object = None


class TrainingMode:
    """One kind of training run, as the epoch runner sees it. Subclasses live in the parts.

    Args:
        config: the run's configuration (a :class:`course.config.RunConfig`).
        data: :class:`course.task.Data`.
        device: this rank's device.
        rank: this process's global rank (0 in a single process): it names the results file.
        world_group: the group of every rank of the run (None: one process). The slowest
            rank's epoch time is taken over it.
        throughput_group: the ranks that process *different* tokens (the dp group; None:
            every rank sees the whole batch). Their tokens are summed for
            ``global_tokens_per_sec``.
        show_progress: whether this rank draws the progress bar.
        devices: every device this rank's training step runs on (default ``[device]``): a one-process
            pipeline with stage s on ``cuda:s`` lists them all, so the epoch's clock waits for every one
            of them (:func:`course.measure.now`) and the results give each one's peak memory.
    """

    mode = "training"
    results_prefix = ""  # the files' prefix when ``config`` names none (a run's is its configuration's, below)

    def __init__(self, config, data, device, *, rank: int = 0, world_group=None, throughput_group=None,
                 show_progress: bool = True, devices: list | None = None):
        self.config, self.data, self.device, self.rank = config, data, torch.device(device), rank
        # One home for a mode's results prefix: its configuration (course.config.RunConfig.results_prefix), which
        # also checks the work directory for these files before any process starts.
        self.results_prefix = getattr(config, "results_prefix", self.results_prefix)
        self.devices = [torch.device(d) for d in devices] if devices else [self.device]
        self.world_group, self.throughput_group = world_group, throughput_group
        self.show_progress = show_progress and not config.quiet

    def epoch_batches(self, epoch: int) -> tuple[Iterable, int]:
        """The epoch's batches and how many steps to run."""
        raise NotImplementedError

    def train_step(self, batch: dict) -> StepOutcome:
        """One training step on ``batch`` (forward, backward, communication, optimizer step)."""
        raise NotImplementedError

    def train_mode(self) -> None:
        """Put the modules that train in training mode (dropout on); evaluation switched them to eval."""
        model = getattr(self, "model", None)
        if model is not None:
            model.train()

    def training(self, epoch: int):
        """A context manager around the epoch's training steps (e.g. a communication counter)."""
        return contextlib.nullcontext()

    def batch_losses(self, losses: list[float | None]) -> list[float]:
        """The per-step batch losses to record (e.g. sent from the rank that computed them)."""
        return losses

    def evaluation(self) -> Evaluation:
        raise NotImplementedError

    # ---- checkpoints (course.checkpoint) ----
    checkpoint_key = ""  # what differs between ranks goes under this rank's own key (e.g. "tp0", "stage1")

    def checkpoint_module(self) -> torch.nn.Module:
        """The module whose parameters ``self.optimizer`` updates (default ``self.model``)."""
        return self.model

    def checkpoint_state(self) -> dict:
        """The model's and optimizer's state, keyed by parameter name (under :attr:`checkpoint_key`)."""
        from torch.distributed.checkpoint.state_dict import get_state_dict

        model_state, optim_state = get_state_dict(self.checkpoint_module(), self.optimizer)
        state = {"model": model_state, "optim": optim_state}
        return {self.checkpoint_key: state} if self.checkpoint_key else state

    def load_checkpoint_state(self, state: dict) -> None:
        """Put a loaded :meth:`checkpoint_state` back into the model and optimizer."""
        from torch.distributed.checkpoint.state_dict import set_state_dict

        state = state[self.checkpoint_key] if self.checkpoint_key else state
        set_state_dict(self.checkpoint_module(), self.optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])

    def export_state(self) -> dict[str, torch.Tensor]:
        """The trained model as one ``transformers.GPT2LMHeadModel`` state dict of full tensors, on every
        rank (collective in modes whose ranks hold parts of it), for ``--export_hf``
        (:mod:`course.hf_export`). This default serves modes whose ``self.model`` is that model.

        Raises:
            NotImplementedError: the mode's model is not a ``GPT2LMHeadModel`` and the mode says nothing else.
        """
        from transformers import GPT2LMHeadModel

        model = getattr(self, "model", None)
        if not isinstance(model, GPT2LMHeadModel):
            raise NotImplementedError(f"{type(self).__name__} cannot export its {type(model).__name__} as a Hugging "
                                      "Face GPT-2 (override export_state)")
        return {name: t.detach() for name, t in model.state_dict().items()}

    def epoch_extra(self, epoch: int, stats: dict) -> dict:
        """Mode-specific entries of the epoch's results file."""
        return {}

    def record(self) -> dict:
        """What every results file keeps under ``config``: the run's configuration and the mode's own entries."""
        return {"mode": self.mode}

    def progress_desc(self, epoch: int) -> str:
        return f"{self.mode} epoch {epoch}"

    def trace_name(self) -> str:
        """This rank's name in traces: its rank and, when the mode has a ``mesh``, its coordinates
        (:func:`course.trace.process_name`)."""
        return trace.process_name(self.rank, getattr(self, "mesh", None))


VALIDATION_BATCH_SIZE = 64  # sentences per validation batch (``--max_val_batches`` counts these)


def validation_loader(dataset, group=None, batch_size: int = VALIDATION_BATCH_SIZE, collate=None,
                      max_batches: int | None = None) -> DataLoader:
    """Batches of ``dataset``, or of this rank's share (examples r, r + size, ...) of it with ``group``.

    ``max_batches``: only the first ``max_batches * batch_size`` examples are scored — the same ones
    however many ranks share them (a cap on each rank's batches would score more examples on more ranks).
    """
    if max_batches is not None:
        dataset = Subset(dataset, range(min(len(dataset), max_batches * batch_size)))
    if group is not None:
        dataset = Subset(dataset, range(group_rank(group), len(dataset), group_size(group)))
    return DataLoader(dataset, batch_size=batch_size, collate_fn=collate)


class _Checkpoints:
    """The runner's side of :mod:`course.checkpoint`: what a checkpoint holds, when to write one (synchronously,
    or in the background with ``--async_checkpoint``), resuming — also at another world size."""

    def __init__(self, mode: TrainingMode):
        from course.checkpoint import checkpoint_group, checkpoint_root

        self.mode = mode
        self.every = mode.config.checkpoint_every
        self.root = checkpoint_root(mode.config.workdir, mode.results_prefix)
        self.save_seconds: list[float] = []  # each checkpoint written by this run (not counted as training)
        self.wait_seconds: list[float] = []  # async: each end-of-epoch wait for the save still in flight
        self.load_seconds: float | None = None
        self.resumed_world_size: int | None = None
        self.keep = mode.config.keep_checkpoints
        self.asynchronous = bool(self.every) and bool(getattr(mode.config, "async_checkpoint", False))
        self.save_group = checkpoint_group(mode.world_group) if self.asynchronous else None
        self.pending = None  # async: the course.checkpoint.PendingCheckpoint in flight

    def _state(self, epoch: int, global_step: int, stats: dict, source: int | None = None) -> dict:
        """What a checkpoint holds; ``source``: load the random generators and progress another rank
        wrote (resuming at another world size)."""
        from course.checkpoint import rng_state

        rank = self.mode.rank if source is None else source
        mine = {"steps": stats["steps"], "losses": list(stats["losses"]), "tokens": stats["tokens"],
                "time": stats["time"]}
        return {**self.mode.checkpoint_state(), f"rng_rank{rank}": rng_state(self.mode.device),
                "progress": {"epoch": epoch, "global_step": global_step, f"rank{rank}": mine}}

    def maybe_save(self, epoch: int, global_step: int, stats: dict) -> None:
        from course.checkpoint import save_checkpoint, save_checkpoint_async

        if self.pending is not None:
            self.pending.poll()  # commits a finished background save (rank 0), never waits
        if self.every and global_step % self.every == 0:
            with trace.span("checkpoint save", "checkpoint", self.mode.device, step=global_step):
                began = now(self.mode.device)
                state = self._state(epoch, global_step, stats)
                if self.asynchronous:
                    if self.pending is not None:
                        self.pending.wait()  # one save in flight at a time
                    self.pending = save_checkpoint_async(self.root, global_step, state, rank=self.mode.rank,
                                                         group=self.mode.world_group, save_group=self.save_group,
                                                         keep=self.keep)
                else:
                    save_checkpoint(self.root, global_step, state, rank=self.mode.rank, group=self.mode.world_group,
                                    keep=self.keep)
                self.save_seconds.append(now(self.mode.device) - began)

    def finish(self) -> None:
        """Wait for the save still in flight (async) and commit it: an epoch's results are written after
        its checkpoints are complete, and a run never ends with one half written."""
        if self.pending is not None:
            began = now(self.mode.device)
            self.pending.wait()
            self.pending = None
            self.wait_seconds.append(now(self.mode.device) - began)

    def extra(self) -> dict:
        """What the results file records about checkpoints (seconds to write and to load one; async: the
        seconds each save held training up — staging — and the end-of-epoch waits)."""
        found = {}
        if self.save_seconds:
            found["checkpoint_save_seconds"] = list(self.save_seconds)
            found["checkpoint_async"] = self.asynchronous
        if self.wait_seconds:
            found["checkpoint_wait_seconds"] = list(self.wait_seconds)
        if self.load_seconds is not None:
            found["checkpoint_load_seconds"] = self.load_seconds
        if self.resumed_world_size is not None:
            found["resumed_from_world_size"] = self.resumed_world_size
        return found

    resuming = False  # whether this run continues from a checkpoint (set by resume)

    def resume_point(self) -> Path | None:
        """The checkpoint to resume from (None: a fresh start), chosen and verified against its manifest by rank 0
        alone (:func:`course.checkpoint.choose_checkpoint`) before any rank loads, and handed to the others: every
        rank loads the same checkpoint, and a damaged one stops every rank with the same message. Rank 0 says which
        damaged checkpoints it skipped (``--resume latest``, a restart).

        Raises:
            ValueError, FileNotFoundError: no checkpoint to resume, or a damaged one (naming the file, the step and
                the newest intact checkpoint), on every rank.
        """
        from course.checkpoint import choose_checkpoint

        group = self.mode.world_group
        shared = _shared(self.mode) and dist.get_world_size(group) > 1
        decision: list = [None]
        if _first_of_group(self.mode):  # the deciding rank: the group's first, or each lone rank
            try:
                point = choose_checkpoint(self.mode.config.resume, self.root)
                decision[0] = ("ok", None if point.path is None else str(point.path))
                for damaged in point.skipped:
                    print(f"{damaged.path} (step {damaged.step}) is damaged: {damaged.file} {damaged.problem}; "
                          "skipped", flush=True)
                if point.path is None and point.skipped:
                    print("no intact checkpoint is left: starting afresh", flush=True)
            except (ValueError, FileNotFoundError) as exc:
                decision[0] = ("error", str(exc))
        if shared:
            dist.broadcast_object_list(decision, group=group, group_src=0)  # pickled: over the group's gloo back-end
        status, value = decision[0]
        if status == "error":
            raise ValueError(value)
        return None if value is None else Path(value)

    def resume(self) -> tuple[int, int, dict | None, Callable | None]:
        """``(epoch, global step, this rank's done-so-far of that epoch, restore-RNG callback)`` from the
        checkpoint to resume from; ``(0, 0, None, None)`` for a fresh start.

        A checkpoint written by ``W`` ranks holds ``W`` entries of random generators and progress; rank
        ``r`` of this run takes entry ``r % W`` (its own when the world size is the same). Whether the
        mode's model and optimizer state load at another world size is the mode's business
        (:meth:`TrainingMode.load_checkpoint_state`; the run scripts refuse what their mode cannot)."""
        from course.checkpoint import load_checkpoint, saved_world_size, set_rng_state

        path = self.resume_point()
        self.resuming = path is not None
        if path is None:
            return 0, 0, None, None
        rank = self.mode.rank
        saved = saved_world_size(path)
        source = rank % saved
        empty = {"steps": 0, "losses": [], "tokens": 0, "time": 0.0}
        with trace.span("checkpoint load", "checkpoint", self.mode.device):
            began = now(self.mode.device)
            state = load_checkpoint(path, self._state(0, 0, empty, source), group=self.mode.world_group)
            self.load_seconds = now(self.mode.device) - began
        self.mode.load_checkpoint_state(state)
        progress, rng = state["progress"], state[f"rng_rank{source}"]
        world = dist.get_world_size(self.mode.world_group) if dist.is_initialized() else 1
        if saved != world:
            self.resumed_world_size = saved
        if rank == 0:
            moved = f", written by {saved} ranks, continued by {world}" if saved != world else ""
            print(f"resuming from {path}: epoch {progress['epoch']}, after step {progress[f'rank{source}']['steps']} "
                  f"of it (global step {progress['global_step']}){moved}", flush=True)
        return (progress["epoch"], progress["global_step"], progress[f"rank{source}"],
                lambda: set_rng_state(rng, self.mode.device))


def run_epochs(mode: TrainingMode) -> list[str]:
    """Train ``mode.config.n_epochs`` epochs; after each, evaluate and write this rank's results.

    Writes ``<workdir>/{prefix}rank{r}_results_epoch{e}.json`` (validation_loss, bleu,
    training_time, tokens_per_sec, global_tokens_per_sec, train_loss, train_losses, steps,
    tokens, the mode's extras and ``config``) and, on rank 0, the scored translations
    ``{prefix}translations_epoch{e}.json``. With ``config.checkpoint_every`` it writes a
    checkpoint every that many optimizer steps, and with ``config.resume`` (or after a restart)
    it continues from one (:mod:`course.checkpoint`). With ``config.trace`` every rank records its spans
    (:mod:`course.trace`; the last ``config.trace_steps`` steps) and rank 0 writes the run's trace there;
    with ``config.profile`` every rank writes a torch.profiler trace of a few steps of its first epoch
    (:mod:`course.profiler`). Every file is written into the run's staging folder and moved into ``<workdir>`` by
    rank 0 once every rank has finished (:func:`course.results.publish_results`): the results in ``<workdir>``
    are a whole succeeded run's, never part of a failed one's.

    Returns:
        The results files this rank wrote (their paths in ``<workdir>``, where they are once this returns).
    """
    config = mode.config
    recorder = trace.Recorder(mode.device, max_steps=config.trace_steps) if config.trace else None
    with trace.recording(recorder) if recorder is not None else contextlib.nullcontext():
        written, resuming = _run_epochs(mode)
    if recorder is not None:
        from course.profiler import profile_path

        profile = profile_path(staging_dir(config.workdir, mode.results_prefix), mode.results_prefix,
                               mode.rank) if config.profile else None
        found = trace.write_run_trace(recorder, config.trace, rank=mode.rank, name=mode.trace_name(),
                                      group=mode.world_group, profile=profile)
        if found is not None:
            print(f"trace: {found} (chrome://tracing or https://ui.perfetto.dev)", flush=True)
    _publish(mode, resuming)
    return written


def _profiler(mode: TrainingMode, n_steps: int):
    """``--profile``: a :class:`course.profiler.StepProfiler` over ``n_steps`` steps (else a stand-in)."""
    if not mode.config.profile or n_steps < 1:
        return contextlib.nullcontext(None)
    from course.profiler import StepProfiler, profile_path

    return StepProfiler(profile_path(staging_dir(mode.config.workdir, mode.results_prefix), mode.results_prefix,
                                     mode.rank), n_steps, mode.device,
                        mode.trace_name())


def _staging(mode: TrainingMode, resuming: bool) -> Path:
    """The folder this run's ranks write their results into until it has succeeded (:func:`run_epochs`): rank 0
    prepares it (:func:`course.results.prepare_staging`) while the others wait."""
    if _first_of_group(mode):
        prepare_staging(mode.config.workdir, mode.results_prefix, _world_size(mode), resuming)
    if _shared(mode):
        dist.barrier(group=mode.world_group)
    return staging_dir(mode.config.workdir, mode.results_prefix)


def _world_size(mode: TrainingMode) -> int:
    return dist.get_world_size(mode.world_group) if _shared(mode) else 1


def _shared(mode: TrainingMode) -> bool:
    """Whether this run's ranks share a world group (a rank trained alone, as in DiLoCo's lab, has none)."""
    return dist.is_initialized() and mode.world_group is not None


def _first_of_group(mode: TrainingMode) -> bool:
    """Whether this rank handles the run's files: the world group's first rank, or a rank that trains alone."""
    return not _shared(mode) or dist.get_rank(mode.world_group) == 0


def _publish(mode: TrainingMode, resuming: bool) -> None:
    """Once every rank has written all of the run's files: rank 0 moves them into the work directory
    (:func:`course.results.publish_results`), and every rank returns once they are there."""
    shared = _shared(mode)
    if shared:
        dist.barrier(group=mode.world_group)
    if _first_of_group(mode):
        publish_results(mode.config.workdir, mode.results_prefix, _world_size(mode), resuming)
    if shared:
        dist.barrier(group=mode.world_group)  # (a rank may read its results as soon as run_epochs returns)


def _run_epochs(mode: TrainingMode) -> list[str]:
    config, data = mode.config, mode.data
    checkpoints = _Checkpoints(mode)
    first_epoch, resumed_step, done, restore_rng = checkpoints.resume()
    staging = _staging(mode, checkpoints.resuming)
    steps_before = resumed_step - (done["steps"] if done else 0)  # optimizer steps before this epoch
    written = []
    for epoch in range(first_epoch, config.n_epochs):
        batches, n_steps = mode.epoch_batches(epoch)
        mode.train_mode()
        profiled = n_steps - (done["steps"] if done else 0) if epoch == first_epoch else 0  # the first epoch's
        with mode.training(epoch), MemoryMeter(mode.devices) as memory, _profiler(mode, profiled) as profiler:

            def after_step(n, so_far, e=epoch, base=steps_before):  # not counted as training time
                checkpoints.maybe_save(e, base + n, so_far)
                if profiler is not None:
                    profiler.step()

            stats = train_epoch(mode.train_step, batches, n_steps, desc=mode.progress_desc(epoch),
                                show_progress=mode.show_progress, done=done, before_first=restore_rng,
                                after_step=after_step, device=mode.devices, first_step=steps_before)
        checkpoints.finish()
        done = restore_rng = None
        steps_before += n_steps
        losses = mode.batch_losses(stats["losses"])
        with trace.span("evaluation", "evaluation", mode.device, epoch=epoch):
            ev = mode.evaluation()
            loader = validation_loader(data.validation, ev.group, collate=data.collate,
                                       max_batches=config.max_val_batches)
            with trace.span("validation loss", "evaluation", mode.device):
                validation_loss = evaluate_loss(ev.model, loader, ev.device, logits_fn=ev.logits_fn, group=ev.group)
            bleu, translations = float("nan"), []
            if config.n_bleu:
                with trace.span("translation and BLEU", "evaluation", mode.device, sentences=config.n_bleu):
                    sources, hyps, refs = translate(ev.model, data.tokenizer, data.test[: config.n_bleu], ev.device,
                                                    ev.group, max_length=config.model_max_length,
                                                    logits_fn=ev.logits_fn)
                bleu = corpus_bleu(hyps, refs)
                translations = [{"source": s, "reference": r, "hypothesis": h} for s, h, r in zip(sources, hyps, refs)]
        slowest, = _reduce([stats["time"]], mode.world_group, dist.ReduceOp.MAX)
        all_tokens, = _reduce([float(stats["tokens"])], mode.throughput_group, dist.ReduceOp.SUM)
        payload = {
            "validation_loss": validation_loss,
            "bleu": bleu,
            "training_time": stats["time"],
            "tokens_per_sec": stats["tokens"] / stats["time"],
            "global_tokens_per_sec": all_tokens / slowest,
            "train_loss": sum(losses) / max(1, len(losses)),
            "train_losses": losses,
            "steps": stats["steps"],
            "tokens": stats["tokens"],
            "timer": timer_name(mode.devices),  # how training_time was read (course.measure)
            "peak_memory_bytes": memory.peak_bytes, "memory": memory.measure,  # the largest of the devices'
            "peak_memory_device": memory.peak_device, "peak_memory_bytes_by_device": memory.peak_bytes_by_device,
            **mode.epoch_extra(epoch, stats),
            **checkpoints.extra(),
            "config": mode.record(),
        }
        prefix = mode.results_prefix
        written.append(str(Path(config.workdir) / write_results(staging, mode.rank, epoch, payload, prefix=prefix).name))
        if mode.rank == 0 and translations:
            write_json(staging / f"{prefix}translations_epoch{epoch}.json", translations)
    if getattr(config, "export_hf", None):
        from course.hf_export import export_hf

        folder = export_hf(mode.export_state(), config, data.tokenizer, mode=mode.mode, rank=mode.rank,
                           group=mode.world_group)
        if mode.rank == 0:
            print(f"exported the model to {folder} (transformers: GPT2LMHeadModel.from_pretrained)", flush=True)
    return written, checkpoints.resuming
