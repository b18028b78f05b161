"""Finding where the ranks of a hung run diverged, from their flight-recorder dumps (assignment 5.4.4).

A run hangs when the ranks of a group stop asking for the same thing: one skips a collective, two post
sends and receives in crossed orders, one calls a collective on the wrong group, or with the wrong size.
Every rank's flight recorder (:mod:`course.flight_recorder`) kept the operations it posted; lined up, they
show the first place where the ranks disagree:

* a **collective** is the same operation on every member of its group, and the flight recorder numbers
  the collectives of each group 1, 2, 3, ... (``collective_seq_id``) on every member alike: the records of
  one group are lined up by that number — not by their place in a rank's list, which interleaves other
  groups and may have lost its oldest records (a ring buffer) — and the first number at which a member has
  nothing, or something else (operation, sizes, dtypes: :attr:`course.flight_recorder.Record.signature`),
  is the group's first divergence;
* a **send and a receive** are not numbered alike on the two ranks (``p2p_seq_id`` counts each rank's own
  point-to-point operations in the group, whoever the peer). NCCL matches messages between two ranks by
  their order alone, so the k-th send from rank a to rank b in a group meets b's k-th receive from a: the
  first k at which one is missing or their sizes differ is that pair's first divergence.

:func:`first_divergences` (the assignment) finds them; :func:`explain` says what they mean — a rank that
never came, a collective on the wrong group, receives posted before sends in a cycle —, and
``python -m communication.hang_lab RUN_DIR`` prints it for a recorded run.

Sources: PyTorch's flight recorder and its analyser ``torch.distributed.flight_recorder`` (``fr_trace``:
``components/builder.py``, ``build_collectives``; ``components/types.py``, ``Op.match``); NCCL documentation,
"Point-to-point communication".
"""
from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass, field
from pathlib import Path

from course.flight_recorder import Record, load_records


@dataclass(frozen=True)
class Divergence:
    """The first place where the ranks of one group (collectives) or one pair (point-to-point) disagree.

    ``seq`` is the collective's sequence number in the group, or for a pair the message's number (1, 2, ...)
    from ``pair[0]`` to ``pair[1]``. ``posted`` maps every member of the group that left a dump (for a pair: the
    sender, then the receiver) to its record at that place, or None where it posted nothing there."""

    group: str
    group_desc: str
    seq: int
    posted: dict[int, Record | None]
    pair: tuple[int, int] | None = None

    @property
    def kind(self) -> str:
        """``"missing"`` (some rank posted nothing there) or ``"mismatch"`` (all posted, not the same thing)."""
        return "missing" if any(r is None for r in self.posted.values()) else "mismatch"

    @property
    def ranks(self) -> tuple[int, ...]:
        """The rank(s) to look at: those that posted nothing; else those whose operation differs from what most
        ranks posted (every rank, when no operation has a majority)."""
        missing = tuple(sorted(r for r, rec in self.posted.items() if rec is None))
        if missing:
            return missing
        if self.pair is not None:
            return tuple(self.pair)
        counts: dict[tuple, int] = {}
        for rec in self.posted.values():
            counts[rec.signature] = counts.get(rec.signature, 0) + 1
        top = max(counts.values())
        if list(counts.values()).count(top) > 1:
            return tuple(sorted(self.posted))
        common = next(s for s, c in counts.items() if c == top)
        return tuple(sorted(r for r, rec in self.posted.items() if rec.signature != common))

    @property
    def op(self) -> str:
        """The operation posted there by the lowest rank that posted one (``"send"`` for a pair whose send exists)."""
        return next(rec.op for _, rec in sorted(self.posted.items()) if rec is not None)

    def key(self) -> tuple:
        """What two analyses must agree on: group, number, pair, and what each rank posted (or None)."""
        return (self.group, self.seq, self.pair,
                tuple(sorted((r, None if rec is None else (rec.op, rec.peer, rec.sizes, rec.dtypes))
                             for r, rec in self.posted.items())))

    def describe(self) -> str:
        where = f"group {self.group} ({self.group_desc})"
        head = (f"{where}, message {self.seq} from rank {self.pair[0]} to rank {self.pair[1]}" if self.pair
                else f"{where}, collective #{self.seq}")
        lines = [f"{head}: {self.kind}, rank(s) {list(self.ranks)}"]
        for rank, rec in sorted(self.posted.items()):
            lines.append(f"  rank {rank}: " + (rec.describe() if rec is not None else "posted nothing here"))
        return "\n".join(lines)


