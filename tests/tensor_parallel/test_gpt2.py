"""Assignment 5.3.4 — tensor-parallel GPT-2 equals the single-device transformers model (graded).

One launch per tp (2, and 4: the model has 4 heads) builds the same small GPT-2 on
every rank with ``course.model.build_gpt2`` (dropout 0, eager attention), runs it on a
padded batch with source tokens masked out of the loss, and compares the
``TensorParallelGPT2`` built from it:

* logits (gathered) and the course loss: max abs difference <= 1e-5 (float32),
* every parameter's gradient against the matching shard of the transformers model's
  gradient, sliced here independently of the solution (rank r's Q, K and V rows of
  ``c_attn``; rows/columns of the MLP; vocabulary rows of the tied embedding): <= 1e-5,
* the communication counter: 2 all-reduces of a (batch, seq, n_embd) tensor per layer in
  the forward pass and 2 in the backward pass.

The launch of 4 also runs plain TP and sequence parallelism at tp 2 in the tp groups of a (dp 2, tp 2) mesh:
groups that are not the world, so that a collective called without its group is seen.
The same launch also runs the sequence-parallel and ``block_types`` checks of
``test_tensor_parallel_sequence.py`` and ``test_tensor_parallel_block_types.py`` (each
result is reported by the test that reads it), so transformers is imported once per rank.
"""
import functools
import traceback
from types import SimpleNamespace

import pytest
import torch
from tests.support.tensor_parallel import case, expected_shards

VOCAB, N_LAYER, N_EMBD, N_HEAD, N_POSITIONS = 97, 4, 64, 4, 32  # 97: the vocabulary needs padding to split
BATCH, SEQ = 2, 12
# Absolute, on logits, loss and gradients of O(0.1 .. 1). The tp model splits each dot product of <= 4 x N_EMBD = 256
# terms over the ranks and sums the parts with an all-reduce (another order than transformers' matmul): a relative
# error of ~sqrt(256) x 2^-24 ~ 1e-6 per layer typically (256 x 2^-24 ~ 1.5e-5 in the worst case), ~2e-6 over the 4
# layers. Measured: at most 5 % of TOL, with the CPU's AVX-512 kernels and with ATEN_CPU_CAPABILITY=default.
TOL = 1e-5


def gpt2_inputs(seq=SEQ):
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, VOCAB, (BATCH, SEQ), generator=g)
    mask = torch.ones_like(ids)
    mask[1, 9:] = 0                       # right padding, as the course's collate makes it
    labels = ids.clone()
    labels[:, :4] = -100                  # source tokens are not scored
    labels[mask == 0] = -100
    return ids[:, :seq], mask[:, :seq], labels[:, :seq]


GROUP_CASES = ("tp", "sp")  # also run in the tp groups of 2 of the launch of 4, as "<case>-in-tp-groups"


def _run_tp(hf, ref, block_types=None, sequence_parallel=False, seq=SEQ, group=None):
    """Build a TensorParallelGPT2 over ``group``, run forward + backward + sync_grads with the counter on."""
    from course.loss import lm_loss
    from course.collectives import CommCounter
    from tensor_parallel.gpt2 import TensorParallelGPT2

    ids, mask, labels = gpt2_inputs(seq)
    model = TensorParallelGPT2(hf, block_types=block_types, sequence_parallel=sequence_parallel, group=group)
    with CommCounter() as counter:
        out = model(ids, mask, labels)
        out.loss.backward()
        model.sync_grads()
    logits = model.gather_logits(out.logits.detach())
    grads = {n: p.grad for n, p in model.named_parameters()}
    expected = ref["expected"]
    missing = sorted(set(grads) ^ set(expected))
    grad_diff = {n: float((g - expected[n]).abs().max()) if g is not None and g.shape == expected[n].shape
                 else float("inf") for n, g in grads.items() if n in expected}
    summary = {f"{r.scope}/{r.phase}": None for r in counter.records}
    summary = {k: counter.summary(*k.split("/")) for k in summary}
    replicated = torch.cat([p.grad.reshape(-1) for b in model.h for p in b.replicated_params()]
                           + [p.grad.reshape(-1) for p in model.ln_f.parameters()])
    return {
        "logits": logits,
        "logits_diff": float((logits - ref["logits"]).abs().max()),
        "loss": out.loss.item(),
        "loss_diff": abs(out.loss.item() - lm_loss(ref["logits"], labels).item()),
        "grad_diff": grad_diff, "unmatched_params": missing,
        "comm": summary, "replicated_grads": replicated,
    }


def gpt2_worker(rank, world_size, planted=None):
    """Every case at tp = ``world_size`` (group None); with 4 ranks also :data:`GROUP_CASES` in the tp groups of 2.
    ``planted``: with a planted wrong solution (:mod:`tests.support.planting`)."""
    from tests.support.planting import planting

    with planting(planted):
        results = _gpt2_cases(rank, world_size)
        if world_size == 4:
            results.update(_gpt2_cases(rank, world_size, tp=2))
    return results


