"""The device mesh, and the parallelisms combined on it through explicit process groups.

* :class:`course.mesh.ParallelDims`: rank arithmetic (tp fastest, pp slowest), equal to
  ``init_device_mesh``'s on real processes, and its checks before any process starts.
* dp 2 × tp 2 on 4 gloo ranks: two tensor-parallel GPT-2 groups, each fed different data;
  each equals the dense model on its data; after ``average_gradients(model, dp_group)``
  every shard's gradient equals its shard of one process's gradient on both groups' data.
* pp 2 × tp 2 on 4 gloo ranks: a 1F1B pipeline whose stages are tensor-parallel MLPs;
  send/recv go to the same tp rank of the neighbouring stage, all-reduces stay in the tp
  group, and the communication counted per group is what the hand count gives; gradients
  equal one process.
"""
from __future__ import annotations

import pytest
import torch

from course.mesh import Coordinates, ParallelDims

# ---- arithmetic and checks (no processes) -------------------------------------------------


@pytest.mark.parametrize("dp,pp,tp", [(1, 1, 8), (8, 1, 1), (1, 8, 1), (2, 2, 2), (1, 4, 2), (2, 1, 4), (3, 2, 2)])
def test_coordinates_put_tp_fastest_and_pp_slowest(dp, pp, tp):
    dims = ParallelDims(dp=dp, pp=pp, tp=tp)
    seen = set()
    for rank in range(dims.world_size):
        c = dims.coordinates(rank)
        assert rank == (c.pp * dp + c.dp) * tp + c.tp and c.cp == 0
        assert dims.rank_of(c.pp, c.dp, c.tp, c.cp) == rank
        seen.add(c)
    assert len(seen) == dims.world_size
    assert dims.coordinates(1) == (Coordinates(0, 0, 0, 1) if tp > 1 else Coordinates(0, 1, 0, 0) if dp > 1
                                   else Coordinates(1, 0, 0, 0))


@pytest.mark.parametrize("dp,pp,cp,tp,ep", [(2, 1, 2, 2, 2), (2, 2, 2, 1, 4), (4, 1, 1, 2, 2), (1, 1, 4, 2, 2),
                                            (3, 2, 2, 1, 3)])
def test_cp_sits_between_dp_and_tp_and_ep_is_carved_from_dp_x_cp(dp, pp, cp, tp, ep):
    """rank = ((pp * dp + dp_rank) * cp + cp_rank) * tp + tp_rank (torchtitan's order); the ep groups are
    consecutive runs of ep among a stage's dp x cp ranks (same tp rank), the edp groups their strided
    complements; together they tile the dp x cp ranks."""
    dims = ParallelDims(dp=dp, pp=pp, cp=cp, tp=tp, ep=ep)
    for rank in range(dims.world_size):
        c = dims.coordinates(rank)
        assert rank == ((c.pp * dp + c.dp) * cp + c.cp) * tp + c.tp
        groups = dims.expert_group_ranks(rank)
        assert rank in groups["ep"] and rank in groups["edp"]
        assert len(groups["ep"]) == ep and len(groups["edp"]) == dp * cp // ep
        same = {(x.pp, x.tp) for x in map(dims.coordinates, groups["ep"] + groups["edp"])}
        assert same == {(c.pp, c.tp)}, "ep and edp groups stay inside a stage and a tp rank"
        assert groups["ep"].index(rank) == dims.expert_coordinates(rank)[0]
        assert set(groups["ep"]) & set(groups["edp"]) == {rank}
    with pytest.raises(ValueError, match="--ep 3 does not divide dp x cp"):
        ParallelDims(dp=2, cp=2, ep=3)


def test_bad_sizes_are_refused_with_the_option_to_change():
    with pytest.raises(ValueError, match="product is 8"):
        ParallelDims(dp=2, pp=2, tp=1).check(8)
    with pytest.raises(ValueError, match="--tp 3 does not divide the 4 attention heads"):
        ParallelDims(tp=3).check(3, n_head=4)
    with pytest.raises(ValueError, match="--tp 2 does not divide the MLP width 99"):
        ParallelDims(tp=2).check(2, n_head=4, n_inner=99)
    with pytest.raises(ValueError, match="--pp 5 is more than the 4 transformer blocks"):
        ParallelDims(pp=5).check(5, n_layer=4)
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="--dp must be a whole number"):
            ParallelDims(dp=bad)
    with pytest.raises(ValueError, match="rank 8 is outside"):
        ParallelDims(dp=2, tp=4).coordinates(8)


def test_new_groups_refuses_a_rank_in_two_groups_of_one_call():
    """course.mesh.new_groups gives the ranks in none of the groups one of their own, so every rank gains one
    group: a rank in two groups of the call would gain two (refused before any group is made)."""
    from course.mesh import new_groups

    with pytest.raises(ValueError, match=r"rank\(s\) \[1\] are in two of the groups"):
        new_groups([[0, 1], [1, 2]], "overlapping")


