"""Workers and measurements for notebooks/08_mixture_of_experts.ipynb (spawned processes cannot import cells).

* :func:`parameter_table` — parameters held and parameters used per token, dense vs MoE GPT-2.
* :func:`routing_by_hand` — the router, the capacity and the combine on a handful of tokens.
* :func:`all_to_all_worker` — one MoE layer over an ep group: who sends how many rows to whom,
  and the bytes the communication counter recorded.
* :func:`training_worker` — short Multi30k runs of the run script's training
  (:func:`moe.training.train_moe`) in one launch: with and without the load-balancing loss, and
  the dense GPT-2 with the same active parameters per token; the trained routers' choices on
  validation batches; and a step-time benchmark of the MoE and the dense model (warm-up, repeats).
* :func:`balancing_runs`, :func:`balance_over_training` — DeepSeek-router runs with the sequence-wise
  balance loss, with auxiliary-loss-free bias balancing, with neither (run by :func:`training_worker`),
  and each step's load imbalance (MaxVio) and loss from their results files.
* :func:`node_limited_traffic_worker` — the all-to-all bytes of a DeepSeek layer with node-limited
  routing against without, and the rows a dispatch that sends a token once per node would send.
* :func:`dropped_fraction` — the fraction of choices a capacity factor drops, from recorded choices.
* :func:`all_to_all_bytes_formula` — the bytes the all-to-alls of a training step should move.

Each returns plain Python values (and small tensors) for the notebook to tabulate; the plots are in
:mod:`course.plots.moe`.
"""
from __future__ import annotations

import copy
from pathlib import Path

import torch


def parameter_table(preset: str = "tiny", vocab_size: int = 5000, configs=((4, 1), (4, 2), (8, 1), (8, 2)),
                    n_positions: int = 128) -> list[dict]:
    """Parameters of the dense GPT-2 of ``preset`` and of its MoE versions ``(E, k)`` (every other MLP
    an MoE layer): held in total, and used by one token (its forward pass touches those).

    Returns:
        One row per model: ``model``, ``total`` (parameters), ``active_per_token``, ``ratio`` (total /
        active) and ``mlp_flops_per_token`` (2 x the multiply-adds of the MLPs a token runs through).
    """
    from course.model import build_gpt2
    from moe.config import MoEConfig
    from moe.gpt2 import DenseGPT2, MoEGPT2, parameter_counts

    rows = []
    dense = DenseGPT2(build_gpt2(preset, vocab_size, n_positions=n_positions))
    c = dense.model.config
    inner = c.n_inner or 4 * c.n_embd
    mlp = 2 * c.n_embd * inner  # multiply-adds of one MLP per token
    counts = parameter_counts(dense)
    rows.append({"model": "dense GPT-2", "total": counts["total"], "active_per_token": counts["active_per_token"],
                 "mlp_flops_per_token": 2 * c.n_layer * mlp})
    for experts, k in configs:
        model = MoEGPT2(build_gpt2(preset, vocab_size, n_positions=n_positions), MoEConfig(experts, k), group=None)
        counts = parameter_counts(model)
        moe_blocks = len(model.blocks)
        flops = 2 * ((c.n_layer - moe_blocks) * mlp + moe_blocks * (k * mlp + c.n_embd * experts))
        rows.append({"model": f"MoE E={experts} top-{k}", "total": counts["total"],
                     "active_per_token": counts["active_per_token"], "mlp_flops_per_token": flops})
    for row in rows:
        row["ratio"] = row["total"] / row["active_per_token"]
    return rows


