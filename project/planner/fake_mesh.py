"""One rank of a large world in one process: the course's own mesh, 3D stage and ZeRO on a fake process group.

    python -m project.planner.fake_mesh --rank 517 --preset gpt3-6.7b --dp 16 --pp 8 --tp 8 --zero 1 \\
        --vocab_size 50257 --model_max_length 1024 --batch_size 256 --micro_batches 16 --precision fp32

builds, for rank ``--rank`` of a ``dp x pp x tp`` world of up to thousands of ranks, what that rank would
build in a real run — and nothing else:

1. the process group: torch's fake back-end (``dist.init_process_group("fake", store=FakeStore(), rank=r,
   world_size=n)``, ``torch.testing._internal.distributed.fake_pg``; what torchtitan's
   ``COMM_MODE=fake_backend`` uses): every group can be made and every collective returns at once, moving
   nothing;
2. the course's mesh (:class:`course.mesh.Mesh`: the same groups a real rank gets, named for the counter);
3. the rank's pipeline stage, tensor parallel over its tp group (:class:`three_d.stage.TensorParallelStage`),
   built from a GPT-2 made on the **meta device** (shapes and dtypes, no memory: a 6.7B model costs nothing);
4. ZeRO stage ``--zero`` over the dp group (:class:`memory.training.ShardedStep`: plain data parallelism,
   :class:`memory.zero.ZeroOptimizer` or :class:`memory.fsdp.FullyShardedModel`);
5. one micro-batch's forward and backward pass, the gradient reduction and the optimizer step, on meta
   tensors, with the communication counter (:class:`course.collectives.CommCounter`) recording every
   collective, its group and its bytes, torch's ``MemTracker`` the memory by category, and torch's
   ``FlopCounterMode`` the FLOPs of the forward and backward pass;
6. one step's pipeline messages of the schedule (:func:`pipeline_messages`), counted with their peers.

It then reports the rank's coordinates and groups, the bytes of its parameters, gradients and optimizer
state (counted by storage, as :mod:`memory.accounting` counts real runs) beside the planner's
(:func:`project.planner.memory.stage_memory`), and the collectives beside the planner's
(:func:`project.planner.communication.stage_communication`), and one step's point-to-point messages of the pipeline schedule
(``--schedule``: the batches :class:`pipeline.StageRunner` posts, :func:`pipeline_messages`) with their peers.
The 3D step's scalar all-reduces (:mod:`three_d.step`) do not run (they read values: ``.item()`` has nothing
to read on the meta device), so those calls of the planner have no fake counterpart here.

With ``--activation_checkpointing`` every block is recomputed (:mod:`memory.checkpointing`, the course's
``CheckpointFunction``, unchanged: :func:`project.planner.fake_activations.meta_autocast` lets it ask autocast
about the meta device). :func:`measure_activations` measures one micro-batch's activations alone: after the
forward pass, and at their peak in the backward pass (:mod:`project.planner.fake_activations`).

What is supported: cp = ep = 1, dense models, ``--precision fp32`` (the course's training keeps fp32 weights,
gradients and Adam moments: 4 + 4 + 8 bytes per parameter), no sequence parallelism, one chunk per rank.
Anything else raises ValueError before the fake world is made: the expert-parallel layout (:mod:`moe`) and
the context-parallel ring (:mod:`context_parallel`) are not built on the fake rank (their all-to-all and ring
bytes are the planner's alone, ``project.planner.communication.stage_communication``).

Sources: PyTorch ``FakeProcessGroup`` (torch.testing._internal.distributed.fake_pg) and the meta device;
torchtitan ``COMM_MODE=fake_backend``; Rajbhandari et al. 2020 (ZeRO, Sec. 5); Narayanan et al. 2021 (PTD-P).
"""
from __future__ import annotations

import contextlib
import sys
import warnings

import torch
import torch.distributed as dist

from project.planner.fake_activations import activation_peak, meta_autocast, tracker_bytes