# ---- the mesh on real processes ---------------------------------------------------------------

SHAPES = [(1, 2, 2), (2, 1, 2), (2, 2, 1), (4, 1, 1), (1, 1, 4)]  # (dp, pp, tp) on 4 ranks
CP_SHAPES = [dict(dp=2, cp=2, ep=2), dict(cp=2, tp=2, ep=2), dict(dp=2, tp=2, ep=2), dict(cp=4, ep=4),
             dict(pp=2, cp=2)]  # with context and expert parallelism, on 4 ranks


def mesh_worker(rank, world_size):
    import torch.distributed as dist

    from course.collectives import group_name
    from course.mesh import Mesh

    out = {}
    for dp, pp, tp in SHAPES:
        mesh = Mesh.build(dp=dp, pp=pp, tp=tp)
        out[(dp, pp, tp)] = {
            "coordinates": tuple(mesh.coordinates), "device_mesh": tuple(mesh.device_mesh.get_coordinate()),
            "groups": {d: dist.get_process_group_ranks(mesh.group(d)) for d in ("pp", "dp", "tp")},
            "names": {d: group_name(mesh.group(d)) for d in ("pp", "dp", "tp", "world")},
            "embedding": (None if mesh.embedding_group is None
                          else (group_name(mesh.embedding_group), dist.get_process_group_ranks(mesh.embedding_group))),
        }
    for sizes in CP_SHAPES:
        mesh = Mesh.build(**sizes)
        out[tuple(sorted(sizes.items()))] = {
            "coordinates": tuple(mesh.coordinates), "device_mesh": tuple(mesh.device_mesh.get_coordinate()),
            "groups": {d: dist.get_process_group_ranks(mesh.group(d)) for d in mesh.GROUPS},
            "names": {d: group_name(mesh.group(d)) for d in mesh.GROUPS}}
    return out


@pytest.fixture(scope="module")
def meshes():
    from course.launch import launch

    return launch(mesh_worker, 4, timeout=120)


@pytest.mark.timeout(180)
@pytest.mark.parametrize("shape", SHAPES)
def test_mesh_groups_follow_the_rank_arithmetic(meshes, shape):
    dims = ParallelDims(*shape)
    for rank in range(4):
        got = meshes[rank][shape]
        c = dims.coordinates(rank)
        assert got["coordinates"] == tuple(c), "the mesh's coordinates disagree with the arithmetic"
        assert got["device_mesh"] == (c.pp, c.dp, c.tp), "init_device_mesh disagrees with the arithmetic"
        assert got["groups"]["tp"] == [dims.rank_of(c.pp, c.dp, t) for t in range(dims.tp)]
        assert got["groups"]["dp"] == [dims.rank_of(c.pp, d, c.tp) for d in range(dims.dp)]
        assert got["groups"]["pp"] == [dims.rank_of(s, c.dp, c.tp) for s in range(dims.pp)]
        spanning = [d for d in ("pp", "dp", "tp") if getattr(dims, d) == 4]  # that dimension *is* the world group
        assert got["names"] == {"pp": "pp", "dp": "dp", "tp": "tp", "world": spanning[0] if spanning else "world"}
        ends = [dims.rank_of(0, c.dp, c.tp), dims.rank_of(dims.pp - 1, c.dp, c.tp)]
        if dims.pp > 1 and rank in ends:
            assert got["embedding"] == ("embedding", ends)
        else:
            assert got["embedding"] is None


@pytest.mark.timeout(180)
@pytest.mark.parametrize("sizes", CP_SHAPES, ids=lambda s: "-".join(f"{k}{v}" for k, v in s.items()))
def test_cp_and_expert_groups_follow_the_rank_arithmetic(meshes, sizes):
    """With cp > 1 the device mesh is (pp, dp, cp, tp); dp_cp joins the ranks holding the same weights;
    ep / edp are the expert groups of ParallelDims.expert_group_ranks; every group is named for the counter."""
    dims = ParallelDims(**sizes)
    for rank in range(4):
        got = meshes[rank][tuple(sorted(sizes.items()))]
        c = dims.coordinates(rank)
        assert got["coordinates"] == tuple(c)
        assert got["device_mesh"] == tuple(getattr(c, d) for d in dims.dim_names)
        groups = got["groups"]
        assert groups["cp"] == [dims.rank_of(c.pp, c.dp, c.tp, k) for k in range(dims.cp)]
        assert groups["dp_cp"] == sorted(dims.rank_of(c.pp, d, c.tp, k) for d in range(dims.dp) for k in range(dims.cp))
        assert groups["ep"] == dims.expert_group_ranks(rank)["ep"]
        assert groups["edp"] == (dims.expert_group_ranks(rank)["edp"] if dims.ep > 1 else groups["dp_cp"])
        for name in ("cp", "ep"):
            if getattr(dims, name) > 1 and getattr(dims, name) < 4:
                assert got["names"][name] == name