def routing_by_hand(num_tokens: int = 6, num_experts: int = 4, top_k: int = 2, capacity_factor: float = 1.0,
                    seed: int = 3) -> dict:
    """The steps of one MoE layer on a few tokens (hidden width 4, one process).

    Returns:
        ``logits`` and ``probs`` (T, E), ``experts`` and ``gates`` (T, k), ``capacity``, ``kept`` (T, k),
        ``tokens_per_expert`` (choices naming each expert), ``aux_loss``, ``z_loss``, and ``out`` (T, h)
        next to ``by_hand`` (T, h): the sum over kept choices of gate x expert output, computed token by token.
    """
    from moe.capacity import capacity_mask, expert_capacity
    from moe.config import MoEConfig
    from moe.experts import MLPExperts
    from moe.layer import MoELayer
    from moe.losses import load_balancing_loss, router_z_loss

    gen = torch.Generator().manual_seed(seed)
    config = MoEConfig(num_experts, top_k, capacity_factor)
    layer = MoELayer(4, config, MLPExperts(num_experts, 4, 8, generator=gen), group=None, generator=gen)
    with torch.no_grad():
        layer.router.weight.mul_(60.0)  # decisive logits, so the picture is clear
    x = torch.randn(num_tokens, 4, generator=gen, device="cpu")  # a notebook demonstration in one process
    with torch.no_grad():
        routing = layer.router(x)
        capacity = expert_capacity(num_tokens, num_experts, top_k, capacity_factor)
        kept = capacity_mask(routing.experts, num_experts, capacity)
        out = layer(x).output
        by_hand = torch.zeros_like(x)
        for t in range(num_tokens):
            for c in range(top_k):
                if kept[t, c]:
                    e = int(routing.experts[t, c])
                    by_hand[t] += routing.gates[t, c] * layer.experts.expert(e, x[t:t + 1])[0]
        return {"logits": routing.logits, "probs": routing.probs, "experts": routing.experts, "gates": routing.gates,
                "capacity": capacity, "kept": kept,
                "tokens_per_expert": torch.bincount(routing.experts.reshape(-1), minlength=num_experts),
                "aux_loss": float(load_balancing_loss(routing.probs, routing.experts, num_experts)),
                "z_loss": float(router_z_loss(routing.logits)), "out": out, "by_hand": by_hand}


def all_to_all_worker(rank: int, world_size: int, num_experts: int = 8, top_k: int = 2, hidden: int = 64,
                      tokens_per_rank: int = 96) -> dict:
    """One MoE layer with its experts over ``world_size`` ranks (one ep group): this rank's rows per
    destination, rows received, and what the communication counter recorded in each pass.

    Returns:
        ``{"sent_to": [rows per destination rank, the layer's count], "router_rows_to": [the same from the
        router's own top-k choices, read by a forward hook: apart from the dispatch code], "received": rows,
        "records": [(kind, phase, bytes, traffic_bytes, shape)], "hidden": h, "num_experts": E}``.
    """
    from course.collectives import CommCounter
    from course.launch import context
    from course.mesh import Mesh
    from moe.config import MoEConfig
    from moe.experts import MLPExperts
    from moe.layer import MoELayer

    device = context().device
    mesh = Mesh.build(dp=world_size, ep=world_size)
    gen = torch.Generator().manual_seed(0)
    full = MLPExperts(num_experts, hidden, 2 * hidden, generator=gen)
    layer = MoELayer(hidden, MoEConfig(num_experts, top_k), full.shard(mesh.ep_rank, world_size), mesh.ep_group, gen)
    layer.to(device)
    with torch.no_grad():
        layer.router.weight.mul_(20.0)
    x = torch.randn(tokens_per_rank, hidden, generator=torch.Generator().manual_seed(100 + rank)).to(device)
    x.requires_grad_(True)
    records, chosen = [], []
    # the router's own top-k choices, read before (and apart from) the layer's dispatch code
    hook = layer.router.register_forward_hook(lambda m, a, out: chosen.append(out.experts.detach().cpu()))
    with CommCounter() as counter:
        out = layer(x).output
        records += [(r.kind, "forward", r.bytes, r.traffic_bytes, r.shape) for r in counter.records]
        counter.reset()
        out.square().mean().backward()
        records += [(r.kind, "backward", r.bytes, r.traffic_bytes, r.shape) for r in counter.records]
    hook.remove()
    router_rows_to = torch.bincount(chosen[0].reshape(-1), minlength=num_experts).view(world_size, -1).sum(dim=1).tolist()
    sent_to = layer.stats["per_expert"].view(world_size, -1).sum(dim=1).tolist()  # dropless: every choice is sent
    rows = [r for r in records if r[1] == "forward" and len(r[4]) == 2]  # dispatch (rows sent), combine (rows received)
    return {"sent_to": sent_to, "router_rows_to": router_rows_to, "received": rows[1][4][0] if len(rows) > 1 else None,
            "records": records, "hidden": hidden, "num_experts": num_experts}


