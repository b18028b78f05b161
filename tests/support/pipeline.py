"""Helpers shared by the pipeline-schedule tests (a5_2_5, a5_2_6, a5_2_7).

* :func:`torch_order`: torch's own action lists (``pipeline_order`` of
  ``torch.distributed.pipelining.schedules.ScheduleInterleaved1F1B`` /
  ``ScheduleInterleavedZeroBubble``), built without processes: the schedules only read
  ``group_size``, ``group_rank``, ``num_stages`` and ``stage_index`` of their stages, so
  stand-in stage objects are enough. Idle slots (``None``) are dropped and torch's
  ``Action(stage_index, kind, micro-batch)`` becomes ours ``(kind, micro-batch, chunk)``
  with ``chunk = stage_index // p`` (torch's "I", backward of the input only, is our "B").
  :func:`torch_v_order` does the same for the V schedules (``ScheduleZBVZeroBubble``, ``ScheduleDualPipeV``):
  chunk 0 is the rank's stage ``r``, chunk 1 its stage ``2p - 1 - r``; torch's whole backward "B" in those
  split lists is our "BW" and its ``OVERLAP_F_B`` our pair ``("F&B", forward, backward)``.
* :func:`gpt2_schedule_worker`: a rank of a tiny GPT-2 pipeline (dropout 0) that runs one
  schedule and returns its gradients, losses and measurements; :func:`single_process_reference`
  computes the same micro-batches in one process.
"""
from __future__ import annotations

from types import SimpleNamespace

import torch
import torch.nn.functional as F

VOCAB, SEQ, N_LAYER, N_EMBD, N_HEAD = 96, 12, 4, 32, 2
MICRO_SIZES = [2, 3, 2, 1]  # micro-batches of unequal size: shapes travel with the data


def torch_order(schedule: str, p: int, m: int, v: int = 1) -> list[list[tuple]] | None:
    """torch's action list of every rank, or None if torch rejects ``m`` for ``p``."""
    from torch.distributed.pipelining import schedules as S

    cls = {"interleaved": S.ScheduleInterleaved1F1B, "zero_bubble": S.ScheduleInterleavedZeroBubble}[schedule]
    stages = [SimpleNamespace(group_size=p, group_rank=0, num_stages=p * v, stage_index=c * p,
                              is_first=c == 0, is_last=False, submod=None) for c in range(v)]
    try:
        sched = cls(stages, m)
    except ValueError:
        return None
    kinds = {"F": "F", "B": "B", "I": "B", "W": "W"}
    return [[(kinds[str(a.computation_type.value)], a.microbatch_index, a.stage_index // p)
             for a in sched.pipeline_order[r] if a is not None] for r in range(p)]


def torch_v_order(schedule: str, p: int, m: int) -> list[list[tuple]] | None:
    """torch's action list of every rank of a V schedule (``"zbv"`` or ``"dualpipev"``), or None if torch rejects
    ``m`` for ``p`` (DualPipeV: fewer micro-batches than the 2p stages)."""
    from torch.distributed.pipelining import schedules as S

    cls = {"zbv": S.ScheduleZBVZeroBubble, "dualpipev": S.ScheduleDualPipeV}[schedule]
    stages = [SimpleNamespace(group_size=p, group_rank=0, num_stages=2 * p, stage_index=s, is_first=s == 0,
                              is_last=False, submod=None) for s in (0, 2 * p - 1)]
    try:
        sched = cls(stages, m)
    except ValueError:
        return None
    kinds = {"F": "F", "I": "B", "W": "W", "B": "BW"}

    def ours(action, rank):
        if action.sub_actions is not None:
            return ("F&B",) + tuple(ours(a, rank) for a in action.sub_actions)
        return (kinds[str(action.computation_type.value)], action.microbatch_index,
                0 if action.stage_index == rank else 1)

    return [[ours(a, r) for a in sched.pipeline_order[r] if a is not None] for r in range(p)]


def build_model():
    from course.model import build_gpt2

    return build_gpt2("tiny", VOCAB, n_positions=SEQ, dropout=0.0, seed=3, n_layer=N_LAYER, n_embd=N_EMBD,
                      n_head=N_HEAD)


def data():
    g = torch.Generator().manual_seed(5)
    inputs = [torch.randint(0, VOCAB, (s, SEQ), generator=g) for s in MICRO_SIZES]
    targets = [torch.randint(0, VOCAB, (s, SEQ), generator=g) for s in MICRO_SIZES]
    return inputs, targets


def loss_fn(logits, target):
    """The micro-batch's mean next-token loss divided by the number of micro-batches."""
    return F.cross_entropy(logits.flatten(0, 1), target.flatten()) / len(MICRO_SIZES)


def single_process_reference():
    """``({name: grad}, [loss per micro-batch])`` of the whole model in one process."""
    model = build_model()
    inputs, targets = data()
    losses = []
    for x, t in zip(inputs, targets):
        loss = loss_fn(model(input_ids=x).logits, t)
        loss.backward()
        losses.append(float(loss.detach()))
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}, losses


