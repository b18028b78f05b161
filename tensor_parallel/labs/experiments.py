"""Worker functions for notebooks/03_tensor_parallel.ipynb (spawned processes cannot import cells).

* :func:`basics_worker` — column vs row parallel matmul, f and g, the vocabulary-parallel loss.
* :func:`gpt2_report_worker` — a small GPT-2 split over the ranks: differences from the
  transformers model (``tp``, ``tp`` + sequence parallelism), distances of ``spd`` and
  ``parallel`` from ``tp``, and the collectives per layer of each.
* :func:`train_block_types_worker` — short Multi30k runs of the run script's worker
  (:func:`tensor_parallel.training.run_tp`), one per block type, in one launch.
* :func:`step_times_worker` — seconds per training step of each block type, interleaved, and the share of a
  step spent inside the tp group's collectives.

Each returns plain Python values (and small tensors) for the notebook to tabulate; the plots
are in :mod:`course.plots`.
"""
from __future__ import annotations

import copy
from pathlib import Path

import torch
import torch.nn.functional as F


def _counts(counter, scope=None, phase=None) -> dict:
    return {kind: int(v["count"]) for kind, v in counter.summary(scope, phase).items()}


def basics_worker(rank: int, world_size: int) -> dict:
    """Column vs row split of ``Y = X A^T``, the f/g operators, and the vocab-parallel loss, measured."""
    from course.collectives import CommCounter
    from course.mesh import Mesh
    from tensor_parallel.layers import ColumnParallelLinear, RowParallelLinear
    from tensor_parallel.mappings import f, g
    from tensor_parallel.vocab import vocab_parallel_cross_entropy

    mesh = Mesh.build(tp=world_size)
    group = mesh.tp_group
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(4, 8, generator=gen)
    dense = torch.nn.Linear(8, 6)
    with torch.no_grad():
        dense.weight.copy_(torch.randn(6, 8, generator=gen))
        dense.bias.copy_(torch.randn(6, generator=gen))
    out: dict = {"rank": rank, "dense_y": dense(x).detach()}
    with CommCounter() as c:
        col = ColumnParallelLinear(8, 6, master_weight=dense.weight, master_bias=dense.bias, group=group)
        out["column"] = {"weight_shape": tuple(col.weight.shape), "y_local": col(x).detach(), "comm": _counts(c)}
        c.reset()
        row = RowParallelLinear(8, 6, input_is_parallel=False, master_weight=dense.weight, master_bias=dense.bias,
                                group=group)
        out["row"] = {"weight_shape": tuple(row.weight.shape), "y": row(x).detach(), "comm": _counts(c)}
    # f and g on a per-rank input: what each does forward and backward, and what it communicates.
    for name, op in (("f", f), ("g", g)):
        v = torch.full((3,), float(rank + 1), requires_grad=True)
        with CommCounter() as c:
            y = op(v, group)
            forward = _counts(c)
            c.reset()
            y.backward(torch.full((3,), 10.0 * (rank + 1)))
            out[name] = {"input": v.detach().tolist(), "output": y.detach().tolist(), "upstream": [10.0 * (rank + 1)] * 3,
                         "grad": v.grad.tolist(), "forward_comm": forward, "backward_comm": _counts(c)}
    # Vocabulary-parallel cross-entropy on huge logits vs the dense one.
    logits = torch.randn(6, 10, generator=gen) * 1e4
    target = torch.tensor([0, 4, 5, 9, -100, 2])
    chunk = 10 // world_size
    mine = logits[:, mesh.tp_rank * chunk:(mesh.tp_rank + 1) * chunk].clone().requires_grad_(True)
    with CommCounter() as c:
        loss = vocab_parallel_cross_entropy(mine, target, group=group)
        forward = c.summary()
        c.reset()
        loss.sum().backward()
        backward = c.summary()
    ref = F.cross_entropy(logits, target, ignore_index=-100, reduction="none")
    out["vocab_loss"] = {"loss": loss.detach().tolist(), "reference": ref.tolist(),
                         "naive_exp_sum": float(logits.exp().sum()), "forward_comm": forward,
                         "backward_comm": backward, "logits_bytes_if_gathered": logits.numel() * 4}
    return out