def _router_choices(model, batches, device) -> dict[int, list[torch.Tensor]]:
    """The experts each MoE layer's router chose (T, k) for each batch (a forward pass per batch)."""
    seen: dict[int, list[torch.Tensor]] = {i: [] for i in model.blocks}
    hooks = [layer.router.register_forward_hook(lambda m, a, out, i=i: seen[i].append(out.experts.cpu()))
             for i, layer in zip(model.blocks, model.moe_layers)]
    model.eval()
    with torch.no_grad():
        for batch in batches:
            model(batch["input_ids"].to(device), batch["attention_mask"].to(device))
    for hook in hooks:
        hook.remove()
    return seen


def _benchmark(modes: dict, batches: list, warmup: int, repeats: int, steps: int, group,
               device: torch.device) -> dict[str, list[float]]:
    """Seconds per training step of each mode: ``warmup`` steps each, then ``repeats`` rounds in which every
    mode takes ``steps`` steps in turn (interleaved, so both see the same machine); the slowest rank's time,
    the clock read after the device's queued work (:func:`course.benchmarking.interleaved`)."""
    from course.benchmarking import interleaved

    for mode in modes.values():
        for batch in batches[:warmup]:
            mode.train_step(batch)
    timed = batches[warmup:warmup + steps]
    variants = {name: (lambda mode=mode: [mode.train_step(batch) for batch in timed]) for name, mode in modes.items()}
    return {name: [t / steps for t in times]
            for name, times in interleaved(variants, repeats, warmup=0, device=device, group=group).items()}


def training_worker(rank: int, world_size: int, runs: dict, bench: dict | None = None,
                    n_choice_batches: int = 4) -> dict:
    """Short training runs, one after another in one launch (the data is prepared once).

    Args:
        runs: ``{label: config}`` (options of ``project/run_moe.py``, each with its own ``workdir``).
        bench: ``{"runs": [labels], "warmup", "repeats", "steps"}``: after training, time those runs'
            training steps (fresh models, the same batches; see :func:`_benchmark`).
        n_choice_batches: validation batches (of the per-rank batch size) on which each trained MoE
            model's routers are recorded.

    Returns (rank 0; the other ranks return ``{}``): ``{"choices": {label: {block: [(T, k) per batch]}},
    "step_seconds": {label: [seconds per step of each repeat]}, "threads": torch threads per rank}``.
    """
    from course.collectives import group_rank, group_size
    from course.launch import context
    from course.mesh import Mesh
    from course.task import prepare_data, worker_env_quiet
    from moe.training import MoETraining, build_moe_model, shard_batches, train_moe

    worker_env_quiet()
    device = context().device
    first = next(iter(runs.values()))
    data = prepare_data(first)
    mesh = Mesh.build(dp=world_size, ep=first.ep)
    choices = {}
    for label, config in runs.items():
        Path(config.workdir).mkdir(parents=True, exist_ok=True)
        result = train_moe(rank, world_size, config, data, mesh=mesh, keep_model=True)
        if not config.dense:
            full = result["model"].gathered()
            per_rank = config.batch_size // config.dp
            batches = [data.collate(data.validation[i * per_rank:(i + 1) * per_rank]) for i in range(n_choice_batches)]
            choices[label] = _router_choices(full, batches, device)
    timings = {}
    if bench:
        group = mesh.dp_cp_group
        modes = {}
        for label in bench["runs"]:
            config = runs[label]
            model = build_moe_model(config, data.tokenizer.vocab_size, mesh.ep_group).to(device)
            modes[label] = MoETraining(config, data, device, model, mesh, rank=rank, show_progress=False)
        count = bench["warmup"] + bench["steps"]
        batches = list(shard_batches(data.train, first.batch_size, group_rank(group), group_size(group), data.collate,
                                     seed=first.seed + 99, max_batches=count)[0])
        timings = _benchmark(modes, batches, bench["warmup"], bench["repeats"], bench["steps"], group, device)
    if rank != 0:
        return {}
    return {"choices": choices, "step_seconds": timings, "threads": torch.get_num_threads()}