# ---- dp 2 x tp 2: tensor-parallel GPT-2 replicas averaged over the dp group only ---------------

VOCAB, N_EMBD, N_HEAD, N_LAYER, SEQ, PER_DP = 61, 32, 2, 2, 10, 2


def _dp_batches():
    g = torch.Generator().manual_seed(5)
    ids = torch.randint(0, VOCAB, (2 * PER_DP, SEQ), generator=g)
    labels = ids.clone()
    labels[:, :4] = -100
    mask = torch.ones_like(ids)
    mask[1, 8:] = 0
    labels[mask == 0] = -100
    return [{"input_ids": ids[d * PER_DP:(d + 1) * PER_DP], "attention_mask": mask[d * PER_DP:(d + 1) * PER_DP],
             "labels": labels[d * PER_DP:(d + 1) * PER_DP]} for d in range(2)]


def _dense():
    from course.model import build_gpt2

    return build_gpt2("tiny", VOCAB, n_positions=SEQ, dropout=0.0, seed=3, n_layer=N_LAYER, n_embd=N_EMBD,
                      n_head=N_HEAD)


def dp_tp_worker(rank, world_size):
    from course.collectives import CommCounter
    from course.loss import lm_loss
    from course.mesh import Mesh
    from course.task import worker_env_quiet
    from data_parallel.gradients import average_gradients
    from tensor_parallel.gpt2 import TensorParallelGPT2
    from tests.support.tensor_parallel import expected_shards

    worker_env_quiet()
    mesh = Mesh.build(dp=2, tp=2)
    batches = _dp_batches()
    mine = batches[mesh.dp_rank]
    # The dense references: this dp rank's data alone, and the whole global batch (mean of the two shards' losses).
    alone, both = _dense(), _dense()
    lm_loss(alone(input_ids=mine["input_ids"], attention_mask=mine["attention_mask"]).logits, mine["labels"]).backward()
    global_loss = sum(lm_loss(both(input_ids=b["input_ids"], attention_mask=b["attention_mask"]).logits, b["labels"])
                      for b in batches) / 2
    global_loss.backward()

    model = TensorParallelGPT2(_dense(), group=mesh.tp_group)
    with CommCounter() as counter:
        out = model(mine["input_ids"], mine["attention_mask"], mine["labels"])
        out.loss.backward()
        model.sync_grads()
        logits = model.gather_logits(out.logits.detach())
    want_alone = expected_shards(alone, mesh.tp_rank, 2)
    before = max(float((p.grad - want_alone[n]).abs().max()) for n, p in model.named_parameters())
    average_gradients(model, mesh.dp_group)
    want_global = expected_shards(both, mesh.tp_rank, 2)
    after = {n: float((p.grad - want_global[n]).abs().max()) for n, p in model.named_parameters()}
    dense_logits = alone(input_ids=mine["input_ids"], attention_mask=mine["attention_mask"]).logits
    real = mine["attention_mask"].bool()
    return {"logits_diff": float((logits - dense_logits)[real].abs().max()),
            "loss_diff": abs(out.loss.item() - lm_loss(dense_logits, mine["labels"]).item()),
            "grad_diff_own_data": before, "grad_diff_global": after,
            "wte_grad": model.wte.weight.grad.clone(), "groups": counter.by_group()}


@pytest.mark.needs_solution
@pytest.mark.timeout(180)
def test_dp2_tp2_each_tp_group_is_the_dense_model_and_dp_averages_only_its_group():
    from course.launch import launch

    results = launch(dp_tp_worker, 4, timeout=150)
    for rank, r in results.items():
        assert r["logits_diff"] < 1e-5 and r["loss_diff"] < 1e-5, f"rank {rank}: TP group != dense model on its data"
        assert r["grad_diff_own_data"] < 1e-5, f"rank {rank}: gradients before averaging != its own data's"
        worst = max(r["grad_diff_global"], key=r["grad_diff_global"].get)
        assert r["grad_diff_global"][worst] < 1e-5, (
            f"rank {rank}: {worst} after averaging differs from one process on both groups' data by "
            f"{r['grad_diff_global'][worst]:.2e} (averaged over the dp group only?)")
        assert set(r["groups"]) == {"tp"}, f"rank {rank}: the TP model communicated outside its tp group: {r['groups']}"
    # Ranks 0 and 2 (tp rank 0 of dp 0 and dp 1) hold the same shard and, after averaging, the same gradient.
    assert torch.equal(results[0]["wte_grad"], results[2]["wte_grad"])
    assert not torch.equal(results[0]["wte_grad"], results[1]["wte_grad"]), "tp ranks hold different shards"