def _gpt2_cases(rank, world_size, tp=None):
    from course.model import build_gpt2
    from course.loss import lm_loss

    group, suffix, tp_rank = None, "", rank
    if tp is not None:
        from course.mesh import Mesh

        group, suffix, tp_rank = Mesh.build(dp=world_size // tp, tp=tp).tp_group, "-in-tp-groups", rank % tp

    hf = build_gpt2("tiny", VOCAB, n_positions=N_POSITIONS, dropout=0.0, seed=0,
                    n_layer=N_LAYER, n_embd=N_EMBD, n_head=N_HEAD)
    refs = {}
    for seq in (SEQ, SEQ - 1):
        hf.zero_grad()
        ids, mask, labels = gpt2_inputs(seq)
        logits = hf(input_ids=ids, attention_mask=mask).logits
        lm_loss(logits, labels).backward()
        refs[seq] = {"logits": logits.detach(), "expected": expected_shards(hf, tp_rank, tp or world_size)}
    cases = {
        "tp": {}, "sp": {"sequence_parallel": True}, "sp_odd_length": {"sequence_parallel": True, "seq": SEQ - 1},
        "spd": {"block_types": "spd"}, "parallel": {"block_types": "parallel"},
        "mixed": {"block_types": "tp,parallel,parallel,spd"},
        "spd_first": {"block_types": "spd,tp,tp,tp"}, "parallel_first": {"block_types": "parallel,tp,tp,tp"},
        "spd_sp": {"block_types": "spd", "sequence_parallel": True},
        "parallel_sp": {"block_types": "parallel", "sequence_parallel": True},
    }
    if tp is not None:
        cases = {name: kwargs for name, kwargs in cases.items() if name in GROUP_CASES}
    results = {}
    for name, kwargs in cases.items():
        try:
            results[name + suffix] = _run_tp(hf, refs[kwargs.get("seq", SEQ)], group=group, **kwargs)
        except Exception:  # noqa: BLE001 - reported by the test that reads this case
            results[name + suffix] = {"error": traceback.format_exc()}
    return results


@functools.lru_cache(maxsize=None)
def gpt2_results(tp: int, planted: str | None = None) -> dict:
    """``{rank: {case: result}}`` of one launch of :func:`gpt2_worker` (cached for the session)."""
    from tests.support.launching import launch_once as launch

    return launch(gpt2_worker, tp, planted, timeout=240)


def gpt2_case(tp, name, rank=0):
    """Case ``name`` of rank ``rank`` in the tp launch (the test fails with its traceback if it raised)."""
    return case(gpt2_results(tp), name, rank)


def assert_matches_transformers(tp, name):
    for rank in range(tp):
        r = gpt2_case(tp, name, rank)
        assert not r["unmatched_params"], f"parameters without a counterpart: {r['unmatched_params']}"
        assert r["logits_diff"] <= TOL, f"rank {rank}: logits differ from transformers by {r['logits_diff']:.2e}"
        assert r["loss_diff"] <= TOL, f"rank {rank}: loss differs from transformers by {r['loss_diff']:.2e}"
        worst = max(r["grad_diff"], key=r["grad_diff"].get)
        assert r["grad_diff"][worst] <= TOL, (
            f"rank {rank}: gradient of {worst} differs from its shard of transformers' by "
            f"{r['grad_diff'][worst]:.2e} (c_attn: rank r holds its rows of Q, of K and of V)")


@pytest.mark.a5_3_4
def test_qkv_reorder_takes_each_ranks_rows_of_q_k_and_v():
    from tensor_parallel.gpt2 import reorder_qkv_for_tensor_parallel

    H = 8
    weight = torch.arange(3 * H * 2, dtype=torch.float32).view(3 * H, 2)
    bias = torch.arange(3 * H, dtype=torch.float32)
    for tp in (1, 2, 4):
        w, b = reorder_qkv_for_tensor_parallel(weight, bias, tp)
        n = H // tp
        for rank, (w_r, b_r) in enumerate(zip(w.chunk(tp), b.chunk(tp))):
            rows = torch.cat([torch.arange(part * H + rank * n, part * H + (rank + 1) * n) for part in range(3)])
            assert torch.equal(w_r, weight[rows]), f"tp {tp}, rank {rank}: weight rows are not [Q_r; K_r; V_r]"
            assert torch.equal(b_r, bias[rows]), f"tp {tp}, rank {rank}: bias is not [Q_r; K_r; V_r]"


@pytest.mark.a5_3_4
@pytest.mark.parametrize("tp", [2, 4])
def test_tp_gpt2_equals_transformers(tp):
    assert_matches_transformers(tp, "tp")


@pytest.mark.a5_3_4
def test_tp_gpt2_in_the_tp_groups_of_a_larger_world_equals_transformers():
    """tp = 2 in each of the two tp groups of a 4-rank (dp 2, tp 2) mesh: every collective of the model runs in
    its group (one called without it, e.g. the head's f, adds the other group's gradients)."""
    assert_matches_transformers(4, "tp-in-tp-groups")


@pytest.mark.a5_3_4
def test_tp_gpt2_two_all_reduces_per_layer_each_way():
    n_bytes = BATCH * SEQ * N_EMBD * 4
    for rank in range(2):
        comm = gpt2_case(2, "tp", rank)["comm"]
        for phase in ("forward", "backward"):
            got = comm.get(f"blocks/{phase}", {})
            assert set(got) == {"all_reduce"} and got["all_reduce"]["count"] == 2 * N_LAYER, (
                f"rank {rank}: the {N_LAYER} layers did {got} in the {phase} pass; expected 2 all-reduces per layer")
            assert got["all_reduce"]["bytes"] == 2 * N_LAYER * n_bytes, "each all-reduce is one (batch, seq, n_embd)"


def test_rejects_heads_or_mlp_width_not_divisible_by_tp():
    from tensor_parallel.gpt2 import validate_tp_config

    config = SimpleNamespace(n_head=6, n_embd=96, n_layer=2, n_inner=None)
    with pytest.raises(ValueError, match="n_head=6 is not divisible by tp=4"):
        validate_tp_config(config, 4)
    config = SimpleNamespace(n_head=4, n_embd=64, n_layer=2, n_inner=90)
    with pytest.raises(ValueError, match="n_inner=90.*not divisible by tp=4"):
        validate_tp_config(config, 4)
    assert validate_tp_config(SimpleNamespace(n_head=4, n_embd=64, n_layer=2, n_inner=None), 4) == ["tp", "tp"]