def gpt2_schedule_worker(rank, world_size, schedule, virtual_stages, runner_class=None, planted=None):
    """Rank ``rank`` runs its chunks of the tiny GPT-2 under ``schedule`` once (``planted``: with a planted wrong
    solution, :mod:`tests.support.planting`).

    Returns ``{"grads": {name: grad}, "tied_grad", "losses", "peak_in_flight",
    "peak_activation_bytes", "events", "event_chunks", "runner": what a runner subclass recorded}``.
    """
    from tests.support.planting import planting

    with planting(planted):
        return _gpt2_schedule_run(rank, world_size, schedule, virtual_stages, runner_class)


def _gpt2_schedule_run(rank, world_size, schedule, virtual_stages, runner_class):
    from course.launch import context
    from pipeline.gpt2_stages import gpt2_chunks
    from pipeline.schedules import SCHEDULES, schedule_actions
    from pipeline.stage_runner import StageRunner

    device = context().device
    model = build_model()
    placement = SCHEDULES[schedule].placement
    virtual_stages = SCHEDULES[schedule].chunks_per_rank(virtual_stages)
    chunks, tied = gpt2_chunks(model, rank, world_size, virtual_stages, placement=placement)
    runner = (runner_class or StageRunner)([c.to(device) for c in chunks], device, loss_fn=loss_fn,
                                           placement=placement)
    inputs, targets = data()
    result = runner.run(schedule_actions(schedule, rank, world_size, len(MICRO_SIZES), virtual_stages),
                        inputs if rank == 0 else None, targets if rank == runner.last_rank else None)
    ids = {id(p) for c in chunks for p in c.parameters()}
    grads = {n: p.grad.detach().clone() if p.grad is not None else None
             for n, p in model.named_parameters() if id(p) in ids}
    tied_grad = None
    if tied is not None and rank == runner.last_rank:
        tied_grad = tied.grad.detach().clone() if tied.grad is not None else None
    return {"grads": grads, "tied_grad": tied_grad, "losses": dict(result.losses),
            "peak_in_flight": result.peak_in_flight, "peak_activation_bytes": result.peak_activation_bytes,
            "events": list(result.events), "event_chunks": list(result.event_chunks),
            "runner": getattr(runner, "record", None), "last_rank": runner.last_rank}


def check_equal_to_single_process(results, world_size):
    """Every parameter's gradient and every loss equal the single-process ones (the tied
    embedding/head weight: rank 0's embedding gradient plus the last rank's head copy's; with the V
    placement rank 0 holds both and its one weight has the whole gradient)."""
    want, losses = single_process_reference()
    seen = set()
    for rank in range(world_size):
        for name, grad in results[rank]["grads"].items():
            assert grad is not None, f"rank {rank}: {name} has no gradient"
            expected = want[name]
            if name == "transformer.wte.weight" and results[0].get("last_rank", world_size - 1) != 0:
                tied = results[world_size - 1]["tied_grad"]
                assert tied is not None, "the last rank's head copy has no gradient"
                grad = grad + tied
            # the micro-batches' gradient parts summed in another order than one batch's (and the tied weight's two
            # parts added): sums of terms of either sign, whose cancellation lifts the relative error above the
            # ~sqrt(n) x 2^-24 of each sum: rtol 1e-4, atol 1e-6 for the near-zero entries
            torch.testing.assert_close(grad, expected, rtol=1e-4, atol=1e-6,
                                       msg=f"rank {rank}: gradient of {name} differs from one process")
            seen.add(name)
    assert seen == set(want), f"parameters without a pipeline gradient: {sorted(set(want) - seen)}"
    got = results[results[0].get("last_rank", world_size - 1)]["losses"]
    assert sorted(got) == list(range(len(MICRO_SIZES)))
    for i, loss in enumerate(losses):
        # one micro-batch's loss through the same GPT-2 (N_EMBD = 32, N_LAYER = 4) in stages: only a matmul's blocking
        # may reorder the <= 4 x 32 = 128-term sums, ~sqrt(128) x 2^-24 ~ 7e-7 relative per layer on a loss of ~4.6
        assert abs(got[i] - loss) < 1e-5, f"micro-batch {i}: loss {got[i]} != {loss}"
