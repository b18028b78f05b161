"""The training mode of ``project/run_3d.py``: GPT-2 on a ``dp x pp x tp`` mesh, run by the epoch runner.

Every rank builds the run's :class:`course.mesh.Mesh`, the same dense GPT-2 (same seed) and
from it its :class:`three_d.stage.TensorParallelStage`; every rank reads the same global
batches in the same order and keeps its dp rank's rows. Each step is
:func:`three_d.step.three_d_step` (pipeline schedule over pp, tp stages, tied sum, dp
average, global clip) followed by AdamW on the stage's parameters.

Evaluation: the stages' parameters are gathered in the pp group into every rank's full
tensor-parallel model (:class:`tensor_parallel.TensorParallelGPT2`, the one the stage was cut
from), which the ranks of a tp group evaluate together; the validation sentences are shared
out over the dp group.

Results (``<workdir>/three_d_rank{r}_results_epoch{e}.json``) carry, besides the common
entries: the timeline of the epoch's last full batch on this rank (F/B per micro-batch) and
its communication (``comm_timeline``: every all-reduce, all-gather, send and receive with its
group and bytes), both spans of the course's event recorder (:mod:`course.trace`, one clock,
a recorder of the step's own), communication per group and kind (count, bytes, per step), peak
activation bytes, the rank's coordinates and groups.

**What is timed.** Timing a span synchronises a GPU before and after it — around every forward,
backward, tp all-reduce and pipeline exchange — which takes away the overlap of host and device that
training relies on. So a step is recorded (its own recorder; the stage runner's clock) only when that
is asked for: every step while the run's trace is on (``--trace``: a recorder active, as the
results' timelines then come from each step), else only the epoch's **last** step, whose timeline the
results file reports. The other steps read no clock and keep no span; ``training_time`` and
``tokens_per_sec`` include one timed step per epoch.

Checkpoints (``--checkpoint_every N``, ``--resume DIR``; :mod:`course.checkpoint`) are
layout-independent across dp and pp: :meth:`ThreeDTraining.checkpoint_state` keys every weight
and its AdamW state by its name in the whole model and its tp rank only, so a checkpoint written
at (dp, pp, tp) = (1, 4, 2) resumes at (2, 2, 2) — every rank loads the layers of its new stage,
DCP reading them from whichever files hold them. Not across tp (refused before any process
starts, naming the tp to use) nor across world sizes (the progress and random generators are
kept per rank number). The per-rank random generators and progress entries are restored by rank
number: after a change of layout rank r gets the generators of the old rank r, which had another
role, so dropout masks differ from an uninterrupted run's (with ``--dropout 0`` nothing random
is drawn in training and the resumed losses equal the uninterrupted run's, tested); the step
losses before the resume are taken from whichever rank recorded them (:meth:`batch_losses`).
"""
from __future__ import annotations

import contextlib
import warnings

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.utils.data import DataLoader, Subset

import pipeline
import tensor_parallel
from course import trace
from course.collectives import CommCounter
from course.epoch_runner import Evaluation, StepOutcome, TrainingMode
from course.launch import context
from course.task import build_model
from three_d.rank_setup import ThreeDRank, setup_rank
from three_d.step import three_d_step

LAYOUT_KEY = "three_d_layout"  # (dp, pp, tp) of the run that wrote a checkpoint


def checkpoint_layout(path) -> dict:
    """``{"dp", "pp", "tp"}`` of the run that wrote checkpoint ``path`` (read in this process alone,
    no process group needed: the script checks it before starting any).

    Raises:
        ValueError: ``path`` is not a checkpoint of a 3D run.
    """
    layout = {LAYOUT_KEY: torch.zeros(3, dtype=torch.int64, device="cpu")}
    try:
        with warnings.catch_warnings():  # "assuming the intent is to load in a single process": it is
            warnings.simplefilter("ignore", UserWarning)
            dcp.load(layout, checkpoint_id=str(path), no_dist=True)
    except Exception as exc:  # DCP reports a missing key as a CheckpointException
        raise ValueError(f"--resume {path} is not a checkpoint of project/run_3d.py (no {LAYOUT_KEY} in it: "
                         f"{type(exc).__name__})") from exc
    return dict(zip(("dp", "pp", "tp"), (int(x) for x in layout[LAYOUT_KEY])))


