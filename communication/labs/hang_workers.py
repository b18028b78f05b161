"""Runs that hang, for notebooks/10_debugging_hangs.ipynb and the tests of assignment 5.4.4.

Each ``planted_*`` worker carries one of the desynchronisations that hang a training run: run it with the flight
recorder on (:func:`run_planted`), then read the dumps with :func:`communication.hang_lab.diagnose`.
``mystery_metrics`` hides one more, for the notebook's exercise; ``healthy_step`` and ``healthy_uneven_all_to_all``
do not hang. Every operation names its group; the tensors are small host tensors (gloo), so the lab runs on a
laptop. Workers take ``(rank, world_size, collective_timeout)``.
"""
from __future__ import annotations

import datetime
import os
import re
from pathlib import Path

import torch
import torch.distributed as dist

def _world():
    return dist.group.WORLD


def planted_early_stop(rank: int, world_size: int, collective_timeout: float) -> int:
    """Each rank stops training when *its own* loss falls below 0.2 — rank 1's data is easier, so it leaves the loop
    two steps before rank 0 and never posts the gradient all-reduce rank 0 then waits in. Returns the steps run."""
    grad = torch.ones(8, device="cpu")
    steps = 0
    for step in range(4):
        local_loss = (1.0 if rank == 0 else 0.5) / (step + 1)
        if local_loss < 0.2:  # the bug: a decision taken on one rank's own numbers
            break
        dist.all_reduce(grad, group=_world())
        steps += 1
    return steps


def planted_receive_first(rank: int, world_size: int, collective_timeout: float) -> None:
    """Two ranks swap a tensor, each receiving before it sends: each waits for a message the other sends only
    after its own receive — crossed orders, a deadlock on every back-end."""
    peer = 1 - rank
    inbox = torch.empty(4, device="cpu")
    dist.all_reduce(torch.ones(1, device="cpu"), group=_world())  # a collective that matches, before the swap
    dist.recv(inbox, peer, group=_world())
    dist.send(torch.full((4,), float(rank), device="cpu"), peer, group=_world())


def planted_wrong_group(rank: int, world_size: int, collective_timeout: float) -> None:
    """Three ranks: ranks 0 and 1 form a tensor-parallel group ``tp`` and sum an activation in it, then every rank
    sums a gradient over the world. Rank 1 passes the world group instead of ``tp``."""
    tp = dist.new_group([0, 1], timeout=datetime.timedelta(seconds=collective_timeout), group_desc="tp")
    x = torch.ones(8, device="cpu")
    dist.all_reduce(torch.ones(1, device="cpu"), group=_world())  # a world collective that matches, before the bug
    if rank in (0, 1):
        group = tp if rank == 0 else _world()  # the bug: rank 1 sums its activation over the world
        dist.all_reduce(x, group=group)
    dist.all_reduce(x, group=_world())


def planted_crossed_sizes(rank: int, world_size: int, collective_timeout: float) -> None:
    """A two-stage pipeline step: stage 0 sends its activation (4 numbers) and then a gradient of the tied
    embedding (8 numbers) to stage 1, which receives the gradient first. NCCL matches messages by order alone,
    so the first message meets a receive of the wrong size (run under the NCCL rules, :mod:`course.nccl_rules`:
    on plain gloo the wrong size ends a rank with an abort, or fills the buffer halfway without a word)."""
    dist.all_reduce(torch.ones(1, device="cpu"), group=_world())
    if rank == 0:
        dist.send(torch.ones(4, device="cpu"), 1, group=_world())       # activation
        dist.send(torch.ones(8, device="cpu"), 1, group=_world())       # gradient of the tied embedding
    else:
        gradient, activation = torch.empty(8, device="cpu"), torch.empty(4, device="cpu")
        dist.recv(gradient, 0, group=_world())            # the bug: the gradient is received first
        dist.recv(activation, 0, group=_world())


