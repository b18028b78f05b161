"""Assignment 5.3.5 — sequence parallelism (graded).

* The sequence-dimension operators in the tensor-parallel groups of a (dp 2, tp 2) mesh of 4 processes
  (groups of 2 that are not the world, inputs that differ on every rank:
  :func:`tests.support.tensor_parallel.operator_results`), against closed forms over the rank's group on
  (batch, seq, hidden) tensors (seq = dim 1): scatter keeps this rank's chunk of the
  sequence (backward all-gathers), gather all-gathers (backward reduce-scatters: sums
  the ranks' gradients and keeps this rank's chunk), reduce-scatter sums and keeps this
  rank's chunk (backward all-gathers).
* A sequence-parallel GPT-2 (tp 2 and 4) equals plain TP and the transformers model
  in logits, loss and every gradient (after ``sync_grads``), also for a sequence length
  not divisible by tp; tolerance 1e-5 (float32).
* Its collectives per layer: 2 all-gathers and 2 reduce-scatters forward and backward,
  no all-reduce, and the same ring traffic as plain TP's 2 all-reduces.
"""

import pytest
import torch

from tests.tensor_parallel.test_gpt2 import N_LAYER, assert_matches_transformers, gpt2_case
from tests.support.tensor_parallel import (TP, WORLD, assert_close, case, group_members, group_rank,
                                           operator_results, run_operator)

pytestmark = pytest.mark.a5_3_5

SHAPE = (2, 4, 3)  # (batch, seq, hidden), seq divisible by TP


def _tensor(seed, shape=SHAPE):
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed))


def _chunk(x, rank):
    """Global rank ``rank``'s chunk of the sequence in its tp group."""
    return x.chunk(TP, dim=1)[group_rank(rank)]




def cases(rank, group):
    """This rank's results in ``group`` (run by :func:`tests.support.tensor_parallel.operators_worker`)."""
    from tensor_parallel import mappings as M

    return {
        "scatter": run_operator(lambda x: M.scatter_to_sequence_parallel_region(x, group), _tensor(7),
                                _chunk(_tensor(200 + rank), rank)),
        "gather": run_operator(lambda x: M.gather_from_sequence_parallel_region(x, group),
                               _chunk(_tensor(100 + rank), rank), _tensor(200 + rank)),
        "reduce_scatter": run_operator(lambda x: M.reduce_scatter_to_sequence_parallel_region(x, group),
                                       _tensor(100 + rank), _chunk(_tensor(200 + rank), rank)),
    }


def get(op, rank):
    return case(operator_results(), "sequence", rank, op)


def close(actual, expected, what):
    # scatter/gather move values (exact); the reduce-scatter adds 2 ranks' O(1) values, a two-term sum that is
    # the same in either order: 1e-6 only allows for another order, 2 x 2^-24 x |values < ~4| ~ 5e-7
    assert_close(actual, expected, what, atol=1e-6, rtol=0)


def test_scatter_to_sequence_parallel_region():
    for rank in range(WORLD):
        full_grad = torch.cat([_chunk(_tensor(200 + q), q) for q in group_members(rank)], dim=1)
        r = get("scatter", rank)
        close(r["y"], _chunk(_tensor(7), rank), f"rank {rank}: its chunk of the sequence")
        close(r["grad"], full_grad, f"rank {rank}: backward all-gathers the gradient along the sequence")
        assert (r["forward"], r["backward"]) == ({}, {"all_gather": 1}), (r["forward"], r["backward"])


def test_gather_from_sequence_parallel_region():
    for rank in range(WORLD):
        full = torch.cat([_chunk(_tensor(100 + q), q) for q in group_members(rank)], dim=1)
        grad_sum = sum(_tensor(200 + q) for q in group_members(rank))
        r = get("gather", rank)
        close(r["y"], full, f"rank {rank}: all-gather along the sequence")
        close(r["grad"], _chunk(grad_sum, rank), f"rank {rank}: backward reduce-scatters (sum, own chunk)")
        assert (r["forward"], r["backward"]) == ({"all_gather": 1}, {"reduce_scatter": 1}), (r["forward"], r["backward"])


def test_reduce_scatter_to_sequence_parallel_region():
    for rank in range(WORLD):
        total = sum(_tensor(100 + q) for q in group_members(rank))
        full_grad = torch.cat([_chunk(_tensor(200 + q), q) for q in group_members(rank)], dim=1)
        r = get("reduce_scatter", rank)
        close(r["y"], _chunk(total, rank), f"rank {rank}: sum over ranks, own chunk of the sequence")
        close(r["grad"], full_grad, f"rank {rank}: backward all-gathers along the sequence")
        assert (r["forward"], r["backward"]) == ({"reduce_scatter": 1}, {"all_gather": 1}), (r["forward"], r["backward"])


@pytest.mark.parametrize("tp", [2, 4])
def test_sequence_parallel_gpt2_equals_transformers_and_plain_tp(tp):
    assert_matches_transformers(tp, "sp")
    for rank in range(tp):
        sp, plain = gpt2_case(tp, "sp", rank), gpt2_case(tp, "tp", rank)
        diff = float((sp["logits"] - plain["logits"]).abs().max())
        assert diff <= 1e-5, f"rank {rank}: sequence-parallel logits differ from plain TP by {diff:.2e}"


def test_sequence_parallel_gpt2_in_the_tp_groups_of_a_larger_world():
    """Sequence parallelism at tp = 2 in each of the two tp groups of a 4-rank (dp 2, tp 2) mesh: its all-gathers,
    reduce-scatters and the layer norms' gradient sums stay in the group."""
    assert_matches_transformers(4, "sp-in-tp-groups")
    for rank in range(4):
        sp, plain = gpt2_case(4, "sp-in-tp-groups", rank), gpt2_case(4, "tp-in-tp-groups", rank)
        diff = float((sp["logits"] - plain["logits"]).abs().max())
        assert diff <= 1e-5, f"rank {rank}: sequence-parallel logits differ from plain TP by {diff:.2e}"


def test_sequence_parallel_pads_a_length_not_divisible_by_tp():
    assert_matches_transformers(2, "sp_odd_length")


def test_sequence_parallel_collectives_per_layer():
    for rank in range(TP):
        sp, tp = gpt2_case(TP, "sp", rank)["comm"], gpt2_case(TP, "tp", rank)["comm"]
        for phase in ("forward", "backward"):
            got = sp.get(f"blocks/{phase}", {})
            counts = {kind: int(v["count"]) for kind, v in got.items()}
            assert counts == {"all_gather": 2 * N_LAYER, "reduce_scatter": 2 * N_LAYER}, (
                f"rank {rank}, {phase}: the {N_LAYER} layers did {counts}; expected 2 all-gathers and 2 "
                "reduce-scatters per layer and no all-reduce")
            sp_traffic = sum(v["traffic_bytes"] for v in got.values())
            tp_traffic = tp[f"blocks/{phase}"]["all_reduce"]["traffic_bytes"]
            assert sp_traffic == pytest.approx(tp_traffic), "same ring traffic as plain TP's all-reduces"