def tp_mismatch_message(saved: dict, tp: int) -> str:
    return (f"--resume: the checkpoint was written at dp={saved['dp']} pp={saved['pp']} tp={saved['tp']}, this run "
            f"has --tp {tp}; a checkpoint reshards across --dp and --pp but not --tp (the fused QKV shards and the "
            f"padded vocabulary depend on tp): resume with --tp {saved['tp']}")


def evaluation_group(mesh):
    """The ranks that share out evaluation (validation loss, BLEU): every rank with this rank's tp
    rank — all dp replicas *and* all stages, since after training every rank puts the whole model
    together (:meth:`ThreeDTraining.evaluation`). Its tp peers get the same share (their group
    rank is the same), as the tensor-parallel forward needs. Collective: every rank creates
    every such group, in the same order."""
    d = mesh.dims
    mine = None
    for tp in range(d.tp):
        ranks = [d.rank_of(s, dp, tp) for s in range(d.pp) for dp in range(d.dp)]
        group = dist.new_group(ranks, group_desc="evaluation")
        if mesh.rank in ranks:
            mine = group
    return mine


@contextlib.contextmanager
def _recording_step(recorder):
    """``recorder`` active in the block, which is its span ``"3D step"`` (row ``step``); nothing if None."""
    if recorder is None:
        yield
        return
    with trace.recording(recorder), recorder.span("3D step", "step"):
        yield


