"""Assignment 5.2.3 — GPT-2 prepared for pipelining (graded).

The piped GPT-2 (its blocks split over 2-4 stages, on ``cpu``) gives the same logits,
the same next-token loss and the same gradients as the plain ``GPT2LMHeadModel``.
Dropout is 0 so the comparison is exact up to float rounding.
"""
import pytest
import torch

pytestmark = [pytest.mark.a5_2_3, pytest.mark.timeout(180)]

VOCAB = 300


@pytest.fixture(scope="module")
def make_model():
    from course.model import build_gpt2

    return lambda: build_gpt2("tiny", VOCAB, n_positions=32, dropout=0.0, seed=3)


def _batch(batch=5, seq=14):
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, VOCAB, (batch, seq), generator=g)
    labels = ids.clone()
    labels[:, : seq // 2] = -100  # loss on the second half only, as on the translation task
    return ids, labels


@pytest.mark.parametrize("n_stages,split_size", [(2, 2), (3, 1), (4, 5)])
def test_piped_gpt2_logits_loss_and_gradients_equal_the_plain_model(make_model, n_stages, split_size):
    from pipeline.gpt2 import GPT2Pipeline
    from course.loss import lm_loss

    plain, piped_source = make_model(), make_model()
    piped = GPT2Pipeline(piped_source, n_stages, split_size)
    assert len(piped.pipe.partitions) == n_stages
    ids, labels = _batch()

    want = plain(input_ids=ids).logits
    got = piped(ids)
    assert got.shape == want.shape == (ids.shape[0], ids.shape[1], VOCAB)
    # The same GPT-2 layers on micro-batches (row slices of the batch): the same dot products (<= 4 x n_embd terms)
    # but for a matmul's blocking, ~sqrt(K) x 2^-24 relative per layer: ~1e-6 on O(1) logits, inside 1e-5. The loss
    # is computed from those logits (cross-entropy moves by at most 2 max|d logit|: typically ~1e-6, against
    # 1e-6 + 1e-6 x ~5.7). The gradients sum the micro-batches' parts over the rows in another order; they are sums of
    # terms of either sign, whose cancellation lifts the relative error: rtol 1e-4, atol 1e-6. Measured: under 5 % of
    # each tolerance on either kernel path (AVX-512 and ATEN_CPU_CAPABILITY=default).
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)

    loss_want, loss_got = lm_loss(want, labels), lm_loss(got, labels)
    torch.testing.assert_close(loss_got, loss_want, rtol=1e-6, atol=1e-6)
    loss_want.backward()
    loss_got.backward()
    for (name, p), q in zip(plain.named_parameters(), piped_source.parameters()):
        assert q.grad is not None, f"no gradient reached {name}"
        torch.testing.assert_close(q.grad, p.grad, rtol=1e-4, atol=1e-6, msg=f"gradient of {name}")


def test_chain_has_embeddings_blocks_and_head_as_layers(make_model):
    from pipeline.gpt2 import gpt2_layers

    model = make_model()
    chain = gpt2_layers(model)
    assert len(chain) == model.config.n_layer + 2, "embeddings, one layer per block, head"
    ids, _ = _batch(2, 9)
    hidden = chain[0](ids)
    assert hidden.shape == (2, 9, model.config.n_embd)
    for layer in list(chain)[1:-1]:
        hidden = layer(hidden)
        assert torch.is_tensor(hidden) and hidden.shape == (2, 9, model.config.n_embd), \
            "every block layer maps the hidden state alone to the hidden state alone"
    torch.testing.assert_close(chain[-1](hidden), model(input_ids=ids).logits, rtol=1e-5, atol=1e-5)


