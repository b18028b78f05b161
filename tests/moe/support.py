"""Helpers of the mixture-of-experts tests: layers with known weights, inputs that force a routing,
the workers the multi-rank tests launch, and the one-process references they are checked against.

The workers import neither ``transformers`` nor the test modules (only ``torch``, ``course`` and
``moe``), so spawning a rank stays cheap.
"""
from __future__ import annotations

import contextlib

import torch

from course.mesh import ParallelDims

HIDDEN, INNER = 8, 12


def this_rank_alone():
    """The expert-parallel group of a layer that holds every expert: ``MoELayer``'s ``group=None`` is the
    world, so a rank of a multi-rank worker that builds a one-process reference passes a group of itself
    alone (None in one process, where the world is that group)."""
    import torch.distributed as dist

    if not dist.is_initialized():
        return None
    return dist.new_group([dist.get_rank()], use_local_synchronization=True)


def make_layer(config, dtype=torch.float32, seed: int = 0, router: str = "random"):
    """A single-process :class:`moe.layer.MoELayer` (GPT-2 style experts) with seeded weights.

    ``router``: ``"random"``; ``"unused"`` (expert 0's logit far below the others for positive
    tokens: it never gets a token); ``"last-unused"`` (the same for the last expert); ``"one"`` (the last
    expert's logit far above: every token's first choice).
    """
    from moe.experts import MLPExperts
    from moe.layer import MoELayer

    gen = torch.Generator().manual_seed(seed)
    experts = MLPExperts(config.num_experts, HIDDEN, INNER, generator=gen)
    with torch.no_grad():  # biases too, so a wrong grouping of rows cannot hide behind zeros
        experts.c_fc_bias.copy_(torch.randn(experts.c_fc_bias.shape, generator=gen) * 0.5)
        experts.c_proj_bias.copy_(torch.randn(experts.c_proj_bias.shape, generator=gen) * 0.5)
        experts.c_fc_weight.mul_(20.0)
        experts.c_proj_weight.mul_(20.0)
    shared = None
    if config.shared_experts:  # from a generator of their own: the other weights do not depend on them
        shared_gen = torch.Generator().manual_seed(seed + 1)
        shared = MLPExperts(1, HIDDEN, INNER * config.shared_experts, generator=shared_gen)
        with torch.no_grad():
            shared.c_fc_weight.mul_(20.0)
            shared.c_proj_weight.mul_(20.0)
            shared.c_proj_bias.copy_(torch.randn(shared.c_proj_bias.shape, generator=shared_gen) * 0.5)
    layer = MoELayer(HIDDEN, config, experts, this_rank_alone(), shared=shared).to(dtype)
    with torch.no_grad():
        w = torch.randn(config.num_experts, HIDDEN, generator=gen) * 0.5
        if router == "unused":
            w[0] = -3.0
        elif router == "last-unused":
            w[-1] = -3.0
        elif router == "one":
            w[-1] = 3.0
        layer.router.weight.copy_(w)
        if config.router == "deepseek":  # a bias of the size of the sigmoid scores' spread: it changes choices
            layer.router.e_score_correction_bias.copy_(torch.randn(config.num_experts, generator=gen) * 0.1)
    return layer


def tokens(rank: int, count: int, dtype=torch.float32, seed: int = 0) -> torch.Tensor:
    """``count`` positive tokens (HIDDEN wide) of rank ``rank``."""
    gen = torch.Generator().manual_seed(1000 * seed + rank)
    return (torch.rand(count, HIDDEN, generator=gen) + 0.25).to(dtype)


def upstream(rank: int, count: int, dtype=torch.float32) -> torch.Tensor:
    """The fixed gradient G of the loss ``sum(out * G)`` on rank ``rank``."""
    return torch.randn(count, HIDDEN, generator=torch.Generator().manual_seed(77 + rank)).to(dtype)


