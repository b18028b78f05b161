"""Shared by the a5_6_2 / a5_6_3 tests: a tiny GPT-2, a global batch, and the worker that runs
one or more (dp, pp, tp) layouts on the launched ranks and reports what each rank computed.

The references (one process, the dense transformers model on the whole global batch) are
computed in the test process from the same seed; :func:`tests.support.tensor_parallel.expected_shards`
slices them into each tp rank's shards independently of the solution.
"""
from __future__ import annotations

import torch

VOCAB, N_EMBD, N_HEAD, N_LAYER, SEQ, BATCH = 61, 32, 4, 4, 8, 8  # 61: the vocabulary is padded for tp = 2


def dense(dtype=torch.float64, embd_pdrop: float = 0.0):
    """The tiny dense GPT-2; ``embd_pdrop``: dropout on the embeddings' sum only (the blocks' dropout stays 0,
    so a tensor-parallel stage, whose blocks draw other masks, can still be compared with it)."""
    from course.model import build_gpt2

    model = build_gpt2("tiny", VOCAB, n_positions=SEQ, dropout=0.0, seed=7, n_layer=N_LAYER, n_embd=N_EMBD,
                       n_head=N_HEAD).to(dtype)
    model.transformer.drop.p = model.config.embd_pdrop = embd_pdrop
    return model.train()


def global_batch():
    """input_ids and labels (BATCH, SEQ): the first two labels of every row and a padded tail of two rows are -100."""
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(0, VOCAB, (BATCH, SEQ), generator=g)
    labels = ids.clone()
    labels[:, :2] = -100
    labels[1, 5:] = -100
    labels[6, 3:] = -100
    return ids, labels


def dense_reference(dtype=torch.float64, max_norm=None, embd_pdrop: float = 0.0, seed: int | None = None):
    """``(model after backward [and clipping], loss, grad norm)`` of one process on the global batch
    (``seed``: the random state the forward pass starts from, as :func:`run_case` seeds every rank)."""
    import torch.nn.functional as F

    model = dense(dtype, embd_pdrop)
    ids, labels = global_batch()
    if seed is not None:
        torch.manual_seed(seed)
    logits = model(input_ids=ids).logits  # course.loss.lm_loss's cross-entropy, in the model's dtype
    loss = F.cross_entropy(logits[:, :-1].reshape(-1, VOCAB), labels[:, 1:].reshape(-1), ignore_index=-100)
    loss.backward()
    norm = float(torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm if max_norm is not None else 1e30))
    return model, loss.item(), norm


def run_case(case: dict) -> dict:
    """On every rank: build the mesh and this rank's stage, run one step, return its results."""
    from course.collectives import CommCounter, all_reduce
    from course.launch import context
    from course.mesh import ParallelDims
    from pipeline import one_f_one_b_actions
    from three_d.rank_setup import setup_rank
    from three_d.step import count_targets, three_d_step

    dtype = case.get("dtype", torch.float64)
    ranked = setup_rank(ParallelDims(dp=case["dp"], pp=case["pp"], tp=case["tp"]),
                        dense(dtype, case.get("embd_pdrop", 0.0)), context().device, scatter_gather=case.get("scatter_gather", False))
    mesh, stage, runner = ranked.mesh, ranked.stage, ranked.runner
    ids, labels = global_batch()
    share = BATCH // case["dp"]
    ids, labels = ids[mesh.dp_rank * share:(mesh.dp_rank + 1) * share], labels[mesh.dp_rank * share:(mesh.dp_rank + 1) * share]
    out = {"coordinates": (mesh.stage, mesh.dp_rank, mesh.tp_rank)}
    if "seed" in case:  # every rank draws the same dropout masks as the one-process reference
        torch.manual_seed(case["seed"])
    with CommCounter() as counter:
        if case.get("step", True):
            r = three_d_step(stage, runner, mesh, ids, labels, case["micro_batches"], case.get("schedule", "1f1b"),
                             case.get("max_norm"))
            out.update(loss=r["loss"], grad_norm=r["grad_norm"])
        else:  # the stage alone (dp = 1): the pipeline, then the tied sum done here, not by the code under test
            n = count_targets(labels)
            micro = share // case["micro_batches"]
            result = runner.run(one_f_one_b_actions(mesh.stage, case["pp"], case["micro_batches"]),
                                list(ids.split(micro)) if stage.is_first else None,
                                [(lab, n) for lab in labels.split(micro)] if stage.is_last else None)
            out["loss"] = sum(result.losses.values()) if stage.is_last else None
            out["stage_counts"] = counter.by_group()
            out["peers"] = sorted({(rec.kind, rec.peer) for rec in counter.records if rec.kind in ("send", "recv")})
            if stage.tied is not None:
                stage.tied.grad = all_reduce(stage.tied.grad, mesh.embedding_group)
    out["by_group"] = counter.by_group()
    out["grads"] = {("wte.weight" if name == "lm_head.weight" else name): p.grad.clone()
                    for name, p in stage.named_parameters()}
    return out


def layouts_worker(rank: int, world_size: int, cases: list, planted: str | None = None) -> list:
    """``planted``: with a planted wrong solution (:mod:`tests.support.planting`)."""
    from course.task import worker_env_quiet
    from tests.support.planting import planting

    worker_env_quiet()
    torch.set_num_threads(1)
    with planting(planted):
        return [run_case(case) for case in cases]


def compare_grads(results: dict, reference, tp: int, atol: float, rtol: float = 0.0) -> float:
    """Worst |difference| of any rank's gradient from its shard of ``reference``'s; fails with the parameter's name."""
    from tests.support.tensor_parallel import expected_shards

    worst = 0.0
    for rank, r in results.items():
        want = expected_shards(reference, r["coordinates"][2], tp)
        for name, got in r["grads"].items():
            torch.testing.assert_close(got, want[name].to(got.dtype), atol=atol, rtol=rtol,
                                       msg=lambda m, name=name, rank=rank: f"rank {rank} {r['coordinates']}: {name}: {m}")
            worst = max(worst, float((got - want[name]).abs().max()))
    return worst