@contextlib.contextmanager
def fake_world(rank: int, world_size: int):
    """A fake process group of ``world_size`` ranks in which this process is ``rank``; destroyed on exit.

    Raises:
        RuntimeError: a process group already exists (run the fake world in a process of its own).
        ValueError: ``rank`` outside ``0 .. world_size - 1``.
    """
    from torch.testing._internal.distributed.fake_pg import FakeStore

    if dist.is_initialized():
        raise RuntimeError("a process group already exists in this process: run the fake world in a fresh process")
    if not 0 <= rank < world_size:
        raise ValueError(f"--rank {rank} is outside 0..{world_size - 1}")
    # the fake back-end for the meta device too: batch_isend_irecv (the pipeline's messages) asks the group for
    # the back-end of its tensors' device, and the fake rank's tensors are on the meta device
    dist.init_process_group("cpu:fake,cuda:fake,meta:fake", store=FakeStore(), rank=rank, world_size=world_size)
    try:
        yield
    finally:
        with _cpp_warnings_off():
            dist.destroy_process_group()


@contextlib.contextmanager
def _cpp_warnings_off():
    """Inside: the process's C++ stderr (file descriptor 2) goes nowhere. Destroying the fake group makes c10 warn
    "No backend of type 0 found for Process Group with name undefined. Assuming no hooks are registered." — the
    fake back-end registers no hooks, so it is true and harmless, and c10's log level cannot be changed once torch
    has loaded; exceptions still propagate."""
    import os

    sys.stderr.flush()
    saved = os.dup(2)
    with open(os.devnull, "w") as null:
        os.dup2(null.fileno(), 2)
        try:
            yield
        finally:
            os.dup2(saved, 2)
            os.close(saved)


def held_bytes(tensors) -> int:
    """Bytes of the distinct storages behind ``tensors`` (each once, whole; None skipped). Works on meta
    tensors, whose storages all report address 0 (:func:`course.saved_tensors.storage_bytes` keys by
    address): a storage is told apart by its ``_cdata`` (the C++ storage it wraps), which views share."""
    seen, total = set(), 0
    for t in tensors:
        if t is None:
            continue
        s = t.untyped_storage()
        if s._cdata in seen:
            continue
        seen.add(s._cdata)
        total += s.nbytes()
    return total


def check_supported(config) -> None:
    """The configurations the fake rank builds (module docstring).

    Raises:
        ValueError: naming the option to change.
    """
    # why each is not built: the expert-parallel dispatch sizes its all-to-alls from the routed token counts
    # (moe.expert_parallel.dispatch reads them with .tolist()), values a meta tensor and a fake all-to-all do not
    # have; the course's context parallelism runs on the whole transformers GPT-2 (context_parallel.gpt2), not on
    # the 3D stage (three_d.stage), so no fake rank of dp x pp x cp x tp exists to build — and that model does not
    # run on meta tensors either: transformers' mask preparation reads the position ids' values
    # (masking_utils.find_packed_sequence_indices calls .all() on them: "Tensor.item() cannot be called on meta
    # tensors", measured with transformers' GPT-2 on a fake dp 4 x cp 4 world)
    unsupported = {"--cp (context parallelism runs on context_parallel.gpt2's model, not the 3D stage)": config.cp != 1,
                   "--ep (the expert dispatch reads routed token counts, which meta tensors do not have)":
                       config.ep != 1,
                   "--num_experts": config.num_experts != 1,
                   "--sequence_parallel": config.sequence_parallel, "--virtual_stages": config.virtual_stages != 1,
                   "--precision bf16 (mixed-precision Adam, 2 + 2 + 12 bytes)": config.precision != "fp32"}
    bad = [name for name, is_bad in unsupported.items() if is_bad]
    if bad:
        raise ValueError(f"the fake rank builds dense dp x pp x tp runs in fp32 only (the planner alone predicts the "
                         f"others: python -m project.planner with the same options); drop or reset {', '.join(bad)}")


def meta_stage(config):
    """Inside a :func:`fake_world`, once :func:`check_supported` passes: this rank's mesh of ``config.dims``, its
    pipeline stage of the GPT-2 (a :class:`three_d.stage.TensorParallelStage` on meta tensors, split over its tp
    group) and one micro-batch's input ``x`` for it: ``b x s`` token ids on the first stage, else ``b x s x h``
    fp32 requiring its gradient (``b = batch_size / (dp * micro_batches)``, ``s = model_max_length``).

    Returns:
        ``(mesh, stage, x)``.

    Raises:
        ValueError: as :func:`check_supported`.
    """
    from course.mesh import Mesh
    from course.model import build_gpt2
    from three_d.stage import TensorParallelStage

    check_supported(config)
    mesh = Mesh(config.dims, device_type="cpu")
    with torch.device("meta"):
        model = build_gpt2(config.preset, config.vocab_size, n_positions=config.model_max_length,
                           dropout=config.dropout)
    stage = TensorParallelStage(model, mesh.stage, config.pp, group=mesh.tp_group)
    del model
    rows, seq = config.batch_size // (config.dp * config.micro_batches), config.model_max_length
    if stage.is_first:
        x = torch.zeros(rows, seq, dtype=torch.long, device="meta")
    else:
        x = torch.zeros(rows, seq, config.model_shape["n_embd"], device="meta", requires_grad=True)
    return mesh, stage, x


