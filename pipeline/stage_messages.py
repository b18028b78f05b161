"""The messaging of a pipeline stage: what its actions hand over and receive, carried in lock-step.

A :class:`pipeline.stage_runner.StageRunner` owns one :class:`StageMessages`. An action's
:meth:`StageMessages.post` (what the runner's ``send`` calls) does not send at once, and
:meth:`StageMessages.take` (the runner's ``recv``) does not wait: the runner gathers every rank's
action list (:meth:`StageMessages.plan`, collective in the pipeline's group), lays them out on a
common clock of unit steps (:func:`pipeline.metrics.communication_plan`) and, between actions, carries
out the batches of that plan (:meth:`StageMessages.communicate`) — every message leaves in one batch
with the other messages of its step, and the rank that consumes it receives it in its batch of the
same step. That lock-step is what makes the pipeline safe under NCCL's point-to-point rules
(docs/architecture.md, "Point-to-point under NCCL's rules"); a send that posted at once, followed by
a blocking receive from the same neighbour, would wait forever on GPUs where both neighbours do it.

Messages are named by what consumes them — ``("F", i, s)``, the input of micro-batch ``i`` on
virtual stage ``s``; ``("B", i, s)``, the gradient of that stage's output — and matched by their
order in the plan's batches (NCCL has no tags). A message between two chunks of the same rank
never leaves it.

Source: Narayanan et al. 2021, Megatron-LM, Sec. 2.2 and 4.1 (point-to-point between stages).
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from course.collectives import global_rank, group_size
from pipeline.metrics import communication_plan
from pipeline.placement import rank_of
from pipeline.p2p import exchange_tensors


class StageMessages:
    """The outbox and mailbox of one rank's stage, and the plan that carries them.

    Args:
        group: the pipeline's process group (the mesh's ``pp`` group); None: the world. Peers are
            this group's ranks; messages travel to their global ranks (:func:`course.collectives.global_rank`).
        device: this rank's device; received tensors are put there (NCCL: CUDA).
        stage_index, n_stages: this rank's stage ``s`` and the number of stages ``p``.
        virtual_stages: this rank's chunks ``v`` (virtual stages ``c * p + s``; with the V placement ``s`` and ``2p - 1 - s``).
        placement: ``"loop"`` or ``"v"`` (:func:`pipeline.placement.stage_of`): which rank holds a virtual stage.

    Before each action the runner names it with :meth:`at`; :meth:`post` and :meth:`take` then address
    the neighbouring virtual stage of that action. :meth:`start` empties the boxes for a step.
    """

    def __init__(self, group, device: torch.device, stage_index: int, n_stages: int, virtual_stages: int,
                 placement: str = "loop"):
        self.group, self.device, self.placement = group, device, placement
        self.stage_index, self.n_stages, self.virtual_stages = stage_index, n_stages, virtual_stages
        self._plans: dict = {}
        self.start()

    def start(self) -> None:
        """Empty boxes and no current action: the start of a step."""
        self._outbox: dict = {}
        self._mailbox: dict = {}
        self.at("F", None, self.stage_index)

    def at(self, kind: str, micro_batch: int | None, virtual_stage: int) -> None:
        """The action that the coming :meth:`send` / :meth:`recv` belong to: ``kind`` ``"F"``/``"B"``/``"W"`` of
        ``micro_batch`` on ``virtual_stage``."""
        self._kind, self._micro, self.virtual_stage = kind, micro_batch, virtual_stage

    def _neighbour(self, stage: int, direction: str) -> int:
        """The virtual stage that ``stage`` names for the current action; checks it is the right neighbour."""
        step = 1 if (self._kind == "F") == (direction == "send") else -1
        expected = self.stage_index + step
        if stage % self.n_stages != expected % self.n_stages:
            verb = "sends to" if direction == "send" else "receives from"
            raise ValueError(f"in a {'forward' if self._kind == 'F' else 'backward'}, stage {self.stage_index} "
                             f"{verb} stage {expected}, not {stage}")
        return self.virtual_stage + step

    def post(self, tensor: torch.Tensor, stage: int) -> None:
        """Hand ``tensor`` over to stage ``stage`` for the current action (see
        :meth:`pipeline.stage_runner.StageRunner.send`, which documents it for the schedules' steps).

        Raises:
            ValueError: ``tensor`` is None; ``stage`` is not the neighbour the action sends to; nothing follows.
        """
        if tensor is None:  # the usual cause: the received activation was not made to require grad
            raise ValueError(f"stage {self.stage_index} was asked to send None to stage {stage}: in a backward this is "
                             "the input's .grad, which stays None when the activation received in the forward was "
                             "not made to require grad — call .requires_grad_() on what recv() returns (see recv)")
        target = self._neighbour(stage, "send")
        if not 0 <= target < self.virtual_stages * self.n_stages:
            raise ValueError(f"virtual stage {self.virtual_stage} is the {'last' if self._kind == 'F' else 'first'} "
                             f"one: its {'forward' if self._kind == 'F' else 'backward'} sends nothing")
        message = (self._kind, self._micro, target)
        if rank_of(target, self.n_stages, self.placement) == self.stage_index:  # the next chunk is on this rank: no communication
            self._mailbox[message] = tensor.detach()
        else:
            self._outbox[message] = tensor

    def take(self, stage: int) -> torch.Tensor:
        """The tensor stage ``stage`` handed over for the current action (see
        :meth:`pipeline.stage_runner.StageRunner.recv`).

        Raises:
            ValueError: ``stage`` is not the neighbour the action receives from, or nothing comes.
        """
        self._neighbour(stage, "recv")
        message = (self._kind, self._micro, self.virtual_stage)
        if message not in self._mailbox:
            raise ValueError(f"nothing comes to virtual stage {self.virtual_stage} for {self._kind}{self._micro}: the "
                             f"{'first' if self._kind == 'F' else 'last'} virtual stage "
                             f"{'takes its input from the data' if self._kind == 'F' else 'starts from its loss'}")
        return self._mailbox.pop(message)

    def communicate(self, ops: list[tuple]) -> None:
        """Carry out one batch of the plan: send what this rank's actions handed over, receive what comes.

        Raises:
            ValueError: a message of the batch that no action handed over.
        """
        sends, sources, names = [], [], []
        for kind, peer, message in ops:
            if kind == "send":
                if message not in self._outbox:
                    what = "output" if message[0] == "F" else "input's gradient"
                    raise ValueError(f"{'F' if message[0] == 'F' else 'B'}{message[1]} of this rank should have sent "
                                     f"its {what} to virtual stage {message[2]} (call send() in the step)")
                sends.append((self._outbox.pop(message), global_rank(self.group, peer)))
            else:
                sources.append(global_rank(self.group, peer))
                names.append(message)
        for message, tensor in zip(names, exchange_tensors(sends, sources, self.device, self.group)):
            self._mailbox[message] = tensor

    def plan(self, actions: list[tuple]) -> dict:
        """This rank's part of the communication plan of every rank's ``actions`` (gathered in the group:
        collective), ``{"steps": [step of each action], "batches": {step: [(kind, peer, message)]}}``;
        the last plan is kept for the next step with the same lists."""
        if group_size(self.group) == 1:
            everyone = [list(actions)]
        else:
            everyone = [None] * self.n_stages
            dist.all_gather_object(everyone, list(actions), group=self.group)
        key = tuple(tuple(map(tuple, a)) for a in everyone)
        if key not in self._plans:
            self._plans = {key: communication_plan([list(map(tuple, a)) for a in everyone], self.placement)}
        return self._plans[key][self.stage_index]

    def check_delivered(self) -> None:
        """Raises ValueError if a message was handed over that no batch of the plan carried."""
        if self._outbox:
            raise ValueError(f"messages {sorted(self._outbox)} were sent but no step of the plan carries them")
