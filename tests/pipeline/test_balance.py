"""Balanced pipeline stages: the linear partition and the measured GPT-2 balance (``--balance auto``).

* :func:`pipeline.partition.linear_partition` returns an optimal contiguous split (checked
  against brute force over every split) with at least one layer per stage.
* :func:`pipeline.gpt2.gpt2_measured_balance` counts the final norm + LM head (+ loss) as
  the last layer's cost: on a GPT-2 whose head is much larger than a block (big vocabulary,
  narrow model), the last stage gets fewer layers than the count-based split, and the
  measured slowest stage is no slower than the count-based one's.
"""
import itertools
import random

import pytest
import torch

from pipeline.partition import linear_partition


def _brute_force(costs, k):
    n = len(costs)
    best = None
    for cuts in itertools.combinations(range(1, n), k - 1):
        bounds = (0, *cuts, n)
        worst = max(sum(costs[a:b]) for a, b in zip(bounds, bounds[1:]))
        best = worst if best is None else min(best, worst)
    return best


def _max_part(costs, balance):
    out, start = [], 0
    for b in balance:
        out.append(sum(costs[start:start + b]))
        start += b
    return max(out)


def test_linear_partition_is_optimal():
    rng = random.Random(0)
    for _ in range(200):
        n = rng.randint(1, 9)
        k = rng.randint(1, n)
        costs = [rng.choice([0.5, 1.0, 2.0, 3.0, 7.0]) * rng.random() for _ in range(n)]
        balance = linear_partition(costs, k)
        assert len(balance) == k and sum(balance) == n and min(balance) >= 1
        assert _max_part(costs, balance) == pytest.approx(_brute_force(costs, k))
    assert linear_partition([1, 1, 1, 3], 2) == [3, 1]
    assert linear_partition([1, 2, 3, 4, 5, 6, 7, 8, 9], 3) == [5, 2, 2]


def test_linear_partition_bad_input():
    with pytest.raises(ValueError, match="stages"):
        linear_partition([1.0, 2.0], 3)
    with pytest.raises(ValueError):
        linear_partition([1.0, -2.0], 1)


@pytest.mark.needs_solution  # gpt2_layers is the a5_2_3 solution
def test_measured_balance_counts_the_lm_head():
    from course.model import build_gpt2
    from pipeline.gpt2 import gpt2_balance, gpt2_measured_balance

    torch.manual_seed(0)
    model = build_gpt2("tiny", 8192, n_positions=32, dropout=0.0, seed=0, n_layer=4, n_embd=32, n_head=2)
    sample = torch.randint(0, 8192, (4, 32))
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # one thread: the shared cores' contention does not swamp the small layers
    try:
        balance, costs = gpt2_measured_balance(model, 2, sample, repeats=5)
    finally:
        torch.set_num_threads(threads)
    assert len(costs) == 4 + 2 and sum(balance) == 6
    blocks = costs[1:-1]
    assert costs[-1] > 2 * max(blocks), f"the head + loss (8192-word vocabulary) must cost several blocks: {costs}"
    count = gpt2_balance(4, 2)
    assert balance[-1] < count[-1], f"measured balance {balance} must give the expensive head's stage fewer layers"
    assert _max_part(costs, balance) <= _max_part(costs, count)
    assert all(p.grad is None for p in model.parameters()), "measuring must leave no gradients behind"


@pytest.mark.parametrize("extra,message", [
    (["--single_process", "pipe", "--balance", "auto"], "--balance auto"),
    (["--schedule", "1f1b", "--virtual_stages", "2"], "--virtual_stages"),
    (["--schedule", "interleaved", "--pp", "2", "--virtual_stages", "3"], "virtual) stages"),
    (["--schedule", "interleaved", "--pp", "2", "--micro_batches", "5", "--batch_size", "10"],
     "--micro_batches"),
])
def test_run_pipeline_rejects_bad_schedule_options(tmp_path, capsys, extra, message):
    from project.run_pipeline import parse_args

    with pytest.raises(SystemExit):
        parse_args(["--workdir", str(tmp_path), *extra])
    assert message in capsys.readouterr().err


def test_run_pipeline_accepts_the_new_schedules(tmp_path):
    from project.run_pipeline import parse_args

    args = parse_args(["--workdir", str(tmp_path), "--schedule", "interleaved", "--pp", "2"])
    assert args.virtual_stages == 2 and args.balance == "count"
    args = parse_args(["--workdir", str(tmp_path), "--schedule", "zb-h1", "--pp", "2",
                       "--balance", "auto"])
    assert args.virtual_stages == 1 and args.balance == "auto"
