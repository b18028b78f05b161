"""Workers that notebooks/06_3d_parallelism.ipynb launches (tiny GPT-2, random tokens, float32)."""
from __future__ import annotations

import torch

VOCAB, N_EMBD, N_HEAD, N_LAYER, SEQ = 64, 64, 4, 4, 32


def timeline_worker(rank: int, world_size: int, dp: int, pp: int, tp: int, micro_batches: int, micro_batch: int = 2,
                    steps: int = 2) -> dict:
    """Run ``steps`` 3D steps of a tiny GPT-2 (the first is warm-up) and report the last one.

    Returns:
        ``{"coordinates": (pp, dp, tp), "events": [(kind, i, start_s, end_s)] (shared clock),
        "event_cpu_s": this process's CPU seconds in each event (:class:`pipeline.StepResult`),
        "spans": the last step's spans (:mod:`course.trace`, same clock: the step, its forwards and
        backwards, every communication call with its kind, group and bytes — what
        :func:`three_d.trace.time_breakdown` divides),
        "step_span": (start_s, end_s) of the last step,
        "by_group": {group: {kind: {count, bytes, traffic_bytes}}} of the last step,
        "busy_s": forward+backward seconds, "step_s": the step's wall time}``.
    """
    from course import trace
    from course.collectives import CommCounter
    from course.launch import context
    from course.mesh import ParallelDims
    from course.model import build_gpt2
    from course.task import worker_env_quiet
    from three_d.rank_setup import setup_rank
    from three_d.step import three_d_step

    worker_env_quiet()
    torch.set_num_threads(1)
    hf = build_gpt2("tiny", VOCAB, n_positions=SEQ, dropout=0.0, seed=0, n_layer=N_LAYER, n_embd=N_EMBD,
                    n_head=N_HEAD)
    device = context().device
    ranked = setup_rank(ParallelDims(dp=dp, pp=pp, tp=tp), hf, device)
    mesh, stage, runner = ranked.mesh, ranked.stage, ranked.runner
    g = torch.Generator().manual_seed(1 + mesh.dp_rank)
    ids = torch.randint(0, VOCAB, (micro_batch * micro_batches, SEQ), generator=g, device="cpu").to(device)
    for _ in range(steps):  # course.trace: the step's spans on course.measure's clock
        with CommCounter() as counter, trace.recording(trace.Recorder(device)) as recorder:
            with recorder.span("3D step", "step"):
                out = three_d_step(stage, runner, mesh, ids, ids.clone(), micro_batches, "1f1b", 1.0)
    whole, = recorder.select("step")
    start, step_s = whole.start, whole.end - whole.start
    events = out["result"].events
    shift = runner.origin  # back to absolute seconds, comparable across pp groups
    return {"coordinates": (mesh.stage, mesh.dp_rank, mesh.tp_rank), "blocks": list(stage.blocks),
            "events": [(k, i, a + shift, b + shift) for k, i, a, b in events],
            "event_cpu_s": list(out["result"].event_cpu_s),
            "spans": recorder.export(),
            "step_span": (start, start + step_s),
            "by_group": counter.by_group(), "busy_s": sum(b - a for _, _, a, b in events), "step_s": step_s,
            "parameters": sum(p.numel() for p in stage.parameters()), "timer": out["result"].timer}


def rank_cells(dp: int, pp: int, tp: int, n_layer: int = N_LAYER) -> list[dict]:
    """What every rank of a ``dp x pp x tp`` mesh holds, for :func:`course.plots.mesh.plot_rank_grid`:
    ``{"rank", "pp", "dp", "tp", "blocks", "extra"}`` (the rank's coordinates; extra: embedding / LM head)."""
    from three_d.mesh_arithmetic import coordinates
    from three_d.stage import stage_blocks

    cells = []
    for rank in range(dp * pp * tp):
        s, d, t = coordinates(rank, dp, pp, tp)
        extra = " + ".join(name for name, held in (("embedding", s == 0), ("LM head", s == pp - 1)) if held)
        cells.append({"rank": rank, "pp": s, "dp": d, "tp": t,
                      "blocks": list(stage_blocks(n_layer, s, pp)), "extra": extra})
    return cells
