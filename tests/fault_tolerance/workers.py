"""Workers of the DiLoCo tests (assignment 5.1.4; spawned ranks import them by name).

Each rank is one replica group (one process). The model is a small MLP in float64 (exact comparisons: the design's
rule for trajectories), each rank trains on batches of its own (seeded by rank and step).
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from tests.support.planting import planting

IN, HIDDEN, OUT, BATCH = 8, 16, 4, 6
H, ROUNDS, INNER_LR = 3, 3, 0.05


def mlp() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(IN, HIDDEN), torch.nn.Tanh(),
                               torch.nn.Linear(HIDDEN, OUT)).to(torch.float64)


def loss_of(model, rank: int, step: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(1000 * rank + step)
    x = torch.randn(BATCH, IN, generator=g, dtype=torch.float64)
    y = torch.randn(BATCH, OUT, generator=g, dtype=torch.float64) + rank  # the groups' data differ
    return torch.nn.functional.mse_loss(model(x), y)


def flat(model) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()]).clone()


class _Done:
    """A finished ``Work`` (what torchft's DiLoCo waits on)."""

    def __init__(self, tensor):
        self.tensor = tensor

    def wait(self, timeout=None) -> bool:
        return True


class GroupManager:
    """The part of ``torchft.Manager`` that ``torchft.local_sgd.DiLoCo`` calls, over a plain process group whose
    ranks are always all in the quorum: ``allreduce`` is torchft's ``ReduceOp.AVG`` (a sum, then divided by the
    number of participants), every step commits."""

    _use_async_quorum = False

    def __init__(self, group=None):
        self.group, self.step = group, 0

    def start_quorum(self, *args, **kwargs) -> None:
        pass

    def allreduce(self, tensor, should_quantize=False, reduce_op=None):
        dist.all_reduce(tensor, group=self.group)
        tensor /= dist.get_world_size(self.group)
        return _Done(tensor)

    def should_commit(self, timeout=None) -> bool:
        self.step += 1
        return True

    def current_step(self) -> int:
        return self.step

    def register_state_dict_fn(self, *args) -> None:
        pass

    def allow_state_dict_read(self) -> None:
        pass

    def disallow_state_dict_read(self) -> None:
        pass


def ours(rank: int, h: int, rounds: int, inner, outer_lr: float, momentum: float, group=None) -> list[torch.Tensor]:
    """The course's DiLoCo over ``group``: the weights after each outer step."""
    from fault_tolerance.diloco import DiLoCo

    model = mlp()
    diloco = DiLoCo(model, inner(model.parameters()), sync_every=h, outer_lr=outer_lr, outer_momentum=momentum,
                    group=group)
    after = []
    for step in range(h * rounds):
        diloco.inner_optimizer.zero_grad()
        loss_of(model, rank, step).backward()
        if diloco.step():
            after.append(flat(model))
    return after


def torchft_diloco(rank: int, h: int, rounds: int, inner, outer_lr: float, momentum: float,
                   group=None) -> list[torch.Tensor]:
    """torchft's own DiLoCo (``torchft.local_sgd.DiLoCo``, one fragment) on the same data."""
    from torchft.local_sgd import DiLoCo as TorchftDiLoCo

    model = mlp()
    inner_optimizer = inner(model.parameters())
    outer = torch.optim.SGD(model.parameters(), lr=outer_lr, momentum=momentum, nesterov=momentum > 0)
    after = []
    with TorchftDiLoCo(GroupManager(group), [model], inner_optimizer, outer, sync_every=h):
        for step in range(h * rounds):
            inner_optimizer.zero_grad()
            loss_of(model, rank, step).backward()
            inner_optimizer.step()  # its hooks take the outer step every h-th
            if (step + 1) % h == 0:
                after.append(flat(model))
    return after


def data_parallel_sgd(rank: int, steps: int, lr: float) -> list[torch.Tensor]:
    """Synchronous data parallelism with SGD: each step, the gradient averaged over the ranks (written out here, not
    the graded ``average_gradients``)."""
    model = mlp()
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    after = []
    for step in range(steps):
        optimizer.zero_grad()
        loss_of(model, rank, step).backward()
        for p in model.parameters():
            dist.all_reduce(p.grad)
            p.grad /= dist.get_world_size()
        optimizer.step()
        after.append(flat(model))
    return after


SUBGROUPS = ([0, 1], [2])  # the "subgroups" case: DiLoCo over groups that are not the world


def diloco_worker(rank: int, world_size: int, planted: str | None = None) -> dict:
    """The cases of ``tests/fault_tolerance/test_diloco_rendezvous.py`` on this rank: ``{case: {"ours": [...],
    "reference": [...]}}`` — the weights after each outer step (each data-parallel step for ``h1``); ``subgroups``:
    over this rank's group of :data:`SUBGROUPS` (every rank makes both, in the same order)."""
    adamw = lambda params: torch.optim.AdamW(params, lr=INNER_LR)  # noqa: E731
    sgd = lambda params: torch.optim.SGD(params, lr=0.1)  # noqa: E731
    groups = [dist.new_group(ranks) for ranks in SUBGROUPS]
    mine = next(g for g, ranks in zip(groups, SUBGROUPS) if rank in ranks)
    with planting(planted):
        return {
            "torchft": {"ours": ours(rank, H, ROUNDS, adamw, 0.7, 0.9),
                        "reference": torchft_diloco(rank, H, ROUNDS, adamw, 0.7, 0.9)},
            "h1": {"ours": ours(rank, 1, 4, sgd, 1.0, 0.0), "reference": data_parallel_sgd(rank, 4, 0.1)},
            "subgroups": {"ours": ours(rank, H, ROUNDS, adamw, 0.7, 0.9, mine),
                          "reference": torchft_diloco(rank, H, ROUNDS, adamw, 0.7, 0.9, mine)},
        }
