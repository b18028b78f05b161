"""Ungraded: the top-k reducer sums the ranks' (index, value) pairs in rank order, so every replica gets the same
bits (the README promises ``param_sha256`` equal on every rank).

One ``index_add_`` of every rank's pairs concatenated adds a coordinate chosen by several ranks with CUDA
atomics, in an order that varies between runs and ranks: with dp >= 3 the replicas drift apart in the last
bits. On the CPU ``index_add_`` happens to add in index order, so that failure cannot be reproduced here;
what is checked instead is the property that rules it out — the sum is exactly the rank-ordered one,
``((v_0 + v_1) + v_2)``, bitwise, on every rank — with values for which another order gives other bits
(planted: a reversed and a shuffled order are rejected). On GPUs ``tests/gpu/test_communication_nccl.py``
(``test_topk_with_error_feedback_on_nccl``, 3 ranks when the machine has them) checks the same on NCCL.
"""
import pytest
import torch

from course.launch import launch

# float32: -1e8 + 1 rounds back to -1e8 (the spacing of float32 at 1e8 is 8), so the order of the three
# additions decides the result: rank order (1e8 - 1e8) + 1 = 1, reversed (1 - 1e8) + 1e8 = 0.
ORDER_MATTERS = [torch.tensor([1e8, 5.0]), torch.tensor([-1e8, 7.0]), torch.tensor([1.0, 11.0])]


def _parts():
    """Three ranks' top-k: coordinate 3 chosen by all three, 0 and 5 by one each (distinct indices per rank)."""
    return [(torch.tensor([3, 0]), ORDER_MATTERS[0]), (torch.tensor([3, 5]), ORDER_MATTERS[1]),
            (torch.tensor([3, 1]), ORDER_MATTERS[2])]


def _check_rank_order(topk_sum) -> None:
    like = torch.zeros(2, 3)
    got = topk_sum(_parts(), like)
    want = torch.zeros(6)
    want[3] = (ORDER_MATTERS[0][0] + ORDER_MATTERS[1][0]) + ORDER_MATTERS[2][0]  # rank order: 1.0
    want[0], want[5], want[1] = 5.0, 7.0, 11.0
    assert got.shape == like.shape and got.dtype == like.dtype
    assert torch.equal(got.reshape(-1), want), f"not the rank-ordered sum: {got.reshape(-1)} != {want}"


def test_topk_sum_adds_the_ranks_in_rank_order():
    from communication.compression import topk_sum

    _check_rank_order(topk_sum)


def _reversed(parts, like):
    out = torch.zeros(like.numel(), dtype=like.dtype)
    for indices, values in reversed(parts):
        out[indices] += values
    return out.view_as(like)


def _atomics_like(parts, like):
    """What CUDA's index_add_ may do: the repeated coordinate's additions in another order (here: shuffled)."""
    indices, values = torch.cat([i for i, _ in parts]), torch.cat([v for _, v in parts])
    order = torch.tensor([2, 4, 0, 1, 3, 5])  # coordinate 3's additions (positions 0, 2, 4): ranks 1, 2, then 0
    return torch.zeros(like.numel(), dtype=like.dtype).index_add_(0, indices[order], values[order]).view_as(like)


@pytest.mark.parametrize("wrong", [_reversed, _atomics_like])
def test_the_rank_order_check_rejects_other_orders(wrong):
    with pytest.raises(AssertionError, match="rank-ordered"):
        _check_rank_order(wrong)


def reducer_worker(rank: int, world_size: int) -> dict:
    """One top-k step on 3 ranks whose gradients differ by orders of magnitude (so the order of the sum shows)."""
    from communication.compression import TopKReducer

    torch.manual_seed(0)
    model = torch.nn.Linear(8, 4)
    g = torch.Generator().manual_seed(100 + rank)
    for p in model.parameters():  # rank r's gradient of scale 10^(4 (r - 1)): 1e-4, 1, 1e4
        p.grad = torch.randn(p.shape, generator=g) * 10.0 ** (4 * (rank - 1))
    local = [p.grad.clone() for p in model.parameters()]
    reducer = TopKReducer(model, group=None, ratio=0.5)
    reducer.before_backward()
    reducer.finish()
    return {"local": local, "synced": [p.grad.clone() for p in model.parameters()]}


@pytest.mark.needs_solution  # topk_compress is assignment 5.4.3's
@pytest.mark.timeout(120)
def test_three_replicas_get_the_same_bits_the_rank_ordered_sum():
    from communication.compression import topk_compress

    out = launch(reducer_worker, 3, timeout=90)
    differs = False
    for j, synced in enumerate(out[0]["synced"]):
        for rank in (1, 2):
            assert torch.equal(out[rank]["synced"][j], synced), f"parameter {j}: rank {rank}'s gradient != rank 0's"
        parts = [topk_compress(out[r]["local"][j], torch.zeros_like(synced), 0.5)[:2] for r in range(3)]
        want = torch.zeros(synced.numel())
        for indices, values in parts:
            want[indices] += values
        assert torch.equal(synced.reshape(-1), want / 3), f"parameter {j}: not the rank-ordered sum / 3"
        differs |= not torch.equal(_reversed(parts, synced), want.view_as(synced))
    assert differs, "the gradients must be such that another order of the sum gives other bits"
