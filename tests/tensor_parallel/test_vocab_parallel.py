"""Assignment 5.3.3 — VocabParallelEmbedding and vocabulary-parallel cross-entropy (graded).

In the tensor-parallel groups of a (dp 2, tp 2) mesh of 4 real processes (groups of 2 that are not the world:
:func:`tests.support.tensor_parallel.operator_results`; every rank has the same inputs, so a sum or a max taken
over the world instead of the group is seen):

* ``VocabParallelEmbedding`` built from an ``nn.Embedding``'s weight gives the same
  output, and each rank's weight gradient equals its rows of ``nn.Embedding``'s, for ids
  in every rank's range (including the first and last id of each range).
* ``vocab_parallel_cross_entropy`` on each rank's slice of the logits equals
  ``F.cross_entropy(reduction="none", ignore_index=-100)`` in values and in the gradient
  of the logits, with targets in every rank's range, ignored targets, and logits as large
  as 1e4 (an unshifted softmax overflows there). It communicates only all-reduces of
  per-token scalars in the forward pass and nothing in the backward pass.
* ``vocab_parallel_lm_loss`` equals the course's ``course.loss.lm_loss``.

Tolerance: float32, atol/rtol 1e-5: the vocab-parallel loss takes a max and a sum of exponentials over
VOCAB = 12 logits in two halves (two partial sums all-reduced: another order) and a log: <= 12 x 2^-24 ~
7e-7 relative on the sum, ~1e-6 on a loss of O(3), a factor of 10 below the tolerance.
"""
import traceback

import pytest
import torch
import torch.nn.functional as F
from tests.support.tensor_parallel import TP, WORLD, assert_close, case, group_rank, operator_results

pytestmark = pytest.mark.a5_3_3

VOCAB, DIM = 12, 5
# Every id of the vocabulary, so the boundaries 0, 5 | 6, 11 of both ranks' ranges are covered.
IDS = torch.tensor([[0, 5, 6, 11, 3, 9], [11, 10, 1, 6, 5, 0], [7, 7, 2, 8, 4, 6]])
TARGETS = torch.tensor([0, 5, 6, 11, -100, 3, 9, -100, 2, 7])


def _gen(seed):
    return torch.Generator().manual_seed(seed)


def embedding_weight():
    return torch.randn(VOCAB, DIM, generator=_gen(0))


def embedding_upstream():
    return torch.randn(*IDS.shape, DIM, generator=_gen(1))


def logits(scale):
    return torch.randn(len(TARGETS), VOCAB, generator=_gen(2)) * scale


def loss_upstream():
    return torch.rand(len(TARGETS), generator=_gen(3)) + 0.5


def lm_inputs():
    logit = torch.randn(2, 7, VOCAB, generator=_gen(4))
    labels = torch.randint(0, VOCAB, (2, 7), generator=_gen(5))
    labels[:, :3] = -100  # the source part
    labels[1, 6] = -100   # padding
    return logit, labels


def cases(rank, group):
    """This rank's results in ``group`` (run by :func:`tests.support.tensor_parallel.operators_worker`)."""
    from course.collectives import CommCounter, group_rank as rank_in, group_size
    from tensor_parallel.vocab import VocabParallelEmbedding, vocab_parallel_cross_entropy, vocab_parallel_lm_loss

    chunk = VOCAB // group_size(group)
    mine = slice(rank_in(group) * chunk, (rank_in(group) + 1) * chunk)
    out = {}
    try:
        emb = VocabParallelEmbedding(VOCAB, DIM, master_weight=embedding_weight(), group=group)
        y = emb(IDS)
        y.backward(embedding_upstream())
        out["embedding"] = {"y": y.detach(), "w": emb.weight.grad}
    except Exception:  # noqa: BLE001
        out["embedding"] = {"error": traceback.format_exc()}
    for scale in (1.0, 1e4):
        try:
            x = logits(scale)[:, mine].clone().requires_grad_(True)
            with CommCounter() as counter:
                loss = vocab_parallel_cross_entropy(x, TARGETS, group=group)
                forward = counter.counts()
                counter.reset()
                loss.backward(loss_upstream())
                backward = counter.counts()
            out[f"ce{scale:g}"] = {"loss": loss.detach(), "grad": x.grad, "forward": forward, "backward": backward}
        except Exception:  # noqa: BLE001
            out[f"ce{scale:g}"] = {"error": traceback.format_exc()}
    try:
        logit, labels = lm_inputs()
        x = logit[..., mine].clone().requires_grad_(True)
        loss = vocab_parallel_lm_loss(x, labels, group=group)
        loss.backward()
        out["lm"] = {"loss": loss.detach(), "grad": x.grad}
    except Exception:  # noqa: BLE001
        out["lm"] = {"error": traceback.format_exc()}
    return out


def get(name, rank):
    return case(operator_results(), "vocab", rank, name)


def mine(rank):
    """Global rank ``rank``'s slice of the vocabulary in its tp group."""
    chunk = VOCAB // TP
    return slice(group_rank(rank) * chunk, (group_rank(rank) + 1) * chunk)


def close(actual, expected, what):
    assert_close(actual, expected, what, atol=1e-5, rtol=1e-5)


def test_vocab_parallel_embedding_equals_embedding():
    weight = embedding_weight().requires_grad_(True)
    y = F.embedding(IDS, weight)
    y.backward(embedding_upstream())
    for rank in range(WORLD):
        r = get("embedding", rank)
        close(r["y"], y.detach(), f"rank {rank}: embedding output (every id, from whichever rank owns it)")
        close(r["w"], weight.grad[mine(rank)], f"rank {rank}: gradient of its rows")


@pytest.mark.parametrize("scale", [1.0, 1e4], ids=["normal_logits", "huge_logits"])
def test_vocab_parallel_cross_entropy_equals_cross_entropy(scale):
    full = logits(scale).requires_grad_(True)
    ref = F.cross_entropy(full, TARGETS, ignore_index=-100, reduction="none")
    ref.backward(loss_upstream())
    for rank in range(WORLD):
        r = get(f"ce{scale:g}", rank)
        assert torch.isfinite(r["loss"]).all(), f"rank {rank}: non-finite loss {r['loss']} (subtract the global max)"
        close(r["loss"], ref.detach(), f"rank {rank}: per-token loss (0 where the target is -100)")
        close(r["grad"], full.grad[:, mine(rank)], f"rank {rank}: gradient of its logits")


def test_vocab_parallel_cross_entropy_communication():
    for rank in range(WORLD):
        r = get("ce1", rank)
        assert set(r["forward"]) == {"all_reduce"}, (
            f"forward collectives {r['forward']}: only all-reduces of per-token scalars (max, target logit, "
            "sum of exponentials) — never gather the logits; go through course.collectives")
        assert r["backward"] == {}, f"backward communicated {r['backward']}; it needs no communication"


def test_vocab_parallel_lm_loss_equals_course_loss():
    from course.loss import lm_loss

    logit, labels = lm_inputs()
    logit.requires_grad_(True)
    ref = lm_loss(logit, labels)
    ref.backward()
    for rank in range(WORLD):
        r = get("lm", rank)
        close(r["loss"], ref.detach(), f"rank {rank}: mean next-token loss over target tokens")
        close(r["grad"], logit.grad[..., mine(rank)], f"rank {rank}: gradient of its logits")