def layer_loss(layer, x, rank):
    """``sum(layer(x) * G) + router loss``: every part of the layer gets a gradient."""
    out = layer(x).output
    return out, (out * upstream(rank, x.shape[0], x.dtype)).sum() + layer.router_loss()


def grads_of(module) -> dict[str, torch.Tensor]:
    return {name: p.grad.detach().clone() for name, p in module.named_parameters()}


def run_single(layer, x, rank) -> dict:
    """Output and gradients of the single-process ``layer`` on one rank's tokens (a fresh backward)."""
    layer.zero_grad(set_to_none=True)
    x = x.clone().requires_grad_(True)
    out, loss = layer_loss(layer, x, rank)
    loss.backward()
    return {"out": out.detach(), "x_grad": x.grad.detach(), "router": layer.router.weight.grad.detach().clone(),
            "experts": grads_of(layer.experts), "aux": layer.aux_loss.item(), "z": layer.z_loss.item()}


def expert_groups(dp: int, ep: int) -> dict[int, list[int]]:
    """Global rank -> the ranks of its ep group (dp ranks, cp = pp = tp = 1)."""
    dims = ParallelDims(dp=dp, ep=ep)
    return {r: dims.expert_group_ranks(r)["ep"] for r in range(dp)}


def expert_replicas(dp: int, ep: int) -> dict[int, list[int]]:
    """Global rank -> the ranks of its edp group."""
    dims = ParallelDims(dp=dp, ep=ep)
    return {r: dims.expert_group_ranks(r)["edp"] for r in range(dp)}


# ---- expert parallelism (a5_8_2) ------------------------------------------------------------------

# (name, MoEConfig arguments, router kind, tokens on each of 4 ranks)
EP_CASES = [
    ("top2-dropless", dict(num_experts=8, top_k=2), "random", [9, 14, 5, 11]),
    ("an-expert-without-tokens", dict(num_experts=8, top_k=2), "unused", [12, 7, 10, 9]),
    ("every-token-to-one-expert", dict(num_experts=8, top_k=1, normalize_gates=False), "one", [6, 13, 8, 10]),
    ("capacity-drops", dict(num_experts=4, top_k=2, capacity_factor=0.75), "random", [16, 9, 12, 7]),
    ("a-rank-without-tokens", dict(num_experts=4, top_k=2), "random", [10, 0, 8, 5]),
]
EP_SIZES = (4, 2)


EP_TOL = dict(rtol=1e-6, atol=1e-6)  # float32: the same sums in another order (tests/moe/test_expert_parallel.py)


def check_expert_parallel_rank(got: dict, ref: list[dict], rank: int, group: list[int], ep: int, where: str,
                               router: bool = False) -> None:
    """One rank's expert-parallel layer against the single-process layer (``ref``: its result on every rank's
    tokens, :func:`run_single`): the output and the input gradient (and, with ``router``, the router's gradient) are
    the single-process layer's on this rank's tokens; the gradient of each of its experts is the sum, over the ranks
    of its ep group (``group``), of the single-process gradients of those experts (they processed all of those
    ranks' tokens). ``EP_TOL``; ``where`` names the case in the messages."""
    torch.testing.assert_close(got["out"], ref[rank]["out"], **EP_TOL, msg=f"{where}: output")
    torch.testing.assert_close(got["x_grad"], ref[rank]["x_grad"], **EP_TOL, msg=f"{where}: input gradient")
    if router:
        torch.testing.assert_close(got["router"], ref[rank]["router"], **EP_TOL, msg=f"{where}: router gradient")
    per = ref[rank]["experts"]["c_fc_weight"].shape[0] // ep
    mine = slice(got["ep_rank"] * per, (got["ep_rank"] + 1) * per)
    for param, grad in got["experts"].items():
        wanted = sum(ref[r]["experts"][param][mine] for r in group)
        torch.testing.assert_close(grad, wanted, **EP_TOL,
                                   msg=f"{where}: gradient of its experts' {param} (summed over its ep group's tokens)")


