"""The exercise checks of notebooks/03_tensor_parallel.ipynb: right answers pass, plausible wrong ones fail."""
import pytest

from tensor_parallel.labs import checks


@pytest.mark.parametrize("answer, ok", [(48, True), (24, False), (96, False), (4, False), (None, False)])
def test_allreduces(answer, ok, capsys):
    assert checks.check_allreduces_per_step(answer) is ok
    assert ("right" if ok else "not yet") in capsys.readouterr().out


def test_block_traffic():
    v = 8 * 1024 * 1600 * 2
    right = 4 * 7 / 8 * v
    assert checks.check_block_traffic(right, right)
    assert not checks.check_block_traffic(2 * v, right)  # the tensor's bytes, not the ring's traffic
    assert not checks.check_block_traffic(right, right / 2)  # SP counted as half the traffic
    assert not checks.check_block_traffic(right / 2, right)  # one all-reduce only


def test_shard_shapes():
    assert checks.check_mlp_shard_shapes((800, 1600), (1600, 800))
    assert not checks.check_mlp_shard_shapes((1600, 800), (800, 1600))  # row and column swapped
    assert not checks.check_mlp_shard_shapes((6400, 200), (1600, 800))
    assert not checks.check_mlp_shard_shapes(None, None)


def test_vocab_loss_bytes():
    assert checks.check_vocab_loss_bytes(98304)
    assert not checks.check_vocab_loss_bytes(32768) and not checks.check_vocab_loss_bytes(8192)
