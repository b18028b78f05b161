"""Peak activation memory of GPipe and 1F1B on GPT-2, measured in real processes.

Every rank builds the same GPT-2, keeps its stage (:func:`pipeline.gpt2_stages.gpt2_stage`)
and runs one batch with each schedule. :class:`pipeline.stage_runner.StageRunner` counts the
bytes of the tensors autograd saves for the backward pass while micro-batches are in flight.
"""
from __future__ import annotations



SCHEDULE_NAMES = ("gpipe", "1f1b")


def gpt2_memory_worker(rank: int, world_size: int, batch: dict, vocab_size: int, preset: str,
                       micro_batches: int) -> dict:
    """A worker for :func:`course.launch.launch`: ``{schedule: {peak_activation_bytes, peak_in_flight, events}}``.

    ``batch`` holds ``input_ids`` and ``labels`` (batch, seq); it is cut into ``micro_batches``
    micro-batches. Dropout is 0.
    """
    from pipeline.gpt2_stages import gpt2_stage
    from pipeline.stage_runner import StageRunner
    from pipeline.schedules import schedule_actions
    from course.launch import context
    from course.loss import count_target_tokens, lm_loss
    from course.mesh import Mesh
    from course.model import build_gpt2

    device = context().device
    mesh = Mesh.build(pp=world_size)
    model = build_gpt2(preset, vocab_size, n_positions=batch["input_ids"].shape[1], dropout=0.0, seed=0)
    stage, _ = gpt2_stage(model, mesh.stage, world_size)
    stage.to(device)
    n_target = max(1, count_target_tokens(batch["labels"]))
    runner = StageRunner(stage, device, group=mesh.pp_group,
                         loss_fn=lambda logits, labels: lm_loss(logits, labels, reduction="sum") / n_target)
    size = -(-batch["input_ids"].shape[0] // micro_batches)
    inputs = list(batch["input_ids"].split(size)) if mesh.is_first_stage else None
    targets = [t.to(device) for t in batch["labels"].split(size)] if mesh.is_last_stage else None
    out = {}
    for schedule in SCHEDULE_NAMES:
        stage.zero_grad(set_to_none=True)
        result = runner.run(schedule_actions(schedule, mesh.stage, world_size, len(batch["input_ids"].split(size))),
                            inputs, targets)
        out[schedule] = {"peak_activation_bytes": result.peak_activation_bytes,
                         "peak_in_flight": result.peak_in_flight, "events": result.events}
    return out


def measure_gpt2_memory(batch: dict, vocab_size: int, n_stages: int = 2, micro_batches: int = 8, preset: str = "tiny",
                        timeout: float = 300.0) -> list[dict]:
    """Launch ``n_stages`` processes; rows ``{schedule, stage, peak_activation_bytes, peak_in_flight}``."""
    from course.launch import launch

    batch = {k: batch[k] for k in ("input_ids", "labels")}
    per_rank = launch(gpt2_memory_worker, n_stages, batch, vocab_size, preset, micro_batches, device="cpu",
                      timeout=timeout)
    return [{"schedule": s, "stage": r, "peak_activation_bytes": per_rank[r][s]["peak_activation_bytes"],
             "peak_in_flight": per_rank[r][s]["peak_in_flight"]}
            for s in SCHEDULE_NAMES for r in range(n_stages)]