def _tp_run(hf, batch, ref, group, block_types=None, sequence_parallel=False):
    from course.collectives import CommCounter, group_rank
    from course.loss import lm_loss
    from tensor_parallel.gpt2 import TensorParallelGPT2

    model = TensorParallelGPT2(hf, block_types=block_types, sequence_parallel=sequence_parallel, group=group)
    with CommCounter() as c:
        out = model(batch["input_ids"], batch["attention_mask"], batch["labels"])
        out.loss.backward()
        model.sync_grads()
    logits = model.gather_logits(out.logits.detach())
    n_layer = len(model.h)
    per_layer = {phase: {kind: {k: v / n_layer for k, v in s.items()} for kind, s in c.summary("blocks", phase).items()}
                 for phase in ("forward", "backward")}
    result = {"logits": logits, "loss": out.loss.item(),
              "logits_diff_vs_transformers": float((logits - ref["logits"]).abs().max()),
              "loss_diff_vs_transformers": abs(out.loss.item() - lm_loss(ref["logits"], batch["labels"]).item()),
              "per_layer": per_layer, "grad_sync": c.summary("grad_sync"),
              "shapes": {n: tuple(p.shape) for n, p in model.named_parameters() if n.startswith("h.0.")}}
    if block_types is None:  # exact: compare each gradient with its shard of the transformers gradient
        from tensor_parallel.gpt2 import reorder_qkv_for_tensor_parallel

        p, r = model.tp, group_rank(group)
        worst = 0.0
        for i, block in enumerate(hf.transformer.h):
            w, b = reorder_qkv_for_tensor_parallel(block.attn.c_attn.weight.grad.t(), block.attn.c_attn.bias.grad, p)
            pairs = [(model.h[i].attn.c_attn.weight.grad, w.chunk(p)[r]),
                     (model.h[i].attn.c_proj.weight.grad, block.attn.c_proj.weight.grad.t().chunk(p, dim=1)[r]),
                     (model.h[i].mlp.c_fc.weight.grad, block.mlp.c_fc.weight.grad.t().chunk(p)[r]),
                     (model.h[i].mlp.c_proj.weight.grad, block.mlp.c_proj.weight.grad.t().chunk(p, dim=1)[r]),
                     (model.h[i].ln_1.weight.grad, block.ln_1.weight.grad)]
            worst = max([worst] + [float((a - e).abs().max()) for a, e in pairs])
        vocab = hf.config.vocab_size
        wte = hf.transformer.wte.weight.grad
        start, end = model.wte.vocab_start, min(model.wte.vocab_end, vocab)
        worst = max(worst, float((model.wte.weight.grad[: end - start] - wte[start:end]).abs().max()))
        result["grad_diff_vs_transformers"] = worst
    return result


