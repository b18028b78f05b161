"""Assignment 5.1.3 — a real 2-process data-parallel run on Multi30k (graded).

The run must end with bit-identical weights on both ranks, bit-identical to one process
training on the same global batches the way the ranks compute them (each shard's forward and
backward, the two gradients summed and halved), and write finite results. Bitwise, not within a
tolerance: the reference does the same float32 operations on the same shapes with the ranks' number
of threads, the all-reduce of two terms is the same sum in either order and halving is exact, so any
difference is a difference in what was computed. (Compared with a tolerance instead, AdamW would
turn a last-bit difference of a near-zero gradient into a difference of up to lr in that weight's
update, so no tolerance on the weights could be derived from float32's precision.)
"""
import json
import math
import os
import shutil

import pytest
import torch

pytestmark = pytest.mark.a5_1_3

STEPS = 3


def argv(workdir):
    # a slice of the corpus (its own small tokenizer) and one validation batch: the checks below do not need more
    return ["--dp", "2", "--batch_size", "8", "--max_batches", str(STEPS), "--n_bleu", "2", "--vocab_size", "1000",
            "--max_train_examples", "2000", "--max_val_batches", "1", "--model_max_length", "48",
            "--dropout", "0", "--workdir", str(workdir), "--quiet", "--save_checkpoint", "--timeout", "300"]


def test_two_rank_run_matches_single_process_training(tmp_path):
    from project.run_data_parallel import main, parse_args

    assert main(argv(tmp_path)) == 0
    r0, r1 = (json.loads((tmp_path / f"rank{r}_results_epoch0.json").read_text()) for r in (0, 1))
    assert r0["param_sha256"] == r1["param_sha256"], "ranks ended with different weights: are gradients averaged?"
    assert r0["initial_param_sha256"] == r1["initial_param_sha256"]
    assert r0["param_sha256"] != r0["initial_param_sha256"], "training did not change the weights"
    for r in (r0, r1):
        assert r["steps"] == STEPS
        for key in ("validation_loss", "bleu", "training_time", "tokens_per_sec"):
            assert math.isfinite(r[key]), f"{key} = {r[key]}"
        assert r["training_time"] > 0 and r["tokens_per_sec"] > 0
        assert r["config"]["world_size"] == 2 and r["config"]["per_rank_batch_size"] == 4
    assert r0["tokens"] != r1["tokens"] or r0["train_losses"] != r1["train_losses"], "both ranks saw the same data"

    # Single-process reference: the same initial weights, the same global batches (rank 0's and rank 1's
    # shards of each step), the loss averaged over the two shards, the same optimizer.
    from data_parallel.partition import partition_dataset
    from course.task import build_model, prepare_data
    from course.loss import model_loss

    # the ranks' threads: course/launch.py shares the cores between the local ranks (cpu_count // 2 for 2)
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // 2))
    reference = tmp_path / "reference"  # the run's own folder holds its results: parse_args would refuse it
    reference.mkdir()
    for tokenizer in tmp_path.glob("tokenizer_*.json"):
        shutil.copy(tokenizer, reference)  # the run's tokenizer, so both sides use the same vocabulary
    args = parse_args(argv(reference))
    data = prepare_data(args)
    model = build_model(args, data.tokenizer.vocab_size)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.learning_rate)
    loaders = [partition_dataset(r, 2, data.train, args.batch_size, data.collate, seed=args.seed) for r in (0, 1)]
    for _, shards in zip(range(STEPS), zip(*loaders)):
        grads = []
        for b in shards:  # each rank's shard: its own forward and backward, as on the rank
            optimizer.zero_grad(set_to_none=True)
            model_loss(model, b).backward()
            grads.append([p.grad for p in model.parameters()])
        for p, g0, g1 in zip(model.parameters(), *grads):
            p.grad = g0 + g1  # the all-reduce's sum (two terms: the same in either order) ...
            p.grad /= 2  # ... divided by the world size
        optimizer.step()
    trained = torch.load(tmp_path / "checkpoint_data_parallel.pt")
    worst = max(float((trained[k] - v).abs().max()) for k, v in model.state_dict().items())
    assert worst == 0, (f"data-parallel weights differ from single-process training by {worst:.2e} (the same "
                        f"arithmetic gives the same bits: is each step's gradient the mean of the ranks'?)")