def build_rank(config, rank: int) -> dict:
    """Inside a :func:`fake_world` of ``config.world_size`` ranks: build rank ``rank``'s mesh, stage and ZeRO
    step for ``config`` (a :class:`project.planner.cli.PlanConfig`), run one micro-batch's forward and backward, the
    gradient reduction and the optimizer step on meta tensors, and report what the rank holds.

    Returns:
        ``{"mesh": Mesh.describe(), "stage", "blocks" (global block indices), "parameters" (elements),
        "bytes": {"params", "grads", "optimizer"}, "step_counters" (Adam's 0-dimensional fp32 step counts, one
        per tensor it steps: in "optimizer", left out by the planner), "memtracker": {"after_forward",
        "after_backward", "after_step", "peak"}: torch's MemTracker's view of the same step (:func:`tracker_bytes`),
        "flops": the forward and backward pass's FLOPs (``torch.utils.flop_counter.FlopCounterMode``: matrix
        products, 2 per multiply-add), "collectives": [{"group", "kind", "bytes", "scope"}] in call order,
        "messages": [{"group", "kind" (send/recv), "bytes", "peer" (global rank)}]: one step of the pipeline
        schedule's point-to-point messages (:func:`pipeline_messages`)}``; bytes in bytes.

    Raises:
        ValueError: as :func:`check_supported`.
    """
    from course.collectives import CommCounter
    from memory.training import ShardedStep
    from torch.distributed._tools.mem_tracker import MemTracker
    from torch.utils.flop_counter import FlopCounterMode

    mesh, stage, x = meta_stage(config)
    step = ShardedStep(stage, config.zero, mesh.dp_cp_group, torch.optim.AdamW, blocks=list(stage.h.values()),
                       activation_checkpointing=config.activation_checkpointing, lr=1e-4)
    tracker = MemTracker()
    inner = getattr(step.optimizer, "optimizer", step.optimizer)
    tracker.track_external(stage, inner, x)
    snapshots = {}
    with CommCounter() as counter, tracker, meta_autocast(), warnings.catch_warnings():
        # MemTracker warns for each optimizer state or gradient that is None (not made yet): harmless
        warnings.filterwarnings("ignore", message="Expected a tensor or a traceable wrapper-subclass of tensor")
        step.optimizer.zero_grad(set_to_none=True)
        with FlopCounterMode(display=False) as flop_counter:
            out = stage(x)
            snapshots["after_forward"] = tracker_bytes(tracker, "current")
            out.backward(torch.ones_like(out))
        snapshots["after_backward"] = tracker_bytes(tracker, "current")
        step.reduce_gradients()
        step.optimizer.step()
        snapshots["after_step"] = tracker_bytes(tracker, "current")
    snapshots["peak"] = tracker_bytes(tracker, "peak")
    with CommCounter() as pipeline_counter:
        pipeline_messages(config, mesh.pp_group, mesh.stage, x, out)
    held = {k: held_bytes(v) for k, v in step.category_tensors().items()}
    counters = sum(1 for t in step.category_tensors()["optimizer"] if t.dim() == 0)  # Adam's step, one per tensor
    calls = [{"group": r.group, "kind": r.kind, "bytes": r.bytes, "scope": r.scope} for r in counter.records]
    messages = [{"group": r.group, "kind": r.kind, "bytes": r.bytes, "peer": r.peer} for r in pipeline_counter.records]
    return {"mesh": mesh.describe(), "stage": mesh.stage, "blocks": list(stage.blocks),
            "parameters": sum(p.numel() for p in stage.parameters()), "bytes": held, "step_counters": counters,
            "memtracker": snapshots, "flops": flop_counter.get_total_flops(), "collectives": calls,
            "messages": messages}