class ThreeDTraining(TrainingMode):
    """One rank of a 3D run: its stage's tp shard, its dp rank's rows of every batch."""

    mode = "three_d"

    def __init__(self, config, data, device, rank_setup: ThreeDRank):
        mesh, stage = rank_setup.mesh, rank_setup.stage
        super().__init__(config, data, device, rank=mesh.rank, world_group=mesh.group("world"),
                         throughput_group=mesh.dp_group,
                         show_progress=mesh.is_last_stage and mesh.dp_rank == 0 and mesh.tp_rank == 0)
        self.mesh, self.stage = mesh, stage
        self.optimizer = torch.optim.AdamW(stage.parameters(), lr=config.learning_rate)
        self.runner = rank_setup.runner
        self.runner.timed = False  # the runner reads its clock only on the steps recorded (train_step)
        self.record_step = False  # whether the coming step is the epoch's last (epoch_batches)
        self.counter = CommCounter()
        self.timeline, self.comm_timeline, self.peak_bytes, self.peak_in_flight = [], [], 0, 0
        self.eval_group = evaluation_group(mesh)

    @property
    def checkpoint_key(self) -> str:
        """What differs between ranks in a checkpoint: only the tp shard (see :meth:`checkpoint_state`)."""
        return f"tp{self.mesh.tp_rank}"

    def checkpoint_module(self):
        return self.stage

    def _checkpoint_parameters(self):
        """``(layout-independent name, parameter)`` of this stage: the stage's own names (global block
        index ``h.<i>.``), the last stage's tied copy ``lm_head.weight`` under ``wte.weight``."""
        for name, p in self.stage.named_parameters():
            yield ("wte.weight" if name == "lm_head.weight" else name), p

    def checkpoint_state(self) -> dict:
        """The model and AdamW state of this rank, keyed so that a checkpoint loads at another dp and pp.

        ``{"tp<r>": {"model": {name: weight}, "optim": {name: {"exp_avg", "exp_avg_sq", "step"}}},
        "three_d_layout": tensor([dp, pp, tp])}``, with ``r`` this rank's tp rank and ``name`` the
        layout-independent parameter name (``wte.weight``, ``wpe.weight``, ``h.<global block>.*``,
        ``ln_f.*``). Plain tensors, not DTensors: a tp shard is a whole tensor under its tp rank's
        key, so DCP treats it as replicated — the dp replicas and the first and last stage (the
        tied weight: the last stage's ``lm_head.weight`` is saved as ``wte.weight``, equal to the
        first stage's, and loaded from it) all write the same key, which DCP stores once. A rank
        of another layout loads whichever keys its stage holds: a change of dp and pp is a change
        of who loads what (resharding over pp = regrouping whole layers). The tensors replicated
        over tp (layer norms, position embedding, row-parallel biases) are stored once per tp rank,
        a small duplicate that keeps the rule "one key = one tp rank's tensor". A change of tp is not
        supported (the fused QKV shard and the padded vocabulary depend on tp):
        :func:`checkpoint_layout` lets the script refuse it before any process starts.

        The AdamW state is created (zeros, step 0) where it does not exist yet, so a fresh
        optimizer can be loaded into in place.
        """
        model, optim = {}, {}
        for name, p in self._checkpoint_parameters():
            state = self.optimizer.state[p]
            if not state:  # AdamW creates its state at the first step: make it now to load into
                state.update(step=torch.tensor(0.0, device="cpu"), exp_avg=torch.zeros_like(p), exp_avg_sq=torch.zeros_like(p))
            model[name] = p.detach()
            optim[name] = {k: state[k] for k in ("step", "exp_avg", "exp_avg_sq")}
        d = self.mesh.dims
        return {self.checkpoint_key: {"model": model, "optim": optim},
                LAYOUT_KEY: torch.tensor([d.dp, d.pp, d.tp], dtype=torch.int64, device="cpu")}

    def load_checkpoint_state(self, state: dict) -> None:
        """DCP loaded :meth:`checkpoint_state` in place (weights and AdamW state): nothing left to copy.
        Checks the tp size again (``project/run_3d.py`` refuses another tp before launching; a
        checkpoint of another tp usually already fails in DCP with a shape or key mismatch).

        Raises:
            ValueError: the checkpoint was written with another tp (see :func:`checkpoint_layout`).
        """
        saved = [int(x) for x in state[LAYOUT_KEY]]
        if saved[2] != self.mesh.dims.tp:
            raise ValueError(tp_mismatch_message(dict(zip(("dp", "pp", "tp"), saved)), self.mesh.dims.tp))

    def train_mode(self):
        self.stage.train()

    def epoch_batches(self, epoch: int):
        order = torch.randperm(len(self.data.train), generator=torch.Generator().manual_seed(self.config.seed + epoch),
                               device="cpu")
        loader = DataLoader(Subset(self.data.train, order.tolist()), batch_size=self.config.batch_size,
                            collate_fn=self.data.collate, drop_last=True)  # every dp rank needs its full share
        steps = len(loader) if self.config.max_batches is None else min(len(loader), self.config.max_batches)
        return self._marking_the_last(loader, steps), steps

    def _marking_the_last(self, loader, steps: int):
        """The loader's batches, with :attr:`record_step` set to whether each is the epoch's last step (the one
        the results file times). Counted over every batch drawn, so a resumed epoch's skipped batches count."""
        for n, batch in enumerate(loader):
            self.record_step = n == steps - 1
            yield batch

    def training(self, epoch: int):
        self.counter = CommCounter()
        self.timeline, self.comm_timeline, self.peak_bytes, self.peak_in_flight = [], [], 0, 0
        return self.counter

    def train_step(self, batch: dict) -> StepOutcome:
        share = self.config.batch_size // self.mesh.dims.dp
        rows = slice(self.mesh.dp_rank * share, (self.mesh.dp_rank + 1) * share)
        ids, labels = batch["input_ids"][rows].to(self.device), batch["labels"][rows].to(self.device)
        origin = self.runner.origin
        # a trace asked for, or the step the results report: this step's spans, on a recorder of its own
        step = trace.Recorder(self.device) if trace.active() or self.record_step else None
        with _recording_step(step):
            out = three_d_step(self.stage, self.runner, self.mesh, ids, labels, self.config.micro_batches,
                               self.config.schedule, self.config.max_grad_norm)
            self.optimizer.step()
        result = out["result"]
        self.peak_bytes = max(self.peak_bytes, result.peak_activation_bytes)
        self.peak_in_flight = max(self.peak_in_flight, result.peak_in_flight)
        if step is not None:
            whole, = step.select("step")
            self.step_span = (whole.start - origin, whole.end - origin)
            self.timeline = result.timeline(self.mesh.stage, "cpu_s")
            self.comm_timeline = [dict(stage=self.mesh.stage, kind=c.args["kind"], group=c.args["group"],
                                       bytes=c.args["bytes"], start=c.start - origin, end=c.end - origin)
                                  for c in step.select("communication")]
        self.last_grad_norm = out["grad_norm"]
        return StepOutcome(out["loss"], int(batch["attention_mask"][rows].sum()))

    def batch_losses(self, losses):
        """Every step's loss, from whichever rank computed it: the last stage's ranks, or — for the
        steps before a resume at another layout — the ranks that were the last stage then (each
        rank resumes with the progress of the same rank number). NaN where no rank has it."""
        everyone: list = [None] * self.mesh.world_size
        dist.all_gather_object(everyone, losses, group=self.mesh.group("world"))
        found = []
        for step in range(len(losses)):
            seen = [theirs[step] for theirs in everyone if step < len(theirs) and theirs[step] is not None]
            found.append(seen[0] if seen else float("nan"))
        return found

    def gather_model(self):
        """Every stage's parameters gathered in the pp group into this rank's full tensor-parallel GPT-2
        (:class:`tensor_parallel.TensorParallelGPT2`, the one the stage was cut from; moved to the device);
        collective over pp. Returns it."""
        full = self.stage.full_model
        # the tied copy lm_head.weight is not copied: wte.weight (first stage) is the original
        pieces = pipeline.gather_stages(full, dict(self.stage.named_parameters()), self.mesh.pp_group,
                                        skip=("lm_head.weight",))
        head = pieces[-1].get("lm_head.weight")  # how far the tied copies drifted apart (0: kept equal)
        self.tied_difference = 0.0 if head is None else float((head - pieces[0]["wte.weight"]).abs().max())
        return full.to(self.device)

    def export_state(self) -> dict:
        """The stages gathered over pp (:meth:`gather_model`), then the shards over tp, as ``transformers``'
        GPT-2 (:func:`tensor_parallel.hf_state_dict`)."""
        return tensor_parallel.hf_state_dict(self.gather_model())

    def evaluation(self) -> Evaluation:
        full = self.gather_model()
        return Evaluation(full, self.device, group=self.eval_group,
                          logits_fn=lambda m, b: m.gather_logits(m(b["input_ids"], b.get("attention_mask")).logits))

    def epoch_extra(self, epoch: int, stats: dict) -> dict:
        steps = max(1, stats["steps"])
        by_group = self.counter.by_group()
        per_step = {g: {k: {"count": v["count"] / steps, "bytes": v["bytes"] / steps} for k, v in kinds.items()}
                    for g, kinds in by_group.items()}
        return {"timeline": self.timeline, "timeline_note": "forward and backward of every micro-batch of the "
                "epoch's last batch on this rank (seconds since the pp group's common origin; only that step is timed "
                "unless --trace is on: timing synchronises the device)",
                "comm_timeline": self.comm_timeline, "comm_timeline_note": "every communication call of the same "
                "batch on this rank: kind, group (tp, pp, dp, embedding), bytes, start and end on the timeline's clock "
                "(a send: its posting only; a recv: from the start of its wait)",
                "step_span": list(getattr(self, "step_span", ())),
                "comm_per_step": per_step, "peak_activation_bytes": self.peak_bytes,
                "peak_in_flight": self.peak_in_flight, "coordinates": {"pp": self.mesh.stage, "dp": self.mesh.dp_rank,
                                                                  "tp": self.mesh.tp_rank},
                "last_grad_norm": getattr(self, "last_grad_norm", None), "time_origin": self.runner.origin,
                "tied_weight_max_abs_difference": getattr(self, "tied_difference", None)}

    def record(self) -> dict:
        return {**self.config.record(), "mode": self.mode, "world_size": self.mesh.world_size,
                "blocks": list(self.stage.blocks),
                "mesh": self.mesh.describe()}

    def progress_desc(self, epoch: int) -> str:
        d = self.mesh.dims
        return f"3d dp{d.dp} pp{d.pp} tp{d.tp} {self.config.schedule} epoch {epoch}"


def three_d_training(config, data, mesh) -> ThreeDTraining:
    """This rank's :class:`ThreeDTraining` on the run's ``config.dp x config.pp x config.tp`` ``mesh``: the same GPT-2
    on every rank (same seed), cut into this rank's tensor-parallel stage on the worker's device
    (:func:`three_d.rank_setup.setup_rank`). What ``project/train.py --mode 3d`` trains.

    Raises:
        ValueError: a mesh of other sizes than ``config.dims``.
    """
    device = context().device
    ranked = setup_rank(config.dims, build_model(config, data.tokenizer.vocab_size), device,
                        scatter_gather=config.scatter_gather, mesh=mesh)
    return ThreeDTraining(config, data, device, ranked)