# ---- pp 2 x tp 2: a 1F1B pipeline of tensor-parallel stages ------------------------------------

WIDTH, MICRO = 8, [3, 2, 3]


def _dense_stage(stage):
    torch.manual_seed(11 + stage)
    return torch.nn.Sequential(torch.nn.Linear(WIDTH, 4 * WIDTH), torch.nn.Tanh(), torch.nn.Linear(4 * WIDTH, WIDTH))


def _pp_data():
    g = torch.Generator().manual_seed(2)
    return [torch.randn(n, WIDTH, generator=g) for n in MICRO], [torch.randn(n, WIDTH, generator=g) for n in MICRO]


def _pp_loss(y, t):
    return ((y - t) ** 2).mean() / len(MICRO)


def pp_tp_worker(rank, world_size):
    from course.collectives import CommCounter
    from course.launch import context
    from course.mesh import Mesh
    from pipeline.schedules import one_f_one_b_actions
    from pipeline.stage_runner import StageRunner
    from tensor_parallel.layers import ColumnParallelLinear, RowParallelLinear

    mesh = Mesh.build(pp=2, tp=2)
    dense = _dense_stage(mesh.stage)
    stage = torch.nn.Sequential(
        ColumnParallelLinear(WIDTH, 4 * WIDTH, master_weight=dense[0].weight, master_bias=dense[0].bias,
                             group=mesh.tp_group),
        torch.nn.Tanh(),
        RowParallelLinear(4 * WIDTH, WIDTH, master_weight=dense[2].weight, master_bias=dense[2].bias,
                          group=mesh.tp_group))
    inputs, targets = _pp_data()
    runner = StageRunner(stage, context().device, loss_fn=_pp_loss, group=mesh.pp_group)
    with CommCounter() as counter:
        result = runner.run(one_f_one_b_actions(mesh.stage, 2, len(MICRO)), inputs if mesh.is_first_stage else None,
                            targets if mesh.is_last_stage else None)
    return {"coordinates": tuple(mesh.coordinates), "losses": result.losses,
            "grads": [p.grad.clone() for p in stage.parameters()],
            "by_group": counter.by_group(),
            "peers": sorted({(r.kind, r.peer) for r in counter.records if r.kind in ("send", "recv")})}


@pytest.mark.needs_solution
@pytest.mark.timeout(180)
def test_pp2_tp2_pipeline_of_tensor_parallel_stages():
    from course.launch import launch

    results = launch(pp_tp_worker, 4, timeout=150)
    # One process, the same micro-batches through both dense stages.
    dense = [_dense_stage(0), _dense_stage(1)]
    inputs, targets = _pp_data()
    losses = {}
    for i, (x, t) in enumerate(zip(inputs, targets)):
        loss = _pp_loss(dense[1](dense[0](x)), t)
        loss.backward()
        losses[i] = loss.item()
    act_bytes = sum(MICRO) * WIDTH * 4  # every micro-batch's (n, WIDTH) float32 activation, once
    for rank, r in results.items():
        stage, _, _, tp = r["coordinates"]
        d = dense[stage]
        want = [d[0].weight.grad.chunk(2)[tp], d[0].bias.grad.chunk(2)[tp], d[2].weight.grad.chunk(2, dim=1)[tp],
                d[2].bias.grad]
        for got, w in zip(r["grads"], want):
            torch.testing.assert_close(got, w, rtol=1e-5, atol=1e-6, msg=f"rank {rank}: gradient differs")
        if stage == 1:
            assert r["losses"] == pytest.approx(losses, abs=1e-6)
        peer = rank + 2 if stage == 0 else rank - 2  # the same tp rank of the other stage
        assert r["peers"] == [("recv", peer), ("send", peer)], f"rank {rank} talked to {r['peers']}, not rank {peer}"
        m = len(MICRO)
        assert r["by_group"]["pp"] == {"send": {"count": m, "bytes": act_bytes, "traffic_bytes": act_bytes},
                                       "recv": {"count": m, "bytes": act_bytes, "traffic_bytes": 0.0}}
        tp_counts = r["by_group"]["tp"]
        # per micro-batch: g (row layer) all-reduces its output forward; f (column layer) all-reduces its input's
        # gradient backward -- on stage 1 only: stage 0's input is data, which needs no gradient
        per_micro = 2 if stage == 1 else 1
        assert set(tp_counts) == {"all_reduce"} and tp_counts["all_reduce"]["count"] == per_micro * m, tp_counts
        assert tp_counts["all_reduce"]["bytes"] == per_micro * act_bytes
        assert set(r["by_group"]) == {"pp", "tp"}, f"rank {rank} used groups {sorted(r['by_group'])}"