def pipeline_messages(config, pp_group, stage: int, x: torch.Tensor, out: torch.Tensor) -> None:
    """One step's point-to-point messages of pipeline stage ``stage`` under ``config.schedule``, on meta tensors.

    The batches are the course's: every stage's action list (:func:`pipeline.schedule_actions`) laid out on
    the common clock by :func:`pipeline.metrics.communication_plan` — the plan :class:`pipeline.StageRunner`
    posts, batch by batch — and each batch is one :func:`course.collectives.exchange` in the ``pp`` group,
    peers by global rank (counted by :class:`course.collectives.CommCounter` with their peer). A forward's
    message is shaped like this stage's input ``x`` when received and like its output ``out`` when sent; a
    backward's the other way round (the gradient of the output comes in, the input's goes out): on meta
    tensors, ``b x s x h`` in the activations' dtype, whatever the model.

    Not run: the ``StageRunner`` itself (its constructor broadcasts a clock reading and reads it with
    ``.item()``, it gathers every stage's action list with ``all_gather_object``, and :mod:`pipeline.p2p` sends
    each tensor's shape in a header first, uncounted, that a fake receive leaves unfilled), hence the replay
    of its plan here. Interleaved schedules (``virtual_stages > 1``) are refused by :func:`check_supported`.

    Raises:
        ValueError: as :func:`pipeline.schedule_actions` (an unknown schedule).
    """
    from course.collectives import P2P, exchange, global_rank
    from pipeline import schedule_actions
    from pipeline.metrics import communication_plan

    if config.pp == 1:
        return
    actions = [schedule_actions(config.schedule, r, config.pp, config.micro_batches, config.virtual_stages)
               for r in range(config.pp)]
    plan = communication_plan(actions)[stage]
    for step in sorted(plan["batches"]):
        ops = []
        for kind, peer, message in plan["batches"][step]:
            forward = message[0] == "F"
            like = (out if forward else x) if kind == "send" else (x if forward else out)
            ops.append(P2P(kind, torch.empty(like.shape, dtype=like.dtype, device="meta"), global_rank(pp_group, peer)))
        exchange(ops, pp_group)


def measure_activations(config, rank: int) -> dict:
    """:func:`project.planner.fake_activations.activation_peak` of rank ``rank``'s stage (its input ``b x s`` token
    ids on the first stage, else ``b x s x h`` fp32 requiring its gradient) in its own :func:`fake_world`, beside
    the planner's activations of one micro-batch (``stage_memory``'s ``activations`` over the micro-batches in
    flight) and ``recompute`` (one block's full activations while the backward pass recomputes it; 0 without
    checkpointing)."""
    from project.planner.memory import stage_memory

    check_supported(config)
    with fake_world(rank, config.world_size):
        mesh, stage, x = meta_stage(config)
        found = {"stage": mesh.stage, **activation_peak(stage, x, config.activation_checkpointing)}
    planned = stage_memory(config, found["stage"])
    found["planned"] = {"activations": sum(planned.parts.values()), "recompute": planned.recompute}
    return found


def measure(config, rank: int) -> dict:
    """:func:`build_rank` in its own :func:`fake_world`, beside the planner's memory of the rank's stage."""
    from project.planner.memory import stage_memory

    check_supported(config)
    with fake_world(rank, config.world_size):
        found = build_rank(config, rank)
    held = stage_memory(config, found["stage"]).categories()
    found["planned"] = {k: held[k] for k in ("params", "grads", "optimizer")}
    return found


def sweep(config, rank: int) -> list[dict]:
    """:func:`measure` of rank ``rank`` at every ``(dp, pp, tp)`` of ``config``'s world that the model allows
    (:func:`course.factorisations.factorisations`), each with ``config``'s other options and
    ``config``'s rows per micro-batch (``batch_size`` scaled with dp). Each result also has ``"dims"``.

    Raises:
        ValueError: as :func:`check_supported`; ``rank`` outside the world.
    """
    from course.factorisations import factorisations
    from project.planner.config import PlanConfig

    check_supported(config)
    world = config.world_size
    if not 0 <= rank < world:
        raise ValueError(f"--rank {rank} is outside 0..{world - 1}")
    shape = config.model_shape
    rows = config.batch_size // (config.dp * config.micro_batches)
    out = []
    for dp, pp, tp in factorisations(world, shape["n_layer"], shape["n_head"], shape["n_inner"]):
        values = {**config.record(), "dp": dp, "pp": pp, "tp": tp, "n_devices": world,
                  "batch_size": rows * dp * config.micro_batches}
        found = measure(PlanConfig.for_test(**values), rank)
        found["dims"] = {"dp": dp, "pp": pp, "tp": tp}
        out.append(found)
    return out


