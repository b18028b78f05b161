"""Helpers shared by the tensor-parallel tests.

The operator and layer tests of 5.3.1, 5.3.2, 5.3.3 and 5.3.5 read their cases from one launch of
4 ranks (:func:`operator_results`), whose tensor-parallel groups are those of a (dp 2, tp 2) mesh:
every operator runs in a group that is not the world, ranks 2 and 3 being ranks 0 and 1 of theirs, so
that a collective without its group (the world's) or a shard picked by the global rank is seen.
A worker records a case's exception as ``{"error": traceback}`` instead of raising, so one broken
case fails its own test, not the whole module.
"""
from __future__ import annotations

import traceback

import pytest
import torch


TP, WORLD = 2, 4  # the operator tests' groups: tp groups [0, 1] and [2, 3] of a (dp 2, tp 2) mesh


def group_members(rank: int) -> list[int]:
    """The global ranks of ``rank``'s tp group in the operator tests' mesh (tp varies fastest)."""
    return [rank // TP * TP + i for i in range(TP)]


def group_rank(rank: int) -> int:
    """``rank``'s rank in its tp group in the operator tests' mesh."""
    return rank % TP


def operators_worker(rank: int, world_size: int, planted: str | None = None) -> dict:
    """Every operator test module's ``cases(rank, group)`` in this rank's tp group: ``{module: cases}``
    (``{"error": traceback}`` for a module whose cases raised outside an operator). ``planted``: with a planted
    wrong solution (:mod:`tests.support.planting`)."""
    from course.mesh import Mesh
    from tests.support.planting import planting
    from tests.tensor_parallel import test_layers, test_mappings, test_sequence_parallel, test_vocab_parallel

    group = Mesh.build(dp=world_size // TP, tp=TP).tp_group
    out = {}
    with planting(planted):
        for name, module in (("mappings", test_mappings), ("layers", test_layers), ("vocab", test_vocab_parallel),
                             ("sequence", test_sequence_parallel)):
            attempt(out, name, lambda module=module: module.cases(rank, group))
    return out


def operator_results(planted: str | None = None) -> dict:
    """``{rank: {module: cases}}`` of one launch of :func:`operators_worker` (once per session and ``planted``)."""
    from tests.support.launching import launch_once as launch

    return launch(operators_worker, WORLD, planted, timeout=120)


def attempt(out: dict, name: str, fn) -> None:
    """``out[name] = fn()``, or the traceback if it raises."""
    try:
        out[name] = fn()
    except Exception:  # noqa: BLE001 - reported by the test that reads it
        out[name] = {"error": traceback.format_exc()}


def run_operator(fn, x: torch.Tensor, grad_out: torch.Tensor) -> dict:
    """Forward ``fn(x)`` and backward ``grad_out``, counting collectives of each pass.

    Returns ``{"y", "grad", "forward", "backward"}`` or ``{"error": traceback}``.
    """
    from course.collectives import CommCounter

    try:
        x = x.clone().requires_grad_(True)
        with CommCounter() as counter:
            y = fn(x)
            forward = counter.counts()
            counter.reset()
            y.backward(grad_out)
            backward = counter.counts()
        return {"y": y.detach(), "grad": x.grad, "forward": forward, "backward": backward}
    except Exception:  # noqa: BLE001
        return {"error": traceback.format_exc()}


def case(results: dict, name: str, rank: int, op: str | None = None) -> dict:
    """Case ``name`` of rank ``rank`` (its entry ``op``, if given); fails the test with the rank's traceback if it
    raised."""
    r = results[rank][name]
    for where, entry in ((name, r), (f"{name} {op}", r.get(op) if op is not None and "error" not in r else None)):
        if entry is not None and "error" in entry:
            pytest.fail(f"{where} raised on rank {rank}:\n{entry['error']}")
    return r if op is None else r[op]


def assert_close(actual, expected, what: str, atol: float, rtol: float = 0.0) -> None:
    torch.testing.assert_close(actual, expected, atol=atol, rtol=rtol, msg=lambda m: f"{what}: {m}")


def expected_shards(hf, rank: int, tp: int) -> dict:
    """Each tensor-parallel parameter's expected gradient on tp rank ``rank``: the matching shard
    of the transformers model's gradient (``hf`` after its backward), sliced here independently
    of the solution: rank r's Q, K and V rows of ``c_attn``; rows/columns of the MLP;
    vocabulary rows of the tied embedding (padded to a multiple of ``tp``)."""
    tr, H, vocab = hf.transformer, hf.config.n_embd, hf.config.vocab_size
    padded_vocab = -(-vocab // tp) * tp
    h_chunk, f_chunk, v_chunk = H // tp, 4 * H // tp, padded_vocab // tp
    mine = lambda n: slice(rank * n, (rank + 1) * n)  # noqa: E731
    wte = torch.cat([tr.wte.weight.grad, tr.wte.weight.grad.new_zeros(padded_vocab - vocab, H)])
    out = {"wte.weight": wte[mine(v_chunk)], "wpe.weight": tr.wpe.weight.grad,
           "ln_f.weight": tr.ln_f.weight.grad, "ln_f.bias": tr.ln_f.bias.grad}
    for i, block in enumerate(tr.h):
        p = f"h.{i}."
        for ln in ("ln_1", "ln_2"):
            out[p + ln + ".weight"] = getattr(block, ln).weight.grad
            out[p + ln + ".bias"] = getattr(block, ln).bias.grad
        qkv_w, qkv_b = block.attn.c_attn.weight.grad.t(), block.attn.c_attn.bias.grad  # (3H, H): rows [Q; K; V]
        rows = [torch.arange(part * H, (part + 1) * H)[mine(h_chunk)] for part in range(3)]
        out[p + "attn.c_attn.weight"] = torch.cat([qkv_w[r] for r in rows])
        out[p + "attn.c_attn.bias"] = torch.cat([qkv_b[r] for r in rows])
        out[p + "attn.c_proj.weight"] = block.attn.c_proj.weight.grad.t()[:, mine(h_chunk)]
        out[p + "attn.c_proj.bias"] = block.attn.c_proj.bias.grad
        out[p + "mlp.c_fc.weight"] = block.mlp.c_fc.weight.grad.t()[mine(f_chunk)]
        out[p + "mlp.c_fc.bias"] = block.mlp.c_fc.bias.grad[mine(f_chunk)]
        out[p + "mlp.c_proj.weight"] = block.mlp.c_proj.weight.grad.t()[:, mine(f_chunk)]
        out[p + "mlp.c_proj.bias"] = block.mlp.c_proj.bias.grad
    return out
