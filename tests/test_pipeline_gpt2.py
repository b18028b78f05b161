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