def format_sweep(rows: list[dict]) -> str:
    """One line per factorisation: the rank's stage, and its bytes held beside the planner's."""
    lines = [f"{'dp':>5} {'pp':>4} {'tp':>4} {'stage':>5} " + " ".join(
        f"{k + ' held':>16} {k + ' planned':>16}" for k in ("params", "grads", "optimizer"))]
    for r in rows:
        d = r["dims"]
        lines.append(f"{d['dp']:>5} {d['pp']:>4} {d['tp']:>4} {r['stage']:>5} " + " ".join(
            f"{r['bytes'][k]:>16,} {r['planned'][k]:>16,.0f}" for k in ("params", "grads", "optimizer")))
    return "\n".join(lines)


def format_report(found: dict) -> str:
    """The rank's coordinates and groups, its bytes beside the planner's and MemTracker's, and its collectives."""
    mesh = found["mesh"]
    sizes = " x ".join(f"{mesh[n]}" for n in ("dp", "pp", "tp"))
    coords = ", ".join(f"{k} {v}" for k, v in mesh["coordinates"].items())
    lines = [f"rank {mesh['rank']} of dp x pp x tp = {sizes}: {coords}; blocks {found['blocks'][0]}.."
             f"{found['blocks'][-1]} of stage {found['stage']}, {found['parameters']:,} parameters"]
    for name, members in mesh["groups"].items():
        lines.append(f"  {name:>6} group ({len(members)} ranks): {members}")
    tracked = found["memtracker"]
    lines.append(f"{'bytes':>10} {'held':>14} {'planned':>14} {'MemTracker':>14}")
    for key, category, when in (("params", "Parameter", "after_forward"), ("grads", "Gradient", "after_backward"),
                                ("optimizer", "Optstate", "after_step")):
        lines.append(f"{key:>10} {found['bytes'][key]:>14,} {found['planned'][key]:>14,.0f} "
                     f"{tracked[when][category]:>14,}")
    lines.append("(MemTracker: parameters after the forward pass, gradients after the backward pass, before the "
                 "reduction, optimizer state after the step)")
    lines.append(f"MemTracker peak: {tracked['peak']}")
    lines.append(f"FLOPs of one micro-batch's forward and backward (FlopCounterMode): {found['flops']:,}")
    calls: dict[tuple, int] = {}
    for c in found["collectives"]:
        key = (c["group"], c["kind"], c["bytes"])
        calls[key] = calls.get(key, 0) + 1
    lines.append("collectives of one micro-batch's forward and backward, the reduction and the step:")
    for (group, kind, nbytes), count in sorted(calls.items()):
        lines.append(f"  {group:>6} {kind:<15} {count:>4} x {nbytes:>14,} bytes")
    messages: dict[tuple, int] = {}
    for m in found.get("messages", []):
        key = (m["kind"], m["peer"], m["bytes"])
        messages[key] = messages.get(key, 0) + 1
    if messages:
        lines.append("pipeline messages of one step of the schedule (pp group; peers by global rank):")
        for (kind, peer, nbytes), count in sorted(messages.items()):
            lines.append(f"  {kind:<4} {'to' if kind == 'send' else 'from':<4} rank {peer:>5} {count:>4} x "
                         f"{nbytes:>14,} bytes")
    return "\n".join(lines)


def main(argv=None) -> int:
    """``python -m project.planner.fake_mesh``: the planner's options (:class:`project.planner.cli.PlanConfig`, with
    its ``--rank`` and ``--factorisations``); ``--out`` writes the report as JSON."""
    from pathlib import Path

    from course.results import write_json
    from project.planner.config import PlanConfig

    config = PlanConfig.from_command_line(argv, environment=False, prog="python -m project.planner.fake_mesh")
    try:
        check_supported(config)
        if not 0 <= config.rank < config.world_size:
            raise ValueError(f"--rank {config.rank} is outside 0..{config.world_size - 1}")
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    found = sweep(config, config.rank) if config.factorisations else measure(config, config.rank)
    print(format_sweep(found) if config.factorisations else format_report(found))
    if config.out:
        write_json(Path(config.out), found)
    return 0


if __name__ == "__main__":
    sys.exit(main())
