"""Helpers shared by the tensor-parallel tests.

Each test module launches its worker once (``launch_once``) and its tests read their cases
from the per-rank results. A worker records a case's exception as ``{"error": traceback}``
instead of raising, so one broken case fails its own test, not the whole module.
"""
from __future__ import annotations

import traceback

import pytest
import torch


def launch_once(worker, world_size: int, timeout: float = 120):
    """A function returning ``launch(worker, world_size)``'s results, launched on the first call only
    (a failed launch is not started again: :func:`tests.support.launching.launch_once`)."""
    def results():
        from tests.support.launching import launch_once as launch

        return launch(worker, world_size, timeout=timeout)
    return results


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


def case(results: dict, name: str, rank: int) -> dict:
    """Case ``name`` of rank ``rank``; fails the test with the rank's traceback if it raised."""
    r = results[rank][name]
    if "error" in r:
        pytest.fail(f"{name} raised on rank {rank}:\n{r['error']}")
    return r


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
