"""Workers of the context-parallel tests (spawned ranks import them by name).

Each worker runs every case in one launch and returns plain results; a case that raises is
recorded as ``{"error": traceback}`` so that it fails its own test, not the whole module.
The global q, k, v and output gradient are drawn from one seed, the same on every rank, so each
rank can compute the single-process reference itself and compare its shard.
"""
from __future__ import annotations

import traceback

import torch
import torch.distributed as dist
import torch.nn.functional as F

from tests.support.planting import planting

SHAPE = (2, 2, 48, 8)  # batch, heads, seq (divisible by 2 cp for cp = 2, 4), head_dim
BLOCK = 5  # a tile size that divides neither the shards nor the chunks


def global_inputs(shape=SHAPE, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(*shape, generator=g) for _ in range(4)]  # q, k, v, grad of the output


def reference(q, k, v, grad, causal: bool, scale: float | None = None):
    leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
    out = F.scaled_dot_product_attention(*leaves, is_causal=causal, scale=scale)
    out.backward(grad)
    return out.detach(), [t.grad for t in leaves]


def cp_groups(rank: int, world_size: int) -> dict:
    """``{2: this rank's pair ([0, 1] or [2, 3]), 4: all four}``: the cp groups of the meshes dp 2 x cp 2 and
    cp 4 (``course.mesh.Mesh``, which names them ``cp`` for the counter)."""
    from course.mesh import Mesh

    return {cp: Mesh.build(dp=world_size // cp, cp=cp).cp_group for cp in (2, 4)}


def _records(recorder) -> list[dict]:
    """The communication an active ``course.trace.Recorder`` saw: one span per call, on course.measure's clock."""
    return [{"kind": s.args["kind"], "peer": s.args["peer"], "bytes": s.args["bytes"], "start": s.start, "end": s.end,
             "traffic": s.args["traffic_bytes"], "group": s.args["group"]} for s in recorder.select("communication")]


def _ring_case(group, layout_kind: str, causal: bool, dtype=torch.float32) -> dict:
    from context_parallel import SequenceLayout, ring_attention
    from course import trace
    from course.collectives import group_rank, group_size

    p, r = group_size(group), group_rank(group)
    q, k, v, grad = (t.to(dtype) for t in global_inputs())
    ref, ref_grads = reference(q, k, v, grad, causal)
    layout = SequenceLayout(layout_kind, p, q.size(2))
    leaves = [layout.shard(t, 2, r).clone().requires_grad_(True) for t in (q, k, v)]
    stats: dict = {}
    recorder = trace.Recorder()
    with trace.recording(recorder):
        out = ring_attention(*leaves, group=group, layout=layout, causal=causal, block_size=BLOCK, stats=stats)
        forward = _records(recorder)
        recorder.clear()
        out.backward(layout.shard(grad, 2, r))
        backward = _records(recorder)
    return {"out": out.detach(), "ref": layout.shard(ref, 2, r),
            "grads": [t.grad for t in leaves], "ref_grads": [layout.shard(g, 2, r) for g in ref_grads],
            "forward_comm": forward, "backward_comm": backward,
            "forward_steps": [{"src": s["src"], "tiles": s["tiles"], "compute": s["compute"]} for s in stats["forward"]],
            "backward_tiles": stats["backward_tiles"], "forward_tiles": stats["forward_tiles"],
            "cp_rank": r, "right": dist.get_global_rank(group, (r + 1) % p), "left": dist.get_global_rank(group, (r - 1) % p)}


def _torch_ring_case(group) -> dict:
    """PyTorch's own ring kernel (``_templated_ring_attention``, head-tail = zig-zag load balance) with the CPU
    flash-attention op, against ours on the same zig-zag shards (forward: it returns the output and lse)."""
    from torch.distributed.tensor.experimental._context_parallel._attention import _cp_options, \
        _templated_ring_attention

    from context_parallel import SequenceLayout, ring_attention
    from course.collectives import group_rank, group_size

    p, r = group_size(group), group_rank(group)
    q, k, v, _ = global_inputs()
    layout = SequenceLayout("zigzag", p, q.size(2))
    shards = [layout.shard(t, 2, r).contiguous() for t in (q, k, v)]
    assert _cp_options.enable_load_balance, "torch's ring kernel balances causal work with head-tail chunks"
    theirs, _lse, *_ = _templated_ring_attention(group, 2, torch.ops.aten._scaled_dot_product_flash_attention_for_cpu,
                                                 *shards, is_causal=True)
    ours = ring_attention(*shards, group=group, layout=layout, causal=True, block_size=BLOCK)
    return {"ours": ours, "theirs": theirs}


def read_case(results: dict, name: str, rank: int) -> dict:
    """Case ``name`` of rank ``rank`` from a worker's results; fails the test with the rank's traceback if it raised."""
    import pytest

    r = results[rank]["cases"][name]
    if "error" in r:
        pytest.fail(f"{name} raised on rank {rank}:\n{r['error']}")
    return r


def assert_equals_reference(r: dict, name: str, rank: int, tol: dict) -> None:
    """A case's output shard and q, k, v gradient shards (``out``, ``grads``) equal the single-process
    ``scaled_dot_product_attention``'s (``ref``, ``ref_grads``) within ``tol``."""
    torch.testing.assert_close(r["out"], r["ref"], **tol, msg=lambda m: f"{name}, rank {rank}, output: {m}")
    for label, got, want in zip("qkv", r["grads"], r["ref_grads"]):
        torch.testing.assert_close(got, want, **tol,
                                   msg=lambda m, n=label: f"{name}, rank {rank}, gradient of {n}: {m}")


def attempt(fn, *args) -> dict:
    """``fn(*args)``, or ``{"error": traceback}`` if it raises — except a deadlock under NCCL's rules, which
    ends the run at once (the ranks' queues are stuck; the launch reports the waiting rank's message)."""
    from course.nccl_rules import NcclRuleError

    try:
        return fn(*args)
    except NcclRuleError:
        raise
    except Exception:  # noqa: BLE001 - reported by the test that reads it
        return {"error": traceback.format_exc()}


def ring_worker(rank: int, world_size: int, planted: str | None = None) -> dict:
    """Ring attention at cp = 2 (two pairs at once) and cp = 4, both layouts, causal and not (and zig-zag causal at
    cp = 2 in float64: ``-float64``); and PyTorch's ring kernel at cp = 4. Returns ``{"nccl_rules": bool, "cases":
    {name: result}}``. ``planted``: with a planted wrong solution (:mod:`tests.support.planting`)."""
    from course import nccl_rules

    torch.set_num_threads(1)
    groups = cp_groups(rank, world_size)
    cases = {}
    with planting(planted):
        for cp in (2, 4):
            for layout in ("contiguous", "zigzag"):
                for causal in (True, False):
                    cases[f"cp{cp}-{layout}-{'causal' if causal else 'full'}"] = attempt(_ring_case, groups[cp],
                                                                                        layout, causal)
        cases["cp2-zigzag-causal-float64"] = attempt(_ring_case, groups[2], "zigzag", True, torch.float64)
        cases["torch-cp4"] = attempt(_torch_ring_case, groups[4])
    return {"nccl_rules": nccl_rules.enabled(), "cases": cases}


class GivenLayout:
    """A layout given by its positions (the Ulysses tests do not depend on 5.7.2's ``chunk_ids``)."""

    def __init__(self, kind: str, p: int, seq_len: int):
        self.kind, self.p, self.seq_len = kind, p, seq_len

    def positions(self, rank: int) -> torch.Tensor:
        s, p = self.seq_len, self.p
        if self.kind == "contiguous":
            return torch.arange(rank * s // p, (rank + 1) * s // p)
        c = s // (2 * p)
        return torch.cat([torch.arange(rank * c, (rank + 1) * c), torch.arange((2 * p - 1 - rank) * c, (2 * p - rank) * c)])

    def shard(self, x: torch.Tensor, dim: int, rank: int) -> torch.Tensor:
        return x.index_select(dim, self.positions(rank))


def _ulysses_case(group, layout_kind: str, causal: bool, scale: float | None = None) -> dict:
    from context_parallel import ulysses_attention
    from course import trace
    from course.collectives import group_rank, group_size

    p, r = group_size(group), group_rank(group)
    q, k, v, grad = global_inputs((2, 4, 24, 8), seed=1)  # 4 heads: divisible by cp = 2 and 4
    ref, ref_grads = reference(q, k, v, grad, causal, scale)
    layout = GivenLayout(layout_kind, p, q.size(2))
    leaves = [layout.shard(t, 2, r).clone().requires_grad_(True) for t in (q, k, v)]
    recorder = trace.Recorder()
    with trace.recording(recorder):
        out = ulysses_attention(*leaves, group=group, layout=None if layout_kind == "contiguous" else layout,
                                causal=causal, scale=scale)
        forward = _records(recorder)
        recorder.clear()
        out.backward(layout.shard(grad, 2, r))
        backward = _records(recorder)
    return {"out": out.detach(), "ref": layout.shard(ref, 2, r), "grads": [t.grad for t in leaves],
            "ref_grads": [layout.shard(g, 2, r) for g in ref_grads], "forward_comm": forward,
            "backward_comm": backward, "local_bytes": leaves[0].numel() * 4}


ULYSSES_SCALE = 1.0  # a factor of the scores other than the default head_dim ** -0.5 (8 ** -0.5 = 0.35)


def ulysses_worker(rank: int, world_size: int, planted: str | None = None) -> dict:
    """Ulysses at cp = 2 (two pairs at once) and cp = 4, contiguous (causal and not) and zig-zag shards, and
    contiguous causal shards with the scores scaled by :data:`ULYSSES_SCALE` (``-scaled``). ``planted``: run
    with a planted wrong solution (``tests/instructor/planted.py``; instructor-only)."""
    torch.set_num_threads(1)
    groups = cp_groups(rank, world_size)
    cases = {}
    with planting(planted):
        for cp in (2, 4):
            for layout, causal in (("contiguous", True), ("contiguous", False), ("zigzag", True)):
                cases[f"cp{cp}-{layout}-{'causal' if causal else 'full'}"] = attempt(_ulysses_case, groups[cp],
                                                                                    layout, causal)
            cases[f"cp{cp}-contiguous-causal-scaled"] = attempt(_ulysses_case, groups[cp], "contiguous", True,
                                                                ULYSSES_SCALE)
    return {"cases": cases}


# ---- GPT-2 (imports transformers) -------------------------------------------------------------------------------

GPT2_CASES = [  # (dp, cp, attention, layout)
    (1, 4, "ring", "zigzag"), (1, 4, "ulysses", "contiguous"), (2, 2, "ring", "contiguous"), (2, 2, "ulysses", "contiguous"),
]
VOCAB, SEQ, BATCH, STEPS = 96, 64, 4, 3


def _batches():
    g = torch.Generator().manual_seed(3)
    out = []
    for _ in range(STEPS):
        ids = torch.randint(3, VOCAB, (BATCH, SEQ), generator=g)
        labels = ids.clone()
        labels[:, :10] = -100  # a "source" without loss
        mask = torch.ones_like(ids)
        mask[1, SEQ - 9:] = 0  # right padding
        ids[1, SEQ - 9:], labels[1, SEQ - 9:] = 0, -100
        out.append({"input_ids": ids, "attention_mask": mask, "labels": labels})
    return out


def _model(seed: int = 0):
    from course.model import build_gpt2

    return build_gpt2("tiny", VOCAB, n_positions=SEQ, dropout=0.0, seed=seed, n_layer=2, n_embd=64)


def _reference(dtype: torch.dtype = torch.float32) -> tuple[list[float], list[torch.Tensor]]:
    """One process, the transformers model as built (eager attention), the whole global batch: the losses
    of the steps and the gradients of the first (in ``dtype``; float64: exact arithmetic to within 2^-53)."""
    from course.loss import lm_loss

    model = _model().to(dtype)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    losses, first_grads = [], None
    for batch in _batches():
        opt.zero_grad()
        loss = lm_loss(model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits,
                       batch["labels"])
        loss.backward()
        first_grads = first_grads or [p.grad.clone() for p in model.parameters()]
        opt.step()
        losses.append(loss.item())
    return losses, first_grads


def _cp_case(dp: int, cp: int, attention: str, layout: str) -> dict:
    from types import SimpleNamespace

    from context_parallel.gpt2 import use_context_parallel_attention
    from context_parallel.training import ContextParallelTraining
    from course.mesh import Mesh
    from course.model import parameter_fingerprint

    mesh = Mesh.build(dp=dp, cp=cp)
    args = SimpleNamespace(batch_size=BATCH, attention=attention, layout=layout, seq_len=SEQ, block_size=16,
                           learning_rate=1e-3, quiet=True, preset="tiny", model_max_length=SEQ, dropout=0.0, seed=0)
    model = use_context_parallel_attention(_model())
    data = SimpleNamespace(tokenizer=SimpleNamespace(pad_id=0), train=[], collate=None)
    mode = ContextParallelTraining(args, data, torch.device("cpu"), model, mesh, rank=mesh.rank,
                                   world_group=mesh.group("world"), show_progress=False)
    losses, first_grads = [], None
    with mode.counter:
        for batch in _batches():
            losses.append(mode.train_step(batch).loss)
            first_grads = first_grads or [p.grad.clone() for p in model.parameters()]  # averaged, before AdamW
    return {"losses": losses, "grads": first_grads,
            "fingerprint": parameter_fingerprint(model), "by_group": mode.counter.by_group(),
            "coordinates": mesh.coordinates._asdict()}


def _evaluation_case() -> dict:
    """The context-parallel model called without a cp attention (evaluation, decoding) equals the eager model on
    the real (non-padding) positions of right-padded sentences."""
    from context_parallel.gpt2 import use_context_parallel_attention

    eager, cp_model = _model(), use_context_parallel_attention(_model())
    batch = _batches()[0]
    with torch.no_grad():
        a = eager(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
        b = cp_model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    real = batch["attention_mask"].bool()
    return {"max_diff": float((a - b)[real].abs().max())}


def gpt2_worker(rank: int, world_size: int) -> dict:
    """The context-parallel training step against one process, for every case of ``GPT2_CASES``."""
    from course.task import worker_env_quiet

    worker_env_quiet()
    torch.set_num_threads(1)
    ref_losses, ref_grads = _reference()
    cases = {}
    for dp, cp, attention, layout in GPT2_CASES:
        name = f"dp{dp}-cp{cp}-{attention}-{layout}"
        cases[name] = attempt(_cp_case, dp, cp, attention, layout)
        if "grads" in cases[name]:
            grads = cases[name].pop("grads")
            cases[name]["max_grad_diff"] = max(float((a - b).abs().max()) for a, b in zip(grads, ref_grads))
            cases[name]["max_grad"] = max(float(b.abs().max()) for b in ref_grads)
    cases["evaluation"] = attempt(_evaluation_case)
    return {"reference_losses": ref_losses, "cases": cases}
