"""Workers that notebooks/06_3d_parallelism.ipynb launches (tiny GPT-2, random tokens, float32)."""
from __future__ import annotations

import torch

VOCAB, N_EMBD, N_HEAD, N_LAYER, SEQ = 64, 64, 4, 4, 32


def timeline_worker(rank: int, world_size: int, dp: int, pp: int, tp: int, n_chunk: int, micro_batch: int = 2,
                    steps: int = 2) -> dict:
    """Run ``steps`` 3D steps of a tiny GPT-2 (the first is warm-up) and report the last one.

    Returns:
        ``{"coordinates": (pp, dp, tp), "events": [(kind, i, start_s, end_s)] (shared clock),
        "event_cpu_s": this process's CPU seconds in each event (:class:`pipeline.StepResult`),
        "comm": [(kind, group, start_s, end_s)] every communication call of the last step (same clock),
        "step_span": (start_s, end_s) of the last step,
        "by_group": {group: {kind: {count, bytes, traffic_bytes}}} of the last step,
        "busy_s": forward+backward seconds, "step_s": the step's wall time}``.
    """
    from course.collectives import CommCounter
    from course.launch import context
    from course.measure import now
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
    ids = torch.randint(0, VOCAB, (micro_batch * n_chunk, SEQ), generator=g, device="cpu").to(device)
    for _ in range(steps):
        with CommCounter() as counter:
            start = now(device)  # course.measure: the clock after the device's queued work
            out = three_d_step(stage, runner, mesh, ids, ids.clone(), n_chunk, "1f1b", 1.0)
            step_s = now(device) - start
    events = out["result"].events
    shift = runner.origin  # back to absolute seconds, comparable across pp groups
    return {"coordinates": (mesh.stage, mesh.dp_rank, mesh.tp_rank), "blocks": list(stage.blocks),
            "events": [(k, i, a + shift, b + shift) for k, i, a, b in events],
            "event_cpu_s": list(out["result"].event_cpu_s),
            "comm": [(r.kind, r.group, r.start, r.end) for r in counter.records if r.start is not None],
            "step_span": (start, start + step_s),
            "by_group": counter.by_group(), "busy_s": sum(b - a for _, _, a, b in events), "step_s": step_s,
            "parameters": sum(p.numel() for p in stage.parameters()), "timer": out["result"].timer}


def rank_cells(dp: int, pp: int, tp: int, n_layer: int = N_LAYER) -> list[dict]:
    """What every rank of a ``dp x pp x tp`` mesh holds, for :func:`course.plots.mesh.plot_rank_grid`:
    ``{"rank", "pp", "dp", "tp", "tp_size", "blocks", "extra"}`` (extra: embedding / LM head)."""
    from three_d.mesh_arithmetic import coordinates
    from three_d.stage import stage_blocks

    cells = []
    for rank in range(dp * pp * tp):
        s, d, t = coordinates(rank, dp, pp, tp)
        extra = " + ".join(name for name, held in (("embedding", s == 0), ("LM head", s == pp - 1)) if held)
        cells.append({"rank": rank, "pp": s, "dp": d, "tp": t, "tp_size": tp,
                      "blocks": list(stage_blocks(n_layer, s, pp)), "extra": extra})
    return cells