def balancing_runs(parse_args, workdir, gamma: float = 0.01, aux_loss_coef: float = 0.01, **common) -> dict:
    """The three runs of the balancing comparison, all with ``--router deepseek``: ``"aux loss"`` (the
    sequence-wise balance loss, weight ``aux_loss_coef``, no bias update), ``"bias"`` (auxiliary-loss-free:
    the bias moves by ``gamma`` after each step, no loss) and ``"neither"``; ``common`` are further options of
    ``project/run_moe.py`` (sizes, steps, seed), the same for the three. Each run gets its own work directory
    under ``workdir``. Returns ``{label: config}`` for :func:`training_worker`.

    DeepSeek-V3 (Sec. 2.1.2 and 4.5.2) uses gamma = 0.001 over many thousand steps; a short run needs a
    larger one to move the bias by as much as the sigmoid scores differ.
    """
    settings = {"aux loss": dict(aux_loss_coef=aux_loss_coef, router_bias_update=0.0),
                "bias": dict(aux_loss_coef=0.0, router_bias_update=gamma),
                "neither": dict(aux_loss_coef=0.0, router_bias_update=0.0)}
    return {label: run_config(parse_args, Path(workdir) / label.replace(" ", "_"), router="deepseek", z_loss_coef=0.0,
                            **common, **extra)
            for label, extra in settings.items()}


def balance_over_training(runs: dict, epoch: int = 0) -> dict:
    """Each run's per-step next-token loss and load imbalance, from rank 0's results file of ``epoch``.

    The imbalance of a step is MaxVio (Wang et al. 2024, "Auxiliary-Loss-Free Load Balancing Strategy
    for Mixture-of-Experts", eq. 5): ``max_i load_i / mean_i load_i - 1`` over the tokens every rank
    routed in that step, the worst of the model's MoE layers (0: perfectly balanced; E/k - 1: every
    token to the same k experts).

    Returns:
        ``{label: {"loss": [per step], "max_violation": [per step], "final_load": [[tokens per expert]
        per MoE layer, last step]}}``.
    """
    import json

    out = {}
    for label, config in runs.items():
        result = json.loads((Path(config.workdir) / f"moe_rank0_results_epoch{epoch}.json").read_text())
        load = torch.tensor(result["routing"]["tokens_per_expert"], dtype=torch.float64, device="cpu")  # (steps, layers, E)
        violation = (load.amax(dim=-1) / load.mean(dim=-1) - 1).amax(dim=-1)
        out[label] = {"loss": list(result["train_losses"]), "max_violation": violation.tolist(),
                      "final_load": load[-1].tolist()}
    return out


def node_limited_traffic_worker(rank: int, world_size: int, num_experts: int = 16, top_k: int = 4, hidden: int = 64,
                                tokens_per_rank: int = 128, topk_group: int = 1) -> dict:
    """A DeepSeek layer with its experts over ``world_size`` ranks (one group of experts per rank, as one
    node), without and with node-limited routing (each token to at most ``topk_group`` ranks).

    The dispatch of assignment 5.8.2 sends one row per choice: a token whose k experts sit on one rank
    still travels k times, so node-limited routing moves as many bytes as unlimited routing. A dispatch
    that sends a token once per destination rank and copies it there to its experts (DeepSeek-V3,
    Sec. 3.2.2; DeepEP) sends one row per distinct (token, rank) pair; those rows are counted as well.

    Returns:
        ``{"unlimited": {...}, "limited": {...}}`` with ``all_to_all_bytes`` (this rank's forward and
        backward all-to-all bytes, from the communication counter), ``rows_per_choice`` (rows the layer
        sent) and ``rows_per_rank`` (distinct (token, destination rank) pairs), and ``bytes_per_row``.
    """
    from course.collectives import CommCounter
    from course.launch import context
    from course.mesh import Mesh
    from moe.config import MoEConfig
    from moe.experts import MLPExperts
    from moe.layer import MoELayer

    device = context().device
    mesh = Mesh.build(dp=world_size, ep=world_size)
    out = {}
    for label, groups in (("unlimited", world_size), ("limited", topk_group)):
        gen = torch.Generator().manual_seed(0)
        full = MLPExperts(num_experts, hidden, 2 * hidden, generator=gen)
        config = MoEConfig(num_experts, top_k, router="deepseek", n_group=world_size, topk_group=groups)
        layer = MoELayer(hidden, config, full.shard(mesh.ep_rank, world_size), mesh.ep_group, gen).to(device)
        x = torch.randn(tokens_per_rank, hidden, generator=torch.Generator().manual_seed(100 + rank)).to(device)
        x.requires_grad_(True)
        chosen = []
        hook = layer.router.register_forward_hook(lambda m, a, r: chosen.append(r.experts.detach().cpu()))
        with CommCounter() as counter:
            layer(x).output.square().mean().backward()
        hook.remove()
        destination = chosen[0] // (num_experts // world_size)                          # (T, k) ranks
        distinct = sum(len(set(row)) for row in destination.tolist())
        out[label] = {"all_to_all_bytes": sum(r.bytes for r in counter.records if r.kind == "all_to_all"),
                      "rows_per_choice": int(layer.stats["per_expert"].sum()), "rows_per_rank": distinct}
    out["bytes_per_row"] = hidden * x.element_size()
    return out