def first_divergences(records: dict[int, list[Record]]) -> list[Divergence]:
    """The first divergence of every process group and of every pair of ranks exchanging messages, in any order.

    Args:
        records: ``{rank: [Record, ...]}``, each rank's records in the order it posted them
            (:func:`course.flight_recorder.load_records`); a rank without a dump is absent and is not judged —
            neither as a member of a group nor as the other end of a message: nothing is known of what it posted.

    Returns:
        One :class:`Divergence` per group whose collectives diverge — lined up by ``seq`` among the group's
        members (``Record.group_ranks``) that have a dump, from the highest of the members' oldest kept ``seq``
        (older records may have left a rank's ring buffer), the **first** ``seq`` at which a member posted
        nothing or the ``Record.signature`` s differ (the signature leaves out the sizes of collectives whose
        sizes differ between ranks by design, such as an all-to-all with uneven splits) — and one per
        ``(group, sender, receiver)`` of two dumped ranks whose messages diverge: the k-th ``send`` from a to b
        (``Record.peer`` = b) against b's k-th ``recv`` from a in the same group, the first k at which one is
        missing (a send that no receive meets, as well as a receive that no send meets) or ``(sizes, dtypes)``
        differ (the same element count in another dtype is another count of bytes) (``Divergence.pair = (a, b)``,
        ``posted = {a: send or None, b: recv or None}``, ``seq = k``, counted from 1). Empty when the ranks agree.
    """
    # BEGIN ASSIGN5_4_4
    found: list[Divergence] = []
    groups: dict[str, Record] = {}
    collectives: dict[str, dict[int, dict[int, Record]]] = {}
    messages: dict[tuple, tuple[list[Record], list[Record]]] = {}
    for rank, recs in records.items():
        for rec in recs:
            groups.setdefault(rec.group, rec)
            if not rec.is_p2p:
                collectives.setdefault(rec.group, {}).setdefault(rank, {})[rec.seq] = rec
            else:
                key = (rec.group, rank, rec.peer) if rec.op == "send" else (rec.group, rec.peer, rank)
                messages.setdefault(key, ([], []))[0 if rec.op == "send" else 1].append(rec)
    for group, by_rank in collectives.items():
        members = [m for m in groups[group].group_ranks if m in records]
        start = max(min(by_rank[m]) for m in members if by_rank.get(m))
        for seq in sorted({s for m in members for s in by_rank.get(m, {}) if s >= start}):
            posted = {m: by_rank.get(m, {}).get(seq) for m in members}
            if None in posted.values() or len({rec.signature for rec in posted.values()}) > 1:
                found.append(Divergence(group, groups[group].group_desc, seq, posted))
                break
    for (group, src, dst), (sends, recvs) in messages.items():
        if src not in records or dst not in records:
            continue
        for k in range(max(len(sends), len(recvs))):
            send = sends[k] if k < len(sends) else None
            recv = recvs[k] if k < len(recvs) else None
            if send is None or recv is None or (send.sizes, send.dtypes) != (recv.sizes, recv.dtypes):
                found.append(Divergence(group, groups[group].group_desc, k + 1, {src: send, dst: recv}, (src, dst)))
                break
    return found
    # END ASSIGN5_4_4


@dataclass
class Diagnosis:
    """What a recorded run's dumps say: the divergences, the sentences of :func:`explain`, the ranks without a dump."""

    divergences: list[Divergence]
    sentences: list[str]
    undumped: list[int] = field(default_factory=list)

    def text(self) -> str:
        lines = list(self.sentences)
        if self.undumped:
            lines.append(f"no dump from rank(s) {self.undumped} (killed before it could write one?): "
                         "what they did is unknown")
        if self.divergences:
            lines += ["", "first divergences:"] + [d.describe() for d in self.divergences]
        return "\n".join(lines)


