"""Bad input to the communication part is refused with a clear error (ungraded: the checks sit outside the
students' blocks)."""
import pytest
import torch


def test_bad_op_is_refused():
    from communication.ring import ring_all_reduce

    with pytest.raises(ValueError, match="op"):
        ring_all_reduce(torch.zeros(3), op="max")


def test_bad_ratio_is_refused():
    from communication.compression import topk_compress

    for ratio in (0, -0.1, 1.5):
        with pytest.raises(ValueError, match="ratio"):
            topk_compress(torch.zeros(4), torch.zeros(4), ratio)


def test_bucket_size_must_be_positive():
    from communication.buckets import bucket_parameters

    with pytest.raises(ValueError, match="bucket size"):
        bucket_parameters([1], 0)