def gpt2_report_worker(rank: int, world_size: int, preset: str = "tiny", vocab_size: int = 1000,
                       batch_size: int = 4, seq: int = 64) -> dict:
    """Every block type on the same GPT-2 weights and batch: differences and collectives per layer.

    Returns ``{"config": ..., "runs": {label: result}}`` where label is ``tp``, ``tp+sp``,
    ``spd``, ``spd+sp``, ``parallel``, ``parallel+sp``; results hold max |logits - transformers|,
    the loss, the collectives per layer by phase (count, bytes, ring traffic) and, for the
    exact runs, the largest gradient difference from the transformers model.
    """
    from course.loss import lm_loss
    from course.mesh import Mesh
    from course.model import build_gpt2

    group = Mesh.build(tp=world_size).tp_group
    hf = build_gpt2(preset, vocab_size, n_positions=seq, dropout=0.0, seed=0)
    gen = torch.Generator().manual_seed(1)
    ids = torch.randint(0, vocab_size, (batch_size, seq), generator=gen)
    mask = torch.ones_like(ids)
    mask[1:, seq - seq // 4:] = 0
    labels = ids.masked_fill(mask == 0, -100)
    labels[:, : seq // 3] = -100
    batch = {"input_ids": ids, "attention_mask": mask, "labels": labels}
    logits = hf(input_ids=ids, attention_mask=mask).logits
    lm_loss(logits, labels).backward()
    ref = {"logits": logits.detach()}
    runs = {}
    for label, kwargs in (("tp", {}), ("tp+sp", {"sequence_parallel": True}),
                          ("spd", {"block_types": "spd"}), ("spd+sp", {"block_types": "spd", "sequence_parallel": True}),
                          ("parallel", {"block_types": "parallel"}),
                          ("parallel+sp", {"block_types": "parallel", "sequence_parallel": True})):
        runs[label] = _tp_run(hf, batch, ref, group, **kwargs)
    tp_logits = runs["tp"]["logits"]
    for r in runs.values():
        r["logits_diff_vs_tp"] = float((r.pop("logits") - tp_logits).abs().max())
        r["loss_diff_vs_tp"] = abs(r["loss"] - runs["tp"]["loss"])
    config = {"preset": preset, "n_layer": hf.config.n_layer, "n_embd": hf.config.n_embd, "n_head": hf.config.n_head,
              "vocab_size": vocab_size, "batch_size": batch_size, "seq": seq, "tp": world_size}
    return {"config": config, "runs": runs}


def train_block_types_worker(rank: int, world_size: int, config, block_types_list: list[str]) -> dict:
    """The run script's training (:func:`tensor_parallel.training.train_tp`) once per block type.

    Data and tokenizer are prepared once; each run writes its results files into
    ``<workdir>/<block type>/``. An entry ``"<block types>@<seed>"`` (e.g. ``"tp@12"``) runs those block types with
    another ``--seed`` (other initial weights, data order and dropout): the run-to-run spread the differences
    between block types are read against. Returns ``{entry: train_tp's return value}``.
    """
    from course.mesh import Mesh
    from course.task import prepare_data, worker_env_quiet
    from tensor_parallel.block_types import parse_block_types
    from tensor_parallel.training import train_tp

    worker_env_quiet()
    mesh = Mesh.build(tp=world_size)
    data = prepare_data(config)  # once: the tokenizer and the encoded splits serve every run
    out = {}
    for entry in block_types_list:
        kind, _, seed = entry.partition("@")
        run_config = copy.copy(config)
        run_config.block_types = parse_block_types(kind, n_layer=_n_layer(config.preset))
        if seed:
            run_config.seed = int(seed)
        run_config.workdir = str(Path(config.workdir) / entry.replace(",", "_"))
        out[entry] = train_tp(rank, world_size, run_config, data, mesh)
    return out


def step_times_worker(rank: int, world_size: int, kinds: list[str], repeats: int, warmup: int = 1,
                      preset: str = "tiny", vocab_size: int = 1000, batch_size: int = 8, seq: int = 64) -> dict:
    """Seconds per training step (forward, backward, gradient sync, SGD step) of the tensor-parallel GPT-2 with
    each block type of ``kinds`` (``tp``, ``spd``, ``parallel``) on the same weights and batch, interleaved
    (:func:`course.benchmarking.interleaved`: ``warmup`` untimed steps each, then ``repeats`` rounds, the slowest
    rank's time), and, from one more recorded step each (:mod:`course.trace`), the share of a step this rank spent
    inside the tp group's collectives (waits for the other rank included).

    Returns:
        ``{"seconds": {kind: [per repeat]}, "comm_share": {kind: fraction}, "collectives": {kind: calls per step}}``
        (the same on every rank: rank 0's recorded shares).
    """
    import torch.distributed as dist

    from course import trace
    from course.benchmarking import interleaved
    from course.collectives import CommCounter, name_group
    from course.measure import Stopwatch
    from course.mesh import Mesh
    from course.model import build_gpt2
    from course.task import worker_env_quiet
    from tensor_parallel.gpt2 import TensorParallelGPT2

    worker_env_quiet()
    group = Mesh.build(tp=world_size).tp_group
    name_group(group, "tp")
    hf = build_gpt2(preset, vocab_size, n_positions=seq, dropout=0.0, seed=0)
    ids = torch.randint(0, vocab_size, (batch_size, seq), generator=torch.Generator().manual_seed(1), device="cpu")
    batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids.clone()}
    states = {}
    for kind in kinds:
        model = TensorParallelGPT2(hf, block_types=None if kind == "tp" else kind, group=group)
        states[kind] = (model, torch.optim.SGD(model.parameters(), lr=1e-3))

    def step(kind):
        model, opt = states[kind]
        opt.zero_grad(set_to_none=True)
        model(batch["input_ids"], batch["attention_mask"], batch["labels"]).loss.backward()
        model.sync_grads()
        opt.step()

    seconds = interleaved({kind: (lambda kind=kind: step(kind)) for kind in kinds}, repeats, warmup,
                          group=dist.group.WORLD)
    share, calls = {}, {}
    for kind in kinds:
        recorder = trace.Recorder("cpu")
        dist.barrier(group=dist.group.WORLD)
        with CommCounter() as counter, trace.recording(recorder), Stopwatch("cpu") as clock:
            step(kind)
        share[kind] = trace.communication_seconds_by_group(recorder.spans).get("tp", 0.0) / clock.seconds
        calls[kind] = sum(int(v["count"]) for v in counter.summary().values())
    shared = [None] * world_size
    dist.all_gather_object(shared, (share, calls), group=dist.group.WORLD)
    return {"seconds": seconds, "comm_share": shared[0][0], "collectives": shared[0][1]}


def _n_layer(preset: str) -> int:
    from course.model import PRESETS

    return PRESETS[preset]["n_layer"]


def comm_table(report: dict):
    """One row per run of :func:`gpt2_report_worker`: differences and collectives per layer (pandas)."""
    import pandas as pd

    exact = {"tp": "exact", "tp+sp": "exact", "spd": "approximation", "spd+sp": "approximation",
             "parallel": "different architecture", "parallel+sp": "different architecture"}
    rows = []
    for label, r in report["runs"].items():
        row = {"run": label, "kind": exact[label],
               "max |logits - transformers|": r["logits_diff_vs_transformers"],
               "max |grad - transformers|": r.get("grad_diff_vs_transformers", float("nan")),
               "|loss - tp loss|": r["loss_diff_vs_tp"]}
        for phase in ("forward", "backward"):
            per = r["per_layer"][phase]
            row[f"{phase} collectives / layer"] = ", ".join(f"{v['count']:g} {k}" for k, v in per.items())
            row[f"{phase} tensor MB / layer"] = sum(v["bytes"] for v in per.values()) / 1e6
            row[f"{phase} ring traffic MB / layer"] = sum(v["traffic_bytes"] for v in per.values()) / 1e6
        rows.append(row)
    return pd.DataFrame(rows).set_index("run")


def activation_memory_worker(rank: int, world_size: int, configs: list[tuple[int, bool]], batch_size: int = 4,
                             seq: int = 128, n_embd: int = 128, n_head: int = 4, n_layer: int = 2) -> list[dict]:
    """:func:`activation_memory` for every ``(t, sequence_parallel)`` of ``configs`` in one launch:
    for each, ranks ``0 .. t - 1`` measure over a group of ``t`` ranks while the others wait at a
    barrier (``world_size`` must be at least the largest ``t``). Returns rank 0's results in the
    order of ``configs`` (``[]`` on the other ranks).

    Raises:
        ValueError: a ``t`` larger than ``world_size``.
    """
    import torch.distributed as dist

    from course.mesh import Mesh

    if max(t for t, _ in configs) > world_size:
        raise ValueError(f"configs need {max(t for t, _ in configs)} ranks, the launch has {world_size}")
    world = Mesh.build(dp=world_size).dp_group
    groups = {t: dist.new_group(list(range(t))) for t in sorted({t for t, _ in configs})}  # collective: every rank
    found = []
    for t, sequence_parallel in configs:
        dist.barrier(group=world)
        if rank < t:
            result = activation_memory(groups[t], sequence_parallel, batch_size, seq, n_embd, n_head, n_layer)
            if rank == 0:
                found.append(result)
    dist.barrier(group=world)
    return found


def activation_memory(group, sequence_parallel: bool, batch_size: int = 4, seq: int = 128, n_embd: int = 128,
                      n_head: int = 4, n_layer: int = 2) -> dict:
    """Bytes of activations one transformer block keeps for the backward pass, on this rank of ``group``
    (the tensor-parallel group, of size t; collective over it).

    Runs the forward pass of a tensor-parallel GPT-2 (dropout 0.1, so its masks are kept too)
    under :class:`course.saved_tensors.SavedTensorBytes` and adds up, per block, the storages of
    the tensors autograd saves while inside the block — each storage once per block (a view saved
    twice counts once), parameters excluded. Returns ``{"bytes_per_block": float (mean over blocks),
    "by_dtype": {dtype: bytes per block}, "block0_tensors": [{"shape", "dtype", "bytes"}] (each
    storage of the first block, with the shape of the tensor it was saved as), "s": seq, "b": batch_size, "h": n_embd, "a": n_head,
    "t": t, "sequence_parallel": bool}``.

    Compare with Korthikanti et al. 2022 (Reducing Activation Recomputation in Large
    Transformer Models), Sec. 4.2, Table 2: per layer ``s·b·h·(10 + 24/t + 5·a·s/(h·t))`` bytes
    with tensor parallelism and ``s·b·h/t·(34 + 5·a·s/h)`` with sequence parallelism too, for
    16-bit activations and 1-byte dropout masks.
    """
    from course.collectives import group_size
    from course.model import build_gpt2
    from course.saved_tensors import SavedTensorBytes
    from tensor_parallel.gpt2 import TensorParallelGPT2

    hf = build_gpt2("tiny", 256, n_positions=seq, dropout=0.1, seed=0, n_embd=n_embd, n_head=n_head, n_layer=n_layer)
    model = TensorParallelGPT2(hf, sequence_parallel=sequence_parallel, group=group)
    current: list[int | None] = [None]  # the block running (forward hooks), None between blocks
    for i, block in enumerate(model.h):
        block.register_forward_pre_hook(lambda m, a, i=i: current.__setitem__(0, i))
        block.register_forward_hook(lambda m, a, o: current.__setitem__(0, None))
    gen = torch.Generator().manual_seed(1)
    ids = torch.randint(0, 256, (batch_size, seq), generator=gen)
    with SavedTensorBytes(exclude=list(model.parameters()), key=lambda: current[0]) as saved:
        out = model(ids, torch.ones_like(ids), ids)
    out.loss.backward()
    blocks = range(len(model.h))
    by_dtype: dict[str, float] = {}
    for (key, _), s in saved.storages.items():
        if key is not None and not s.excluded:
            by_dtype[s.dtype] = by_dtype.get(s.dtype, 0.0) + s.nbytes / len(blocks)
    first = [{"shape": s.shape, "dtype": s.dtype, "bytes": s.nbytes} for (key, _), s in saved.storages.items()
             if key == 0 and not s.excluded]
    return {"bytes_per_block": sum(by_dtype.values()), "by_dtype": by_dtype, "block0_tensors": first,
            "s": seq, "b": batch_size,
            "h": n_embd, "a": n_head, "t": group_size(group), "sequence_parallel": sequence_parallel}
