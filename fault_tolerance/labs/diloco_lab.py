"""What DiLoCo buys, measured (notebook 11): bytes across the replica groups per token, validation loss after the
same tokens, and the α–β model's seconds per step on a slow link — for data parallelism (DDP: every gradient
all-reduced every step) and for DiLoCo at several H.

:func:`diloco_worker` is one replica group (one rank of :func:`course.launch.launch`): for each seed and each
variant it trains the course's GPT-2 on its shard of Multi30k for the same number of steps (so the same tokens),
counts every byte it all-reduces across the groups (:class:`course.collectives.CommCounter`), and scores the
validation loss of the final weights. :func:`measure` launches it and pairs the seeds; :func:`comparison` gives
the table and the verdicts (:func:`course.benchmarking.compare` on the paired per-seed losses).
"""
from __future__ import annotations

import time

import torch
from torch.utils.data import DataLoader, DistributedSampler

from course.collectives import CommCounter, all_reduce
from course.epoch_runner import Evaluation, StepOutcome, TrainingMode, to_device
from course.loss import model_loss
from fault_tolerance.diloco import DiLoCo

DDP = "DDP"
SLOW_LINK_BITS_PER_SECOND = 1e9  # the slow link between groups: 1 Gb/s
# Latency of one message step between sites: 1 ms, a metro-area round trip (light in fibre covers ~200 km/ms;
# the DiLoCo paper's setting is groups in different places, Douillard et al. 2023, Sec. 1).
SLOW_LINK_ALPHA_S = 1e-3


def variant_name(h: int | None) -> str:
    return DDP if h is None else f"DiLoCo H={h}"


def _batches(data, config, rank: int, world: int, seed: int):
    sampler = DistributedSampler(data.train, num_replicas=world, rank=rank, shuffle=True, seed=seed, drop_last=True)
    loader = DataLoader(data.train, batch_size=config.batch_size // world, sampler=sampler,
                        collate_fn=data.collate, drop_last=True)
    epoch = 0
    while True:
        sampler.set_epoch(epoch)
        yield from loader
        epoch += 1


