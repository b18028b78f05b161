"""Tokenizer training/caching/round-trip, the batch layout, and the target-only loss."""
import torch
import torch.nn.functional as F

from course.collate import IGNORE_INDEX, encode_pairs, make_collate
from course.tokenizer import get_tokenizer
from course.loss import count_target_tokens, lm_loss

PAIRS = [{"translation": {"de": f"Ein Mann fährt Fahrrad Nummer {i}.", "en": f"A man rides bike number {i}."}}
         for i in range(200)]
CORPUS = {"train": {"translation": [p["translation"] for p in PAIRS]}}


def test_tokenizer_round_trip_special_tokens_and_cache(tmp_path):
    tok = get_tokenizer(CORPUS, tmp_path, vocab_size=400)
    for text in ["Ein Mann fährt Fahrrad Nummer 7.", "Zwei Hunde spielen im Schnee, äöüß!"]:
        assert tok.decode(tok.encode(text)) == text
    assert len({tok.eos_src_id, tok.eos_tgt_id, tok.pad_id}) == 3
    assert tok.vocab_size <= 400
    cached = list(tmp_path.glob("tokenizer_*.json"))
    assert len(cached) == 1
    stamp = cached[0].stat().st_mtime_ns
    again = get_tokenizer(CORPUS, tmp_path, vocab_size=400)
    assert cached[0].stat().st_mtime_ns == stamp, "a cached tokenizer must be reused, not retrained"
    assert again.encode("Ein Mann") == tok.encode("Ein Mann")


def test_batch_is_source_eos_target_eos_with_target_only_labels(tmp_path):
    tok = get_tokenizer(CORPUS, tmp_path, vocab_size=400)
    examples = encode_pairs(PAIRS[:2], tok) + [{"src_ids": [5], "tgt_ids": [6, 7], "src": "", "tgt": ""}]
    batch = make_collate(tok, model_max_length=64)(examples)
    ids, mask, labels = batch["input_ids"], batch["attention_mask"], batch["labels"]
    assert ids.shape == mask.shape == labels.shape and ids.dtype == torch.long
    row = ids[2].tolist()
    assert row[:5] == [5, tok.eos_src_id, 6, 7, tok.eos_tgt_id]
    assert labels[2, :5].tolist() == [IGNORE_INDEX, IGNORE_INDEX, 6, 7, tok.eos_tgt_id]
    assert all(t == tok.pad_id for t in row[5:]) and mask[2].tolist() == [1] * 5 + [0] * (len(row) - 5)
    assert (labels[2, 5:] == IGNORE_INDEX).all()
    first = examples[0]
    n_src, n_tgt = len(first["src_ids"]), len(first["tgt_ids"])
    assert ids[0, n_src].item() == tok.eos_src_id
    assert tok.decode(ids[0, n_src + 1:n_src + 1 + n_tgt].tolist()) == first["tgt"]


def test_long_pairs_are_cut_to_model_max_length(tmp_path):
    tok = get_tokenizer(CORPUS, tmp_path, vocab_size=400)
    batch = make_collate(tok, model_max_length=10)([{"src_ids": list(range(20)), "tgt_ids": list(range(20))}])
    assert batch["input_ids"].shape == (1, 10)
    assert batch["input_ids"][0, 5].item() == tok.eos_src_id  # source cut to half the length


def test_lm_loss_is_mean_next_token_cross_entropy_over_targets():
    torch.manual_seed(0)
    logits = torch.randn(2, 5, 11)
    labels = torch.tensor([[IGNORE_INDEX, IGNORE_INDEX, 3, 4, 1], [IGNORE_INDEX, 2, 9, IGNORE_INDEX, IGNORE_INDEX]])
    picks = [(0, 1, 3), (0, 2, 4), (0, 3, 1), (1, 0, 2), (1, 1, 9)]  # (row, position predicting, target)
    expected = torch.stack([F.cross_entropy(logits[b, t], torch.tensor(y)) for b, t, y in picks]).mean()
    assert torch.allclose(lm_loss(logits, labels), expected)
    assert count_target_tokens(labels) == 5


def test_encoded_pairs_tokenize_only_what_is_read_and_equal_the_eager_encoding(tmp_path):
    import pytest
    from torch.utils.data import DataLoader, Subset

    from course.collate import EncodedPairs

    tok = get_tokenizer(CORPUS, tmp_path, vocab_size=400)
    eager = encode_pairs(PAIRS, tok)
    calls = []

    class Counting:
        def encode_batch(self, texts):
            calls.append(len(texts))
            return tok.encode_batch(texts)

    lazy = EncodedPairs(PAIRS, Counting())
    assert len(lazy) == len(eager) == 200
    assert lazy[7] == eager[7] and lazy[-1] == eager[-1] and calls == [1, 1, 1, 1]
    assert lazy[7] == eager[7] and len(calls) == 4, "a pair read again must not be encoded again"
    assert lazy[10:13] == eager[10:13] and calls[-2:] == [3, 3], "a slice is one batched call per language"
    with pytest.raises(IndexError, match="outside"):
        lazy[200]
    loader = DataLoader(Subset(lazy, [50, 60, 70, 80]), batch_size=2, collate_fn=list)
    assert [e for batch in loader for e in batch] == [eager[i] for i in (50, 60, 70, 80)]
    assert sum(calls) < 2 * 20, "only the pairs read are encoded"
    assert list(lazy) == eager
