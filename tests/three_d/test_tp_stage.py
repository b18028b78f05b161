"""a5_6_2: a pipeline stage of tensor-parallel GPT-2 blocks, pp 2 x tp 2 on 4 gloo ranks.

The same 1F1B step is run twice, activations sent peer to peer (every tp rank sends the
whole activation to the same tp rank of the next stage) and with Megatron's scatter-gather
(1/tp each, all-gathered in the tp group). Both give the loss and the gradients of one
process's dense GPT-2 (float64, 1e-10), talk only to the same tp rank of the other stage,
and move the bytes counted by hand. With dropout on the embeddings (p = 0.5, every rank and
the one process seeded alike, one micro-batch so the masks have the reference's shape) the
stage still equals one process: the first stage applies its embedding dropout.
"""
from __future__ import annotations

import pytest

from tests.support.three_d import BATCH, N_EMBD, SEQ, compare_grads, dense_reference, layouts_worker

MICRO_BATCHES = 4
CASES = {"peer": dict(dp=1, pp=2, tp=2, micro_batches=MICRO_BATCHES, step=False, scatter_gather=False),
         "scatter_gather": dict(dp=1, pp=2, tp=2, micro_batches=MICRO_BATCHES, step=False, scatter_gather=True),
         "embedding_dropout": dict(dp=1, pp=2, tp=2, micro_batches=1, step=False, scatter_gather=False, embd_pdrop=0.5,
                                   seed=11)}
GRAPHS = ["peer", "scatter_gather"]


@pytest.fixture(scope="module")
def runs():
    from course.launch import launch
    from tests.support.launching import GRADED_COLLECTIVE_TIMEOUT

    out = launch(layouts_worker, 4, list(CASES.values()), timeout=150, collective_timeout=GRADED_COLLECTIVE_TIMEOUT)
    return {name: {rank: r[i] for rank, r in out.items()} for i, name in enumerate(CASES)}


@pytest.mark.a5_6_2
@pytest.mark.timeout(200)
@pytest.mark.parametrize("mode", GRAPHS)
def test_tp_stages_equal_one_process_and_send_to_the_same_tp_rank(runs, mode):
    results = runs[mode]
    reference, loss, _ = dense_reference()
    # float64: sums in another order differ by ~n x 2^-53 ~ 1e-12 of O(1) values, far inside 1e-10
    compare_grads(results, reference, tp=2, atol=1e-10)
    full = (BATCH // MICRO_BATCHES) * SEQ * N_EMBD * 8  # one micro-batch's float64 activation
    sent = full // 2 if mode == "scatter_gather" else full
    for rank, r in results.items():
        stage, _, tp = r["coordinates"]
        if stage == 1:
            assert r["loss"] == pytest.approx(loss, abs=1e-10)
        peer = rank + 2 if stage == 0 else rank - 2  # the same tp rank of the other stage
        assert r["peers"] == [("recv", peer), ("send", peer)], f"rank {rank} talked to {r['peers']}, not rank {peer}"
        pp = r["stage_counts"]["pp"]
        assert pp["send"]["count"] == MICRO_BATCHES and pp["send"]["bytes"] == MICRO_BATCHES * sent, (
            f"rank {rank} sent {pp['send']} across the stage boundary, want {MICRO_BATCHES} x {sent} bytes")
        gathers = r["stage_counts"]["tp"].get("all_gather")
        if mode == "scatter_gather":  # stage 1 gathers each activation forward, stage 0 each gradient backward
            assert gathers == {"count": MICRO_BATCHES, "bytes": MICRO_BATCHES * full, "traffic_bytes": MICRO_BATCHES * full / 2}, gathers
        else:
            assert gathers is None, f"rank {rank}: all-gathers without scatter-gather: {gathers}"


@pytest.mark.a5_6_2
@pytest.mark.timeout(200)
def test_the_first_stage_applies_its_embedding_dropout(runs):
    results = runs["embedding_dropout"]
    reference, loss, _ = dense_reference(embd_pdrop=0.5, seed=11)
    _, loss_without, _ = dense_reference()
    assert abs(loss - loss_without) > 1e-3, "the test's dropout changes nothing"
    compare_grads(results, reference, tp=2, atol=1e-10)
    for r in results.values():
        if r["coordinates"][0] == 1:
            assert r["loss"] == pytest.approx(loss, abs=1e-10), (
                f"loss {r['loss']} with embedding dropout, one process {loss} (without dropout {loss_without}): "
                "apply the stage's dropout to the embeddings' sum")
