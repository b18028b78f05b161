"""Helpers shared by the tensor-parallel tests.

Each test module launches its worker once (``launch_once``) and its tests read their cases
from the per-rank results. A worker records a case's exception as ``{"error": traceback}``
instead of raising, so one broken case fails its own test, not the whole module.
"""
from __future__ import annotations

import functools
import traceback

import pytest
import torch


def launch_once(worker, world_size: int, timeout: float = 120):
    """A function returning ``launch(worker, world_size)``'s results, computed on first call only."""
    @functools.lru_cache(maxsize=None)
    def results():
        from project.launch import launch

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
    from tensor_parallel.comm import CommCounter

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