def dropped_fraction(choices: list[torch.Tensor], num_experts: int, capacity_factor: float) -> float:
    """Fraction of the choices in ``choices`` (one (T, k) tensor per batch; capacity per batch) that a
    capacity factor drops (:func:`moe.capacity.expert_capacity`, :func:`moe.capacity.capacity_mask`)."""
    from moe.capacity import capacity_mask, expert_capacity

    dropped = total = 0
    for experts in choices:
        capacity = expert_capacity(experts.shape[0], num_experts, experts.shape[1], capacity_factor)
        kept = capacity_mask(experts, num_experts, capacity)
        dropped += int((~kept).sum())
        total += kept.numel()
    return dropped / max(1, total)


def all_to_all_bytes_formula(tokens: float, top_k: int, hidden: int, num_experts: int, moe_layers: int, ep: int,
                             bytes_per_element: int = 4) -> float:
    """Bytes that the all-to-alls of one dropless training step hand over, summed over the ep ranks.

    Per MoE layer: the counts (``num_experts`` int64 per rank), then four all-to-alls of the ``tokens * top_k``
    routed rows of ``hidden`` floats — dispatch and combine forward, and their two backward passes.
    (Counted as the input of each call, the rows a rank keeps for itself included.)
    """
    return moe_layers * (ep * num_experts * 8 + 4 * tokens * top_k * hidden * bytes_per_element)


def predicted_row_traffic(rows_to: list[list[int]], hidden: int, bytes_per_element: int = 4) -> list[float]:
    """Bytes each rank sends to *other* ranks in the four row all-to-alls of one dropless MoE layer's forward
    and backward pass, predicted from the routing alone: ``rows_to[r][j]`` is how many of rank r's routed rows
    go to experts on rank j (e.g. ``all_to_all_worker``'s ``router_rows_to`` of every rank).

    Rank r sends ``sum_{j != r} rows_to[r][j]`` rows in the dispatch and in the combine's backward (gradients
    of its outputs go back to the experts), and ``sum_{j != r} rows_to[j][r]`` rows in the combine and in the
    dispatch's backward (its experts' outputs, and the gradients of their inputs, go home) — each row
    ``hidden * bytes_per_element`` bytes (Lepikhin et al. 2021, GShard, Sec. 2.2; dropless as in MegaBlocks).
    The counts exchanged before the dispatch are not included.

    Raises:
        ValueError: ``rows_to`` is not square (one row per rank, one entry per rank).
    """
    p = len(rows_to)
    if any(len(row) != p for row in rows_to):
        raise ValueError(f"rows_to must be {p} x {p} (rows each rank routes to each rank), not {[len(r) for r in rows_to]}")
    row_bytes = hidden * bytes_per_element
    return [2.0 * row_bytes * (sum(rows_to[r][j] for j in range(p) if j != r) + sum(rows_to[j][r] for j in range(p) if j != r))
            for r in range(p)]


def summarize_timings(step_seconds: dict[str, list[float]]) -> list[dict]:
    """Median and min-max of each run's seconds per step (:func:`course.benchmarking.summarise`), and its
    median's ratio to the first run's median."""
    from course.benchmarking import summarise

    rows, base = [], None
    for label, values in step_seconds.items():
        stats = summarise(values)
        base = base or stats["median"]
        rows.append({"run": label, "median s/step": stats["median"], "min": stats["min"], "max": stats["max"],
                     "repeats": stats["n"], "ratio to first": stats["median"] / base})
    return rows


def run_config(parse_args, workdir, **options) -> object:
    """The configuration ``parse_args`` of ``project/run_moe.py`` makes of ``--option value`` pairs (True: a flag), a
    copy."""
    argv = []
    for name, value in options.items():
        if value is True:
            argv.append(f"--{name}")
        elif value is not None and value is not False:
            argv += [f"--{name}", str(value)]
    return copy.copy(parse_args(argv + ["--workdir", str(workdir), "--quiet", "--overwrite"]))
