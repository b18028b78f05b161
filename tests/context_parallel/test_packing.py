"""Packed training sequences (context_parallel/packing.py) and how a packed batch is sharded (no assignment)."""
import torch

from course.collate import Collate

COLLATE = Collate(pad_id=0, eos_src_id=1, eos_tgt_id=2, model_max_length=16)


def _examples(n=40):
    g = torch.Generator().manual_seed(0)
    return [{"src_ids": torch.randint(3, 50, (int(torch.randint(1, 9, (1,), generator=g)),), generator=g).tolist(),
             "tgt_ids": torch.randint(3, 50, (int(torch.randint(1, 9, (1,), generator=g)),), generator=g).tolist()}
            for _ in range(n)]


def test_every_pair_packed_once_within_the_length_with_positions_restarting():
    from context_parallel.packing import pack_pairs

    examples = _examples()
    sequences = pack_pairs(examples, COLLATE, seq_len=48, seed=3)
    pairs = []
    for ids, labels, positions in sequences:
        assert len(ids) == len(labels) == len(positions) <= 48
        starts = [i for i, p in enumerate(positions) if p == 0]
        assert starts[0] == 0 and positions == [i - max(s for s in starts if s <= i) for i in range(len(ids))]
        bounds = starts + [len(ids)]
        pairs += [tuple(ids[a:b]) for a, b in zip(bounds, bounds[1:])]
    expected = sorted(tuple(COLLATE.build(e["src_ids"], e["tgt_ids"])[0]) for e in examples)
    assert sorted(pairs) == expected, "every pair exactly once, built as the other modes build it"
    assert pack_pairs(examples, COLLATE, 48, seed=3) == sequences, "the same seed packs the same sequences"


def test_packed_collate_pads_every_row_to_seq_len():
    from context_parallel.packing import PackedCollate, pack_pairs

    sequences = pack_pairs(_examples(), COLLATE, seq_len=48, seed=3)[:3]
    batch = PackedCollate(pad_id=0, seq_len=48)(sequences)
    assert {k: tuple(v.shape) for k, v in batch.items()} == {k: (3, 48) for k in batch}
    for row, (ids, labels, positions) in enumerate(sequences):
        n = len(ids)
        assert batch["input_ids"][row, :n].tolist() == ids and (batch["input_ids"][row, n:] == 0).all()
        assert (batch["labels"][row, n:] == -100).all() and batch["attention_mask"][row].sum() == n
        assert batch["position_ids"][row, :n].tolist() == positions


def test_shard_keeps_the_batch_positions_and_shifts_targets_before_cutting():
    from context_parallel.gpt2 import shard_batch
    from tests.context_parallel.workers import GivenLayout  # zig-zag without 5.7.2's chunk_ids

    ids = torch.arange(16)[None]
    batch = {"input_ids": ids, "labels": ids + 100, "position_ids": torch.arange(16)[None] % 5}
    layout = GivenLayout("zigzag", 2, 16)
    shards = [shard_batch(batch, layout, r) for r in (0, 1)]
    assert shards[0]["input_ids"].tolist() == [[0, 1, 2, 3, 12, 13, 14, 15]]
    assert shards[0]["position_ids"].tolist() == [[0, 1, 2, 3, 2, 3, 4, 0]]
    assert shards[0]["targets"].tolist() == [[101, 102, 103, 104, 113, 114, 115, -100]]
    assert shards[1]["targets"].tolist() == [[105, 106, 107, 108, 109, 110, 111, 112]]
    del batch["position_ids"]
    assert shard_batch(batch, layout, 1)["position_ids"].tolist() == [[4, 5, 6, 7, 8, 9, 10, 11]]