def healthy_step(rank: int, world_size: int, collective_timeout: float) -> None:
    """A step that does not hang, on three ranks, for comparison: a world all-reduce, a ``tp`` group of ranks 0 and
    1 whose all-reduce rank 0 posts while its world all-reduce is still running (so the two ranks' lists hold the
    groups in different orders), and a pipeline 0 -> 1 -> 2 and back (so each rank numbers its sends and receives
    its own way)."""
    tp = dist.new_group([0, 1], timeout=datetime.timedelta(seconds=collective_timeout), group_desc="tp")
    dist.all_reduce(torch.ones(2, device="cpu"), group=_world())
    x = torch.ones(8, device="cpu")
    if rank == 0:
        pending = dist.all_reduce(torch.ones(4, device="cpu"), group=_world(), async_op=True)
        dist.all_reduce(x, group=tp)
        pending.wait()
    elif rank == 1:
        dist.all_reduce(x, group=tp)
        dist.all_reduce(torch.ones(4, device="cpu"), group=_world())
    else:
        dist.all_reduce(torch.ones(4, device="cpu"), group=_world())
    activation, gradient = torch.empty(3, device="cpu"), torch.empty(3, device="cpu")
    if rank > 0:
        dist.recv(activation, rank - 1, group=_world())
    if rank < world_size - 1:
        dist.send(torch.ones(3, device="cpu"), rank + 1, group=_world())
        dist.recv(gradient, rank + 1, group=_world())
    if rank > 0:
        dist.send(torch.ones(3, device="cpu"), rank - 1, group=_world())
    dist.barrier(group=_world())


PLANTED = {
    "early_stop": (planted_early_stop, 2),
    "receive_first": (planted_receive_first, 2),
    "wrong_group": (planted_wrong_group, 3),
    "crossed_sizes": (planted_crossed_sizes, 2),
}


def mystery_metrics(rank: int, world_size: int, collective_timeout: float) -> dict[str, float]:
    """The end of an evaluation: every rank computes its metrics and averages each over the world. (There is a bug
    in here: find it with the flight recorder.) Returns the averaged metrics."""
    metrics = {"loss": 2.0 + rank, "tokens": 100.0 * (rank + 1)}
    if rank == 0:  # only rank 0 decodes the test sentences
        metrics["bleu"] = 31.5
    averaged = {}
    for name in sorted(metrics):
        value = torch.tensor([metrics[name]], dtype=torch.float64, device="cpu")
        dist.all_reduce(value, group=_world())
        averaged[name] = value.item() / world_size
    return averaged


# Bugs of messages run under the NCCL rules (course.nccl_rules): on plain gloo a receive into a buffer of another byte
# count may complete without a word (or abort), where NCCL reads the wrong bytes or waits; and a rank waiting for a
# message waits in Python there, so it dumps as soon as the launcher stops it.
MESSAGE_BUGS = {"crossed_sizes", "mistyped_message", "undumped_rank"}


def run_planted(name: str, run_dir: str | Path, collective_timeout: float = 4.0, timeout: float = 120.0):
    """Run the planted bug ``name`` (a key of :data:`PLANTED`, ``"unmatched_send"``, ``"mistyped_message"``,
    ``"undumped_rank"``, ``"mystery_metrics"``, or the healthy ``"healthy_step"`` or ``"uneven_all_to_all"``) with the
    flight recorder on, dumps in ``run_dir``; returns the :class:`course.launch.RankFailure` the hang ends with (None
    if it ran through). ``collective_timeout`` (seconds) is how long a rank waits in a collective before it raises
    and dumps.

    Raises:
        ValueError: an unknown name (before any process starts).
    """
    from course import nccl_rules
    from course.flight_recorder import launch_recorded
    from course.launch import RankFailure

    runs = dict(PLANTED, unmatched_send=(planted_unmatched_send, 2), mistyped_message=(planted_mistyped_message, 2),
                undumped_rank=(planted_undumped_rank, 3), mystery_metrics=(mystery_metrics, 2),
                healthy_step=(healthy_step, 3), uneven_all_to_all=(healthy_uneven_all_to_all, 2))
    if name not in runs:
        raise ValueError(f"unknown planted bug {name!r}; choose one of {sorted(runs)}")
    worker, world_size = runs[name]
    rules = name in MESSAGE_BUGS and not nccl_rules.enabled()
    if rules:  # NCCL's matching of messages, emulated: a wrong size or dtype raises, an unmatched send blocks
        os.environ[nccl_rules.ENV], os.environ[nccl_rules.TIMEOUT_ENV] = "1", str(collective_timeout)
    try:
        launch_recorded(worker, world_size, collective_timeout, run_dir=run_dir, device="cpu",
                        timeout=timeout, collective_timeout=collective_timeout)
    except RankFailure as failure:
        return failure
    finally:
        if rules:
            del os.environ[nccl_rules.ENV], os.environ[nccl_rules.TIMEOUT_ENV]
    return None