def test_the_tied_embedding_stays_one_parameter_when_the_last_stage_moves_device(make_model):
    """The LM head reads the token embedding's weight; it must not register it (or a copy): placing the
    last stage on another device must neither move the embedding there nor make a second parameter."""
    from pipeline.gpt2 import GPT2Pipeline

    model = make_model()
    wte = model.transformer.wte.weight
    piped = GPT2Pipeline(model, 2, 2, devices=["cpu", "meta"])
    assert model.lm_head.weight is wte, "the model's head and embedding must stay tied"
    assert wte.device == torch.device("cpu"), "moving the last stage moved the first stage's embedding"
    ids = {id(p) for p in model.parameters()}
    piped_ids = [id(p) for p in piped.parameters()]
    assert len(piped_ids) == len(set(piped_ids)) and set(piped_ids) == ids, \
        "the piped model must hold exactly the model's parameters: no copy of the tied weight"
    assert all(p is not wte for p in piped.pipe.partitions[-1].parameters()), \
        "the last stage registered the embedding's weight as its own parameter"


@pytest.mark.parametrize("n_stages", [2, 3])
def test_each_stage_holds_the_tied_weight_once(make_model, n_stages):
    from pipeline.gpt2_stages import gpt2_stage

    model = make_model()
    wte = model.transformer.wte.weight
    for stage in range(n_stages):
        layers, tied = gpt2_stage(make_model(), stage, n_stages) if stage else gpt2_stage(model, 0, n_stages)
        params = list(layers.parameters())
        assert len({id(p) for p in params}) == len(params)
        vocab_sized = [p for p in params if p.shape == wte.shape]
        if stage == 0:
            assert tied is wte and vocab_sized == [wte], "stage 0 holds the embedding weight, once"
        elif stage == n_stages - 1:
            assert tied is not None and vocab_sized == [tied], "the last stage holds one copy of the tied weight"
            torch.testing.assert_close(tied.detach(), wte.detach())
        else:
            assert tied is None and not vocab_sized, "a middle stage holds no copy of the tied weight"


def tied_worker(rank, world_size, dp, pp, last_has_grad, planted=None):
    """``planted``: with a planted wrong solution (:mod:`tests.support.planting`)."""
    from torch import nn

    from course.mesh import Mesh
    from pipeline.gpt2_stages import TiedGradients
    from tests.support.planting import planting

    mesh = Mesh.build(dp=dp, pp=pp)
    tied = None
    if mesh.is_first_stage or mesh.is_last_stage:
        tied = nn.Parameter(torch.zeros(5, 3))
        if mesh.is_first_stage or last_has_grad:
            tied.grad = torch.arange(15.0).view(5, 3) * (rank + 1) + rank
    with planting(planted):
        TiedGradients(mesh.embedding_group)(tied)
    return None if tied is None else tied.grad


def _own_grad(rank):
    return torch.arange(15.0).view(5, 3) * (rank + 1) + rank


@pytest.mark.parametrize("dp,pp,last_has_grad", [(1, 3, True), (1, 3, False), (2, 2, True)])
def test_tied_gradients_are_summed_between_the_first_and_last_stage(dp, pp, last_has_grad):
    """After ``TiedGradients``, a pipeline's first and last stage both hold the SUM of their tied gradients
    (the gradient of the one tied weight); a missing gradient counts as zeros; middle stages and the other
    pipelines (dp replicas) are left alone."""
    from course.launch import launch
    from tests.support.launching import GRADED_COLLECTIVE_TIMEOUT

    check_tied_sums(launch(tied_worker, dp * pp, dp, pp, last_has_grad, timeout=90,
                           collective_timeout=GRADED_COLLECTIVE_TIMEOUT), dp, pp, last_has_grad)


def check_tied_sums(out, dp, pp, last_has_grad):
    for d in range(dp):
        first, last = d, (pp - 1) * dp + d
        want = _own_grad(first) + (_own_grad(last) if last_has_grad else 0)
        torch.testing.assert_close(out[first], want, msg=f"pipeline {d}: first stage's tied gradient is not the sum")
        torch.testing.assert_close(out[last], want, msg=f"pipeline {d}: last stage's tied gradient is not the sum")
        for middle in range(1, pp - 1):
            assert out[middle * dp + d] is None