def explain(divergences: list[Divergence]) -> list[str]:
    """One sentence per cause: a rank that never posted a collective, a collective posted on another group
    (the same operation missing from one group and posted by that rank in another), sizes or operations that
    differ, receives waiting in a cycle (every rank receives before it sends), messages matched out of order, a
    message received into another dtype."""
    if not divergences:
        return ["the ranks agree: every collective and every message was posted by all of its ranks alike"]
    sentences, used = [], set()
    collective = [d for d in divergences if d.pair is None]

    def moved(d: Divergence, other: Divergence) -> list[int]:  # ranks missing from d that posted d's op in other
        expected = next(rec for rec in d.posted.values() if rec is not None).signature
        return [r for r in d.ranks if d.posted.get(r) is None and other.posted.get(r) is not None
                and other.posted[r].signature == expected]

    for i, d in enumerate(collective):  # a collective on the wrong group: missing here, posted by that rank elsewhere
        for other in collective[i + 1:]:
            if d.kind != "missing" or other.kind != "missing" or id(d) in used or id(other) in used:
                continue
            here, there = moved(d, other), moved(other, d)
            if not here and not there:
                continue
            sides = [f"rank {r} posted {other.posted[r].describe()} on group {other.group} ({other.group_desc}, "
                     f"#{other.seq})" for r in here]
            sides += [f"rank {r} posted {d.posted[r].describe()} on group {d.group} ({d.group_desc}, #{d.seq})"
                      for r in there]
            sentences.append("; ".join(sides) + ": the same collective on two groups, each side waiting for the "
                             "other in its own — a collective on the wrong group (a call that leaves out its group= "
                             "lands on the world group)")
            used.update({id(d), id(other)})
    for d in collective:
        if id(d) in used:
            continue
        first = next(rec for _, rec in sorted(d.posted.items()) if rec is not None)
        if d.kind == "missing":
            sentences.append(f"rank(s) {list(d.ranks)} never posted collective #{d.seq} of group {d.group} "
                             f"({d.group_desc}), {first.describe()}, which the other ranks wait in")
        else:
            sentences.append(f"the ranks of group {d.group} ({d.group_desc}) posted different operations as "
                             f"collective #{d.seq}: " + "; ".join(f"rank {r}: {rec.describe()}"
                                                                 for r, rec in sorted(d.posted.items()))
                             + f" — rank(s) {list(d.ranks)} differ")
    p2p = [d for d in divergences if d.pair is not None]
    waiting = {d.pair: d for d in p2p if d.posted[d.pair[0]] is None and d.posted[d.pair[1]] is not None}
    for (src, dst), d in sorted(waiting.items()):
        if (dst, src) in waiting and src < dst:
            sentences.append(f"ranks {src} and {dst} each wait to receive from the other before sending "
                             f"(crossed order): rank {dst} at {d.posted[dst].where or '?'}, rank {src} at "
                             f"{waiting[(dst, src)].posted[src].where or '?'} — a deadlock")
            used.update({id(d), id(waiting[(dst, src)])})
    for d in p2p:
        if id(d) in used:
            continue
        src, dst = d.pair
        send, recv = d.posted[src], d.posted[dst]
        if send is None:
            sentences.append(f"rank {dst} waits for message {d.seq} from rank {src} ({recv.describe()}), which "
                             f"rank {src} never sent")
        elif recv is None:
            sentences.append(f"rank {src} sent message {d.seq} to rank {dst} ({send.describe()}), which rank {dst} "
                             f"never received")
        elif send.sizes == recv.sizes:
            sentences.append(f"message {d.seq} from rank {src} to rank {dst}: sent as {send.describe()}, received "
                             f"into {recv.describe()} — the same element count in another dtype, so another count "
                             f"of bytes (NCCL reads the wrong ones, or waits for the rest): make the receive buffer "
                             f"in the sender's dtype")
        else:
            sentences.append(f"message {d.seq} from rank {src} to rank {dst}: sent as {send.describe()}, received "
                             f"into {recv.describe()} — the two ranks post their sends and receives in different "
                             f"orders (NCCL matches them by order alone)")
    return sentences


def diagnose(run_dir: str | Path, world_size: int | None = None) -> Diagnosis:
    """Load the dumps of ``run_dir`` (:func:`course.flight_recorder.load_records`), find the first divergences and
    explain them. ``world_size`` (else the dumps' own) names the ranks whose dump is missing.

    Raises:
        FileNotFoundError: no dumps in ``run_dir``.
    """
    import json

    records = load_records(run_dir)
    if world_size is None:
        first = json.loads(next(Path(run_dir).glob("rank*.json")).read_text())
        world_size = int(first.get("world_size", len(records)))
    divergences = first_divergences(records)
    undumped = [r for r in range(world_size) if r not in records]
    return Diagnosis(divergences, explain(divergences), undumped)


def main(argv: list[str] | None = None) -> int:
    """``python -m communication.hang_lab RUN_DIR``: print where the ranks of a recorded run diverged."""
    parser = argparse.ArgumentParser(prog="python -m communication.hang_lab",
                                     description="Where did the ranks of a hung run diverge? Reads the flight-"
                                                 "recorder dumps rank<r>.json of a run directory.")
    parser.add_argument("run_dir", help="the folder of the run's dumps (course.flight_recorder.launch_recorded)")
    parser.add_argument("--world_size", type=int, default=None, help="ranks of the run (default: from the dumps)")
    args = parser.parse_args(argv)
    try:
        diagnosis = diagnose(args.run_dir, args.world_size)
    except (FileNotFoundError, ValueError) as exc:
        parser.error(str(exc))
    print(diagnosis.text())
    return 0


if __name__ == "__main__":
    if __package__ in (None, ""):
        sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    raise SystemExit(main())