def launcher_report(failure) -> str:
    """The launcher's account of a failed run (a :class:`course.launch.RankFailure`) in short: its first line, the
    lines that say where each rank waited, and the line naming the dumps — with this machine's folders left out."""
    root = str(Path(__file__).resolve().parents[2]) + os.sep
    if failure is None:
        return "the run ended normally"
    lines = str(failure).splitlines()
    keep = [lines[0]] + [ln for ln in lines[1:] if ln.startswith(("  rank ", "flight recorder:", "Where each rank"))
                         or ln.startswith("rank(s) ")]
    text = "\n".join(keep).replace(root, "")
    if ":" in keep[0] and not keep[0].rstrip().endswith(":"):
        return text
    error = next((ln for ln in reversed(lines) if re.match(r"^[\w.]+(Error|Exception): ", ln)), "")
    error = re.sub(r"\[/[^\]]*\]\s*", "", error.replace(root, "")).split(". ")[0]  # first sentence, no gloo source
    return text.replace(keep[0], keep[0] + " " + error, 1)


def fr_trace_summary(run_dir: str | Path, timeout: float = 120.0) -> str:
    """What torch's analyser (``python -m torch.distributed.flight_recorder.fr_trace``, alias ``torchfrtrace``) says of
    the torch-format dumps of a recorded run (``run_dir/torch``): its lines about the collectives it could not
    match, without the stack traces (which hold this machine's folders)."""
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-m", "torch.distributed.flight_recorder.fr_trace", str(Path(run_dir) / "torch")],
                         capture_output=True, text=True, timeout=timeout)
    keep = ("Not all ranks", "Collective ", "group info", "collective:", "missing ranks", "input sizes", "expected ranks",
            "error msg", "Culprit", "sequence number")
    lines = [ln for ln in (out.stdout + out.stderr).splitlines() if ln.strip().startswith(keep)]
    return "\n".join(lines) if lines else "fr_trace found every collective joined by all of its ranks"


def straggler_steps(rank: int, world_size: int, slow_rank: int = 1, compute_s: float = 0.05, extra_s: float = 0.05,
                    steps: int = 4) -> list[dict]:
    """Data-parallel steps with one straggler: every rank "computes" ``compute_s`` seconds per step (a sleep: a stand-in
    for a device busy computing, which takes no CPU core), ``slow_rank`` ``extra_s`` seconds more, then every rank
    all-reduces a gradient over the world. Nothing hangs and every collective matches — the flight recorder would show
    nothing wrong — but the others wait inside every all-reduce for the slow rank.

    Returns per step ``{"step", "compute_s", "wait_s"}`` of this rank (``wait_s``: the seconds inside the all-reduce,
    on :func:`course.measure.now`'s clock).
    """
    import time

    from course.measure import now

    grad = torch.ones(1024, device="cpu")
    dist.barrier(group=_world())
    out = []
    for step in range(steps):
        start = now()
        time.sleep(compute_s + (extra_s if rank == slow_rank else 0.0))
        mid = now()
        dist.all_reduce(grad, group=_world())
        out.append({"step": step, "compute_s": mid - start, "wait_s": now() - mid})
    return out


def silent_divergence(rank: int, world_size: int, steps: int = 3) -> list[dict]:
    """Data parallelism with a parameter left out of the gradient averaging: a small model of a weight and a bias,
    the same initial values on every rank, a different batch per rank; every step all-reduces (averages) the weight's
    gradient — but not the bias's (the bug: the list of parameters to average was taken before the bias was added).
    Every rank posts the same collectives, so nothing hangs and nothing is reported; the replicas' biases drift apart.

    Returns per step ``{"step", "max_diff": {parameter: largest |difference| between the ranks' values}}`` (the same
    on every rank: the ranks' parameters are gathered and compared after every step).
    """
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    averaged = [model.weight]  # the bug: model.bias is missing
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(100 + rank)  # each rank its own batch
    out = []
    for step in range(1, steps + 1):
        x, y = torch.randn(8, 4, generator=g, device="cpu"), torch.randn(8, 1, generator=g, device="cpu")
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        for p in averaged:
            dist.all_reduce(p.grad, group=_world())
            p.grad /= world_size
        opt.step()
        values = [None] * world_size
        dist.all_gather_object(values, {n: p.detach().clone() for n, p in model.named_parameters()}, group=_world())
        out.append({"step": step, "max_diff": {n: max(float((v[n] - values[0][n]).abs().max()) for v in values)
                                               for n in values[0]}})
    return out