def ep_config(case):
    from moe.config import MoEConfig

    return MoEConfig(**case[1])


class SplitSizeMismatch(AssertionError):
    """The split sizes of an all-to-all disagree between the ranks (found before the collective runs)."""


def split_table(rows: int, output_splits, input_splits, group) -> torch.Tensor:
    """``(p, 2p + 1)`` int64, row i from group rank i: the rows it sends to each rank, the rows it expects from
    each rank, the rows of its input. Gathered with ``torch.distributed.all_gather`` (not counted), on the
    device of the rank's tensors' group back-end: a tensor of fixed size, so it cannot hang on bad splits."""
    import torch.distributed as dist

    from course.collectives import group_size
    from course.launch import context

    p = group_size(group)
    equal = [rows // p] * p
    sent = list(input_splits) if input_splits is not None else equal
    expected = list(output_splits) if output_splits is not None else equal
    mine = torch.tensor((sent + [-1] * p)[:p] + (expected + [-1] * p)[:p] + [rows], dtype=torch.int64,
                        device=context().device)
    table = [torch.empty_like(mine) for _ in range(p)]
    dist.all_gather(table, mine, group=group)
    return torch.stack(table).cpu()


def check_split_sizes(rows: int, output_splits, input_splits, group) -> None:
    """Before an all-to-all: every rank's input splits sum to its rows, and what group rank i sends to j is
    what j expects from i, on every rank alike (all see the same table and raise together: no rank is left
    waiting in the collective, which on NCCL could hang or read the wrong rows instead of raising).

    Raises:
        SplitSizeMismatch: naming each disagreeing pair and what the split lists must hold.
    """
    from course.collectives import group_size

    p = group_size(group)
    if p == 1:
        return
    table = split_table(rows, output_splits, input_splits, group)
    sends, expects, held = table[:, :p], table[:, p:2 * p], table[:, 2 * p]
    problems = [f"group rank {i} sends {int(sends[i].sum())} rows but holds {int(held[i])}"
                for i in range(p) if int(sends[i].sum()) != int(held[i])]
    problems += [f"group rank {i} sends {int(sends[i, j])} rows to group rank {j}, which expects {int(expects[j, i])} "
                 f"from it" for i in range(p) for j in range(p) if int(sends[i, j]) != int(expects[j, i])]
    if problems:
        raise SplitSizeMismatch(
            "all-to-all split sizes disagree between the ranks (checked before the collective): "
            + "; ".join(problems[:6]) + (f"; and {len(problems) - 6} more" if len(problems) > 6 else "")
            + ". The output splits are the rows each rank sends here: exchange the expert counts first "
              "(received[i, e] = rows ep rank i sends to this rank's local expert e) and sum them per source rank; "
              "the backward pass sends the gradients back with the two split lists swapped.")


@contextlib.contextmanager
def split_sizes_checked():
    """Every ``course.collectives.all_to_all_single`` called by ``moe`` (and through ``course.collectives``)
    first runs :func:`check_split_sizes`; restored afterwards (pooled ranks are reused)."""
    from unittest import mock

    import course.collectives
    import moe.all_to_all
    import moe.expert_parallel

    original = course.collectives.all_to_all_single

    def checked(x, output_split_sizes=None, input_split_sizes=None, group=None):
        check_split_sizes(x.shape[0], output_split_sizes, input_split_sizes, group)
        return original(x, output_split_sizes, input_split_sizes, group=group)

    with contextlib.ExitStack() as stack:
        for module in (course.collectives, moe.all_to_all, moe.expert_parallel):
            stack.enter_context(mock.patch.object(module, "all_to_all_single", checked))
        yield


def expert_parallel_worker(rank: int, world_size: int, dtype=torch.float32, planted: str | None = None) -> dict:
    """Every case of :data:`EP_CASES` at ep = 4 and ep = 2 (dp = 4): the layer's output and gradients on
    this rank, and the communication it did, by group. Every all-to-all's split sizes are checked across
    the ranks before it runs (:func:`split_sizes_checked`). ``planted``: with a planted wrong solution
    (:mod:`tests.support.planting`)."""
    from tests.support.planting import planting

    with planting(planted), split_sizes_checked():
        return _expert_parallel_cases(rank, world_size, dtype)


LOW_PRECISION_CASE = "top2-dropless"  # run again with bf16 tokens and layer: what crosses the all-to-all


def _expert_parallel_cases(rank: int, world_size: int, dtype) -> dict:
    from course.mesh import Mesh

    out = {}
    for ep in EP_SIZES:
        mesh = Mesh.build(dp=world_size, ep=ep)
        for case in EP_CASES:
            out[(ep, case[0])] = _expert_parallel_case(mesh, ep, case, rank, dtype)
        case = next(c for c in EP_CASES if c[0] == LOW_PRECISION_CASE)
        out[(ep, "bf16")] = _expert_parallel_case(mesh, ep, case, rank, torch.bfloat16)
    return out


def _expert_parallel_case(mesh, ep: int, case, rank: int, dtype) -> dict:
    """One case on this rank: output, gradients, communication by group and pass, and ``row_element_bytes`` (the
    bytes per element of every all-to-all of token rows, (n, HIDDEN), that held any)."""
    from course.collectives import CommCounter
    from moe.layer import MoELayer

    config = ep_config(case)
    full = make_layer(config, dtype, router=case[2])
    layer = MoELayer(HIDDEN, config, full.experts.shard(mesh.ep_rank, ep), group=mesh.ep_group).to(dtype)
    with torch.no_grad():
        layer.router.weight.copy_(full.router.weight)
    x = tokens(rank, case[3][rank], dtype).requires_grad_(True)
    with CommCounter() as counter:
        y, loss = layer_loss(layer, x, rank)
        forward = counter.by_group()
        rows = [r for r in counter.records if r.kind == "all_to_all" and r.shape[1:] == (HIDDEN,)]
        counter.reset()
        loss.backward()
        backward = counter.by_group()
        rows += [r for r in counter.records if r.kind == "all_to_all" and r.shape[1:] == (HIDDEN,)]
    return {"out": y.detach(), "x_grad": x.grad, "router": layer.router.weight.grad, "experts": grads_of(layer.experts),
            "ep_rank": mesh.ep_rank, "forward": forward, "backward": backward, "aux": layer.aux_loss.item(),
            "row_element_bytes": sorted({r.bytes // (r.shape[0] * HIDDEN) for r in rows if r.shape[0]})}


# ---- the DeepSeek-style layer under expert parallelism (a5_8_4) -------------------------------------

DEEPSEEK_EP = dict(num_experts=8, top_k=2, router="deepseek", shared_experts=1, n_group=4, topk_group=2,
                   routed_scaling_factor=2.5)
DEEPSEEK_TOKENS = [13, 9]


def deepseek_parallel_worker(rank: int, world_size: int, planted: str | None = None) -> dict:
    """The DeepSeek-style layer (:data:`DEEPSEEK_EP`) with its experts over an ep group of all the ranks:
    this rank's output and gradients, and the communication by group; all-to-all split sizes checked."""
    from course.collectives import CommCounter
    from course.mesh import Mesh
    from moe.config import MoEConfig
    from moe.layer import MoELayer
    from tests.support.planting import planting

    with planting(planted), split_sizes_checked():
        mesh = Mesh.build(dp=world_size, ep=world_size)
        config = MoEConfig(**DEEPSEEK_EP)
        full = make_layer(config)
        layer = MoELayer(HIDDEN, config, full.experts.shard(mesh.ep_rank, world_size), group=mesh.ep_group,
                         shared=full.shared)
        layer.router.load_state_dict(full.router.state_dict())
        x = tokens(rank, DEEPSEEK_TOKENS[rank]).requires_grad_(True)
        with CommCounter() as counter:
            y, loss = layer_loss(layer, x, rank)
            loss.backward()
            comm = counter.by_group()
        return {"out": y.detach(), "x_grad": x.grad, "router": layer.router.weight.grad,
                "shared": grads_of(layer.shared), "experts": grads_of(layer.experts), "comm": comm}


# ---- EP x DP gradients (a5_8_3) ------------------------------------------------------------------

SYNC_EP_SIZES = (1, 2, 4)
SYNC_TOKENS = [9, 14, 6, 11]  # per rank: the loss is each rank's mean, so unequal counts matter


class ToyMoENet(torch.nn.Module):
    """Dense layer, MoE layer (over ``group``), dense head: both kinds of parameters, without GPT-2."""

    def __init__(self, config, group=None, ep_rank: int = 0, ep: int = 1):
        from moe.layer import MoELayer

        super().__init__()
        gen = torch.Generator().manual_seed(5)
        self.inp, self.head = torch.nn.Linear(HIDDEN, HIDDEN), torch.nn.Linear(HIDDEN, 3)
        with torch.no_grad():
            for p in (*self.inp.parameters(), *self.head.parameters()):
                p.copy_(torch.randn(p.shape, generator=gen) * 0.5)
        full = make_layer(config)
        self.moe = MoELayer(HIDDEN, config, full.experts.shard(ep_rank, ep) if ep > 1 else full.experts, group)
        with torch.no_grad():
            self.moe.router.weight.copy_(full.router.weight)

    def forward(self, x):
        return self.head(self.moe(torch.tanh(self.inp(x))).output)

    def expert_parameters(self):
        return list(self.moe.experts.parameters())

    def dense_parameters(self):
        experts = {id(p) for p in self.expert_parameters()}
        return [p for p in self.parameters() if id(p) not in experts]

    def loss(self, x, rank):
        target = torch.randn(x.shape[0], 3, generator=torch.Generator().manual_seed(300 + rank))
        return ((self(x) - target) ** 2).sum(-1).mean() + self.moe.router_loss()


def sync_config():
    from moe.config import MoEConfig

    return MoEConfig(num_experts=4, top_k=2, aux_loss_coef=0.1, z_loss_coef=0.01)


# Meshes of 4 ranks whose dp x cp group is smaller than the world (the other ranks are tp or pp peers, which
# hold the same experts and dense weights, or another stage's): name -> Mesh.build arguments.
WIDER_MESHES = {"dp2-tp2-ep2": dict(dp=2, tp=2, ep=2), "pp2-dp2-ep1": dict(pp=2, dp=2, ep=1)}


def _synced(mesh, ep: int, replica: int) -> dict:
    """:class:`ToyMoENet`'s gradients after the backward pass of the tokens of dp x cp rank ``replica`` and
    ``sync_moe_gradients`` over ``mesh``'s groups, with the groups the all-reduces ran in."""
    from course.collectives import CommCounter
    from moe.gradients import sync_moe_gradients

    model = ToyMoENet(sync_config(), mesh.ep_group, mesh.ep_rank, ep)
    model.loss(tokens(replica, SYNC_TOKENS[replica]), replica).backward()
    with CommCounter() as counter:
        sync_moe_gradients(model, mesh.dp_cp_group, mesh.edp_group)
    return {"grads": {n: p.grad.clone() for n, p in model.named_parameters()}, "ep_rank": mesh.ep_rank,
            "groups": counter.by_group()}


def gradient_sync_worker(rank: int, world_size: int, planted: str | None = None) -> dict:
    """One backward pass of :class:`ToyMoENet` on this rank's tokens and ``sync_moe_gradients`` over the
    mesh's groups, at dp = 4 and every ep of :data:`SYNC_EP_SIZES` (keys: the ep), and on each mesh of
    :data:`WIDER_MESHES` (keys: its name), where a rank takes the tokens of its dp rank (its tp or pp peers
    take the same): the gradients and the groups used. ``planted``: with a planted wrong solution
    (:mod:`tests.support.planting`)."""
    from course.mesh import Mesh
    from tests.support.planting import planting

    out = {}
    with planting(planted):
        for ep in SYNC_EP_SIZES:
            out[ep] = _synced(Mesh.build(dp=world_size, ep=ep), ep, rank)
        for name, sizes in WIDER_MESHES.items():
            mesh = Mesh.build(**sizes)
            out[name] = _synced(mesh, sizes["ep"], mesh.dp_rank)
    return out


def sync_reference(replicas: int = 4) -> dict:
    """The gradients of one process: the mean over the losses of ``replicas`` dp ranks, every expert here."""
    model = ToyMoENet(sync_config())
    loss = sum(model.loss(tokens(rank, SYNC_TOKENS[rank]), rank) for rank in range(replicas)) / replicas
    loss.backward()
    return {n: p.grad.clone() for n, p in model.named_parameters()}


SGD_LR = 0.1  # the trajectory tests' learning rate (plain SGD: see training_worker)


class RecordingSGD(torch.optim.SGD):
    """Plain SGD (``w -= lr * g``) that keeps, at every step, each parameter's gradient (by name) before stepping."""

    def __init__(self, named_parameters, lr: float):
        named = list(named_parameters)
        super().__init__([p for _, p in named], lr=lr)
        self.names, self.grads = [n for n, _ in named], []

    def step(self, closure=None):
        params = self.param_groups[0]["params"]
        self.grads.append({n: p.grad.detach().clone() for n, p in zip(self.names, params)})
        return super().step(closure)


def training_worker(rank: int, world_size: int, args) -> dict:
    """The MoE training of ``project/run_moe.py`` (:func:`moe.training.moe_training` on the dp x ep mesh,
    run by the one epoch runner) on Multi30k with its AdamW replaced by plain SGD (:data:`SGD_LR`), then, on
    rank 0, the same steps done by one process (:func:`moe.training.accumulated_step`) from the same
    initial weights. Returns the per-step losses, every step's gradients and the final weights of both.

    SGD, not AdamW, so that the trajectory is exact: Adam divides each gradient element by the root of its
    second moment, which turns a rounding-size gradient difference in an element with a tiny gradient into
    a learning-rate-size weight difference (and hides a constant factor in the gradients); SGD's weights
    differ by ``lr x`` the summed gradient differences, and every step's gradients are compared."""
    import copy
    import json

    from course.epoch_runner import run_epochs
    from course.mesh import Mesh
    from course.task import prepare_data, worker_env_quiet
    from moe.training import accumulated_step, build_moe_model, moe_training, shard_batches

    worker_env_quiet()
    data = prepare_data(args)
    mode = moe_training(args, data, Mesh.build(dp=world_size, ep=args.ep))
    model = mode.model
    mode.optimizer = RecordingSGD(model.named_parameters(), SGD_LR)
    results = [json.loads(open(path).read()) for path in run_epochs(mode)]
    mine = {"losses": [x for r in results for x in r["train_losses"]],
            "ep_rank": model.moe_layers[0].group.rank() if args.ep > 1 else 0,
            "state": {n: p.detach().clone() for n, p in model.named_parameters()}, "grads": mode.optimizer.grads}
    if rank != 0:
        return mine
    one = build_moe_model(copy.copy(args), data.tokenizer.vocab_size, group=this_rank_alone())
    optimizer = RecordingSGD(one.named_parameters(), SGD_LR)
    loaders = [shard_batches(data.train, args.batch_size, r, args.dp, data.collate, args.seed, args.max_batches)[0]
               for r in range(args.dp)]
    losses = [accumulated_step(one, optimizer, list(shards), "cpu") for shards in zip(*loaders)]
    mine["reference"] = {"losses": losses, "state": {n: p.detach().clone() for n, p in one.named_parameters()},
                         "grads": optimizer.grads}
    return mine
