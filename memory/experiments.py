"""Workers that notebooks/05_memory.ipynb (and ``project/run_data_parallel.py --memory_report``) launch.

:func:`memory_breakdown` trains a GPT-2 built from a config (random tokens, no data files)
for a few steps with each ZeRO stage in turn, on every rank of a dp group, and measures on
each rank:

* the bytes of parameters, gradients and optimizer state held at the optimizer step (after
  the gradient reduction, before the update), counted by storage
  (:func:`memory.accounting.storage_bytes`), next to the ZeRO formulas;
* the activation bytes autograd saved in the forward pass (:class:`memory.accounting.SavedTensorBytes`);
* the communication per step and rank (:class:`course.collectives.CommCounter`, ring traffic);
* the step time (median, min, max over the timed steps after one warm-up step; the clock read after the
  device's queued work, :func:`course.measure.now`) and the peak memory of the timed steps
  (:class:`course.measure.MemoryMeter`: ``torch.cuda.max_memory_allocated`` on a GPU, the process's peak
  RSS on the CPU; ``timer`` and ``memory`` in the result name them).

The model and the batches live on the rank's device (``course.launch.context().device``; the CPU in a
single process).
"""
from __future__ import annotations

import torch

from course.collectives import CommCounter
from course.measure import MemoryMeter, Stopwatch
from memory.accounting import SavedTensorBytes, peak_rss_bytes, storage_bytes, zero_formula_bytes  # noqa: F401 (notebook)
from course.loss import model_loss
from memory.training import ShardedStep, autocast


def _device():
    """The rank's device inside a launched worker, else the CPU."""
    from course.launch import context

    try:
        return context().device
    except RuntimeError:
        return torch.device("cpu")


def random_batch(step: int, batch_size: int, seq_len: int, vocab_size: int, dp_rank: int = 0, device="cpu") -> dict:
    """A batch of random tokens in the course's batch format (``input_ids``, ``attention_mask``, ``labels``),
    drawn on the host (the same tokens on every device) and put on ``device``."""
    g = torch.Generator().manual_seed(1000 * step + dp_rank)
    ids = torch.randint(0, vocab_size, (batch_size, seq_len), generator=g, device="cpu").to(device)
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids.clone()}


def build_tiny_gpt2(preset: str = "tiny", vocab_size: int = 1000, n_positions: int = 64, dropout: float = 0.0,
                    seed: int = 0, **overrides):
    from course.model import build_gpt2

    return build_gpt2(preset, vocab_size, n_positions=n_positions, dropout=dropout, seed=seed, **overrides)


def measure_stage(model, zero: int, group, *, steps: int = 3, batch_size: int = 4, seq_len: int = 64,
                  vocab_size: int = 1000, checkpointing: bool = False, precision: str = "fp32",
                  lr: float = 1e-3, timed_comm: bool = False) -> dict:
    """Train ``steps`` steps (+1 warm-up) with ZeRO ``zero`` and measure (see the module docstring). With
    ``timed_comm`` the result's ``comm_seconds`` lists, per timed step, the seconds spent in communication
    calls per group (:meth:`course.collectives.CommCounter.seconds_by_group`)."""
    from course.collectives import group_rank, group_size

    dp, rank = group_size(group), group_rank(group)
    device = next(model.parameters()).device
    n_params = sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())
    sharded = ShardedStep(model, zero, group, torch.optim.Adam, activation_checkpointing=checkpointing,
                          precision=precision, lr=lr)
    params_ = [p for p in model.parameters()]
    times, held, saved, losses, peak, comm_seconds = [], None, None, [], 0, []
    with CommCounter(timed=timed_comm) as counter:
        for step in range(steps + 1):
            batch = random_batch(step, batch_size, seq_len, vocab_size, rank, device)
            counter.reset()
            with Stopwatch(device) as clock, MemoryMeter(device) as memory:
                sharded.end_evaluation()
                sharded.optimizer.zero_grad(set_to_none=True)
                with SavedTensorBytes(exclude=params_ + list(sharded.category_tensors()["params"])) as s:
                    with autocast(device, precision):
                        loss = model_loss(model, batch)
                loss.backward()
                sharded.reduce_gradients()
                held = {k: storage_bytes(v) for k, v in sharded.category_tensors().items()}
                sharded.optimizer.step()
            times.append(clock.seconds)
            if step:  # the timed steps
                peak = max(peak, memory.peak_bytes)
                comm_seconds.append(counter.seconds_by_group())
            losses.append(loss.item())
            saved = s.activation_bytes
            comm = counter.summary()
    formula = zero_formula_bytes(zero, n_params, dp)
    timed = sorted(times[1:])
    return {"zero": zero, "dp": dp, "n_params": n_params, "held": held, "formula": formula,
            "bytes_per_param": {k: v / n_params for k, v in held.items()},
            "formula_bytes_per_param": {k: v / n_params for k, v in formula.items()},
            "activation_bytes": saved, "comm": comm,
            "comm_traffic_bytes": sum(v["traffic_bytes"] for v in comm.values()),
            "step_time_median": timed[len(timed) // 2], "step_time_min": timed[0], "step_time_max": timed[-1],
            "peak_rss_bytes": peak_rss_bytes(), "peak_memory_bytes": peak, "memory": memory.measure,
            "timer": clock.timer, "comm_seconds": comm_seconds, "losses": losses, "checkpointing": checkpointing, "precision": precision}


def memory_breakdown(rank: int, world_size: int, stages=(0, 1, 2, 3), steps: int = 3, preset: str = "tiny",
                     vocab_size: int = 1000, seq_len: int = 64, batch_size: int = 4, checkpointing=(False,),
                     precision: str = "fp32", model_overrides: dict | None = None) -> list[dict]:
    """Worker: for each ZeRO stage (and each ``checkpointing`` setting), a fresh GPT-2 and
    :func:`measure_stage` over the world as the dp group. Returns this rank's measurements."""
    from course.task import worker_env_quiet

    worker_env_quiet()
    out = []
    for ckpt in checkpointing:
        for zero in stages:
            model = build_tiny_gpt2(preset, vocab_size, seq_len, **(model_overrides or {})).to(_device())
            out.append(measure_stage(model, zero, None, steps=steps, batch_size=batch_size, seq_len=seq_len,
                                     vocab_size=vocab_size, checkpointing=ckpt, precision=precision))
    return out


def precision_curves(steps: int = 30, precisions=("fp32", "bf16"), n_batches: int = 4, batch_size: int = 8,
                     seq_len: int = 32, vocab_size: int = 500, lr: float = 3e-3, **model_overrides) -> dict:
    """In this process (one rank, no process group): the training loss per step of the same GPT-2
    (same initial weights) on the same ``n_batches`` random batches, cycled, for each precision.

    Returns ``{precision: [loss per step]}``; ``"bf16"`` autocasts the forward and backward to
    bfloat16 with fp32 weights, gradients and Adam state (:class:`memory.training.ShardedStep`).
    """
    overrides = dict(n_layer=2, **model_overrides)
    batches = [random_batch(i, batch_size, seq_len, vocab_size) for i in range(n_batches)]
    out = {}
    for precision in precisions:
        model = build_tiny_gpt2("tiny", vocab_size, seq_len, **overrides)
        step = ShardedStep(model, 0, None, torch.optim.Adam, precision=precision, lr=lr)
        out[precision] = [step.train_step(batches[i % n_batches], "cpu").loss for i in range(steps)]
    return out