class LocalStepsTraining(TrainingMode):
    """One replica group's run of a variant, as the epoch runner trains it: ``steps`` steps on the group's shard,
    DDP (``h`` None: the mean gradient every step) or DiLoCo with H = ``h``; every all-reduce across the groups
    counted (:class:`course.collectives.CommCounter`); the validation loss of the final weights."""

    mode = "diloco_lab"

    def __init__(self, config, data, device, h: int | None, steps: int, rank: int, world: int):
        import torch.distributed as dist

        # the groups share the world (DiLoCo's and DDP's averaging): rank 0 publishes every group's results files
        super().__init__(config, data, device, rank=rank, world_group=dist.group.WORLD, show_progress=False)
        from course.task import build_model

        self.results_prefix = f"diloco_lab_{'ddp' if h is None else f'h{h}'}_seed{config.seed}_"
        self.h, self.steps, self.world = h, steps, world
        self.model = build_model(config, data.tokenizer.vocab_size).to(device)
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=config.learning_rate)
        self.diloco = None if h is None else DiLoCo(self.model, self.optimizer, sync_every=h, group=None)
        self.counter = CommCounter()
        self.seconds: list[float] = []

    def epoch_batches(self, epoch: int):
        return _batches(self.data, self.config, self.rank, self.world, self.config.seed), self.steps

    def training(self, epoch: int):
        return self.counter

    def train_step(self, batch: dict) -> StepOutcome:
        began = time.perf_counter()
        batch = to_device(batch, self.device)
        self.optimizer.zero_grad(set_to_none=True)
        loss = model_loss(self.model, batch)
        loss.backward()
        if self.diloco is None:  # data parallelism: the mean gradient, every step
            for p in self.model.parameters():
                p.grad = all_reduce(p.grad, group=None) / self.world
            self.optimizer.step()
        else:
            self.diloco.step()
        self.seconds.append(time.perf_counter() - began)
        return StepOutcome(loss.item(), int(batch["attention_mask"].sum()))

    def evaluation(self) -> Evaluation:
        return Evaluation(self.model, self.device)

    def epoch_extra(self, epoch: int, stats: dict) -> dict:
        traffic = self.counter.summary().get("all_reduce", {"traffic_bytes": 0.0, "bytes": 0})
        return {"variant": variant_name(self.h), "h": self.h, "seed": self.config.seed,
                "traffic_bytes": traffic["traffic_bytes"], "all_reduced_bytes": traffic["bytes"],
                "step_seconds": sorted(self.seconds)[len(self.seconds) // 2],
                "parameter_bytes": sum(p.numel() * p.element_size() for p in self.model.parameters())}


def diloco_worker(rank: int, world_size: int, config, hs: list, seeds: list[int], steps: int) -> list[dict]:
    """Every (seed, variant) run of this replica group (the epoch runner's results of each), seeds outermost
    (each seed's variants side by side)."""
    import dataclasses
    import json

    from course.epoch_runner import run_epochs
    from course.launch import context
    from course.task import prepare_data, worker_env_quiet

    worker_env_quiet()
    data = prepare_data(config)
    rows = []
    for seed in seeds:
        for h in hs:
            torch.manual_seed(seed)
            run = LocalStepsTraining(dataclasses.replace(config, seed=seed), data, context().device, h, steps, rank,
                                     world_size)
            (written,) = run_epochs(run)
            result = json.loads(open(written).read())
            rows.append({**{k: result[k] for k in ("variant", "h", "seed", "traffic_bytes", "all_reduced_bytes",
                                                   "step_seconds", "parameter_bytes", "validation_loss", "tokens",
                                                   "steps")}})
    return rows


def measure(config, hs: list, seeds: list[int], steps: int, groups: int = 2, timeout: float = 3600.0) -> list[dict]:
    """Launch :func:`diloco_worker` on ``groups`` ranks (one per replica group); rank 0's rows (every group ends
    with the same weights and counts the same bytes). ``timeout``: the launcher's limit of the whole measurement
    (seconds; the full sizes take minutes on a quiet laptop, many more on a loaded one).

    Raises:
        ValueError: ``steps`` is not a multiple of every H (the last round would not be synchronised), or the
            batch does not split over the groups.
    """
    import dataclasses

    from course.launch import launch
    from course.task import prepare_data

    for h in hs:
        if h is not None and steps % h:
            raise ValueError(f"steps {steps} is not a multiple of H = {h}: the run would end between two outer steps")
    if config.batch_size % groups:
        raise ValueError(f"batch_size {config.batch_size} does not split over {groups} groups")
    config = dataclasses.replace(config, n_epochs=1, n_bleu=0, checkpoint_every=None, resume=None, trace=None,
                                 profile=False, export_hf=None, quiet=True)
    prepare_data(config)  # the tokenizer, once, before the ranks
    return launch(diloco_worker, groups, config, list(hs), list(seeds), steps, device="cpu", timeout=timeout)[0]


def ring_bytes_per_token(parameter_bytes: float, groups: int, tokens_per_step: float, h: int | None) -> float:
    """Bytes one group sends across the groups per token it trains on: a ring all-reduce of the weights' bytes N
    sends 2 (p − 1) / p · N (Thakur et al. 2005, Sec. 4), once per step (DDP) or once per H steps (DiLoCo)."""
    per_sync = 2 * (groups - 1) / groups * parameter_bytes
    return per_sync / tokens_per_step / (1 if h is None else h)


def slow_link_seconds_per_step(parameter_bytes: float, groups: int, h: int | None,
                               bits_per_second: float = SLOW_LINK_BITS_PER_SECOND,
                               alpha: float = SLOW_LINK_ALPHA_S) -> float:
    """The α–β model's communication seconds per training step between ``groups`` groups on a link of
    ``bits_per_second`` (:func:`communication.collective_seconds`, ring all-reduce), amortised over H."""
    from communication import collective_seconds

    seconds = collective_seconds("all_reduce", parameter_bytes, groups, alpha, 8 / bits_per_second)
    return seconds / (1 if h is None else h)


def comparison(rows: list[dict], groups: int, model_parameter_bytes: dict[str, float] | None = None) -> dict:
    """The table of :func:`measure`'s rows per variant, and each DiLoCo variant's verdict against DDP on the paired
    per-seed validation losses (:func:`course.benchmarking.compare`, lower is better).

    ``model_parameter_bytes``: ``{name: bytes}`` of other models whose slow-link seconds per step to add
    (e.g. the 124M GPT-2). Returns ``{"table": [...], "verdicts": {variant: compare(...)}, "sentences": [...]}``.
    """
    from course.benchmarking import compare

    names = list(dict.fromkeys(r["variant"] for r in rows))
    table, verdicts = [], {}
    ddp = [r["validation_loss"] for r in rows if r["variant"] == DDP]
    for name in names:
        mine = [r for r in rows if r["variant"] == name]
        h = mine[0]["h"]
        tokens = mine[0]["tokens"]  # one group's tokens (the same data order for every variant of a seed)
        counted = mine[0]["traffic_bytes"] / tokens
        row = {"variant": name, "H": h, "counted_bytes_per_token": counted,
               "formula_bytes_per_token": ring_bytes_per_token(mine[0]["parameter_bytes"], groups,
                                                               tokens / mine[0]["steps"], h),
               "validation_loss_median": sorted(r["validation_loss"] for r in mine)[len(mine) // 2],
               "validation_losses": [r["validation_loss"] for r in mine],
               "slow_link_s_per_step": slow_link_seconds_per_step(mine[0]["parameter_bytes"], groups, h),
               "compute_s_per_step": sorted(r["step_seconds"] for r in mine)[len(mine) // 2]}
        for model, nbytes in (model_parameter_bytes or {}).items():
            row[f"slow_link_s_per_step_{model}"] = slow_link_seconds_per_step(nbytes, groups, h)
        table.append(row)
        if name != DDP and len(mine) == len(ddp) and len(ddp) >= 3:
            verdicts[name] = compare([r["validation_loss"] for r in mine], ddp, (name, DDP),
                                     lower_is_better=True, unit="nats of validation loss", words=("lower", "higher"),
                                     conditions="the same tokens per seed (a loss, not a timing)")
    sentences = []
    for row in table:
        if row["variant"] == DDP:
            continue
        ddp_row = table[names.index(DDP)]
        cut = ddp_row["counted_bytes_per_token"] / row["counted_bytes_per_token"]
        sentences.append(f"{row['variant']} sends {cut:.0f}x fewer bytes per token than DDP (counted); "
                         + loss_sentence(row["variant"], verdicts.get(row["variant"])))
    return {"table": table, "verdicts": verdicts, "sentences": sentences}


def loss_sentence(name: str, verdict: dict | None) -> str:
    """The validation-loss verdict of ``name`` against DDP, :func:`course.benchmarking.compare`'s sentence on the
    paired per-seed losses (lower is better; with too few seeds it says so)."""
    if verdict is None:
        return "too few paired seeds for a verdict on the loss"
    return f"its validation loss, paired by seed: {verdict['sentence']}"


def gpt2_parameter_bytes(preset: str = "gpt2", vocab_size: int = 50257) -> float:
    """fp32 bytes of a preset's weights (:func:`course.model.estimate_parameters`)."""
    from course.model import estimate_parameters

    return 4.0 * estimate_parameters(preset, vocab_size, 1024)