# ---- desynchronisations of messages, and a healthy uneven all-to-all (the graded dumps of assignment 5.4.4) ------

def planted_unmatched_send(rank: int, world_size: int, collective_timeout: float) -> None:
    """A two-stage pipeline step whose stages count their micro-batches each from its own share of the batch: stage
    0 holds 6 rows and sends 3 micro-batches of 2, stage 1 holds 5 and receives 2, then both average the loss over
    the world. Stage 0's third send meets no receive and blocks there (gloo's send waits for its receive, as NCCL's
    does for a message larger than its buffers), and stage 1 waits in the all-reduce stage 0 never reaches."""
    dist.all_reduce(torch.ones(1, device="cpu"), group=_world())
    rows = 6 if rank == 0 else 5  # the bug: a count each rank works out from its own data
    for _ in range(rows // 2):
        if rank == 0:
            dist.send(torch.ones(2, device="cpu"), 1, group=_world())
        else:
            dist.recv(torch.empty(2, device="cpu"), 0, group=_world())
    dist.all_reduce(torch.ones(1, device="cpu"), group=_world())


def planted_mistyped_message(rank: int, world_size: int, collective_timeout: float) -> None:
    """A two-stage pipeline step: stage 0 computes in float32 and sends its activation (4 numbers); stage 1 makes its
    receive buffer in the dtype of its own configuration, float64. The element counts agree, the bytes do not (16
    against 32): NCCL would read the wrong bytes or wait for the rest (run under the NCCL rules, which compare
    sizes and dtypes: on plain gloo the receive fills half its buffer and the run goes on without a word)."""
    dist.all_reduce(torch.ones(1, device="cpu"), group=_world())
    if rank == 0:
        dist.send(torch.ones(4, dtype=torch.float32, device="cpu"), 1, group=_world())
    else:
        dist.recv(torch.empty(4, dtype=torch.float64, device="cpu"), 0, group=_world())  # the bug: another dtype


def planted_undumped_rank(rank: int, world_size: int, collective_timeout: float) -> None:
    """A three-stage pipeline 0 -> 1 -> 2 and back, whose last stage is killed in its forward pass (SIGKILL, as the
    kernel's out-of-memory killer ends a process) after it received its activation: it leaves no dump. Stage 1 waits
    for its gradient from stage 2, stage 0 for its gradient from stage 1 (run under the NCCL rules, so that the
    survivors wait in Python and dump when the launcher stops them)."""
    import signal

    dist.all_reduce(torch.ones(1, device="cpu"), group=_world())
    activation, gradient = torch.empty(3, device="cpu"), torch.empty(3, device="cpu")
    if rank > 0:
        dist.recv(activation, rank - 1, group=_world())
    if rank == world_size - 1:
        os.kill(os.getpid(), signal.SIGKILL)  # out of memory in the forward pass: no dump, no Python cleanup
    dist.send(torch.ones(3, device="cpu"), rank + 1, group=_world())
    dist.recv(gradient, rank + 1, group=_world())
    if rank > 0:
        dist.send(torch.ones(3, device="cpu"), rank - 1, group=_world())


def healthy_uneven_all_to_all(rank: int, world_size: int, collective_timeout: float) -> list[int]:
    """A mixture-of-experts layer's dispatch and combine on two ranks, one expert each, which does not hang: each
    rank routes its tokens (rows of 4 numbers) to the experts of its choice, so the ranks send each other different
    numbers of rows — rank 0 keeps 1 and sends 3, rank 1 sends 2 and keeps 1. The counts go first (an even
    all-to-all), then the tokens and back (uneven all-to-alls, each rank's sizes its own by design), then the
    experts' gradients are averaged. Returns the rows this rank's expert received."""
    counts = torch.tensor([[1, 3], [2, 1]][rank], device="cpu")  # rows for expert 0, expert 1
    received = torch.empty_like(counts)
    dist.all_to_all_single(received, counts, group=_world())
    send, recv = counts.tolist(), received.tolist()
    tokens = torch.ones(sum(send), 4, device="cpu")
    expert_in = torch.empty(sum(recv), 4, device="cpu")
    dist.all_to_all_single(expert_in, tokens, recv, send, group=_world())  # dispatch
    combined = torch.empty(sum(send), 4, device="cpu")
    dist.all_to_all_single(combined, expert_in * 2, send, recv, group=_world())  # combine: the splits swapped
    dist.all_reduce(torch.ones(8, device="cpu"), group=_world())
    return recv
