"""Which part of the sequence each rank of the cp group holds: contiguous or zig-zag (assignment 5.7.2).

With causal attention, a query sees only the keys before it. Cut a sequence into ``cp``
contiguous shards and the rank holding the last shard has queries that see every key, the rank
holding the first only its own: the ring's work per rank grows with the rank (rank r computes
``r + 1`` of the ``cp`` blocks of keys), and every step waits for the busiest rank.

The **zig-zag** layout (Brandon et al. 2023, "Striped Attention", Sec. 3, discuss the imbalance;
Megatron-LM's context parallelism and PyTorch's ``context_parallel`` "head-tail" load balancer
use this layout) cuts the sequence into ``2 cp`` chunks and gives rank r chunks ``r`` and
``2 cp - 1 - r``: one from the front, one from the back, so every rank has the same number of
(query, key) pairs to compute.

For cp = 4 and a sequence of 8 chunks::

    contiguous:  rank 0: chunk 0     rank 1: chunk 1     rank 2: chunk 2     rank 3: chunk 3   (cp chunks)
    zig-zag:     rank 0: 0 and 7     rank 1: 1 and 6     rank 2: 2 and 5     rank 3: 3 and 4   (2 cp chunks)

Ulysses uses the contiguous layout: after its all-to-all every rank holds whole sequences, and
the work is the same on every rank whatever the layout.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

LAYOUTS = ("contiguous", "zigzag")


def chunk_ids(layout: str, cp_rank: int, cp: int) -> tuple[list[int], int]:
    """The chunks of the sequence that rank ``cp_rank`` of a cp group of ``cp`` ranks holds.

    Returns:
        ``(chunks, chunk_count)``: the indices of this rank's chunks in the order it stores them, and
        how many equal chunks the sequence is cut into (``cp`` contiguous, ``2 cp`` zig-zag).

    Raises:
        ValueError: an unknown layout, or ``cp_rank`` outside ``0 .. cp - 1``.
    """
    if layout not in LAYOUTS:
        raise ValueError(f"unknown layout {layout!r}; choose one of {LAYOUTS}")
    if not 0 <= cp_rank < cp:
        raise ValueError(f"cp_rank {cp_rank} is outside 0..{cp - 1}")
    # BEGIN ASSIGN5_7_2
    if layout == "contiguous":
        return [cp_rank], cp
    return [cp_rank, 2 * cp - 1 - cp_rank], 2 * cp
    # END ASSIGN5_7_2


@dataclass(frozen=True)
class SequenceLayout:
    """How a sequence of ``seq_len`` tokens is shared out over a cp group of ``cp`` ranks.

    Raises (at construction):
        ValueError: an unknown layout; ``seq_len`` not divisible by the number of chunks
            (``cp`` contiguous, ``2 cp`` zig-zag).
    """

    kind: str
    cp: int
    seq_len: int

    def __post_init__(self):
        if self.kind not in LAYOUTS:
            raise ValueError(f"unknown layout {self.kind!r}; choose one of {LAYOUTS}")
        if self.cp < 1:
            raise ValueError(f"cp must be >= 1, not {self.cp}")
        n = self.chunk_count
        if self.seq_len % n:
            fit = -(-self.seq_len // n) * n
            raise ValueError(f"the {self.kind} layout cuts a sequence into {n} equal chunks over cp = {self.cp} "
                             f"ranks, but {self.seq_len} tokens are not divisible by {n}; pad the sequences to a "
                             f"multiple of {n} (e.g. {fit})")

    @property
    def chunk_count(self) -> int:
        return self.cp if self.kind == "contiguous" else 2 * self.cp

    @property
    def chunk_len(self) -> int:
        return self.seq_len // self.chunk_count

    @property
    def local_len(self) -> int:
        """Tokens per rank: ``seq_len / cp``."""
        return self.seq_len // self.cp

    def chunks(self, cp_rank: int) -> list[int]:
        """Indices of the chunks rank ``cp_rank`` holds (:func:`chunk_ids`)."""
        chunks, n = chunk_ids(self.kind, cp_rank, self.cp)
        if n != self.chunk_count or len(chunks) != n // self.cp or not all(0 <= i < n for i in chunks):
            raise ValueError(f"chunk_ids({self.kind!r}, {cp_rank}, {self.cp}) returned {chunks} of {n} chunks; "
                             f"expected {self.chunk_count // self.cp} of {self.chunk_count}")
        return chunks

    def positions(self, cp_rank: int) -> torch.Tensor:
        """The global positions (local_len,) int64 (CPU) of the tokens rank ``cp_rank`` holds, in its order."""
        c = self.chunk_len
        return torch.cat([torch.arange(i * c, (i + 1) * c, device="cpu") for i in self.chunks(cp_rank)])

    def shard(self, x: torch.Tensor, dim: int, cp_rank: int) -> torch.Tensor:
        """Rank ``cp_rank``'s part of ``x`` along ``dim`` (of size ``seq_len``): its chunks, concatenated."""
        if x.size(dim) != self.seq_len:
            raise ValueError(f"dim {dim} of x has {x.size(dim)} tokens, the layout {self.seq_len}")
        pieces = x.chunk(self.chunk_count, dim=dim)
        return torch.cat([pieces[i] for i in self.chunks(cp_rank)], dim=dim)

    def unshard(self, shards: list[torch.Tensor], dim: int) -> torch.Tensor:
        """The whole sequence from every rank's shard (``shards[r]`` from rank r), in position order."""
        pieces: dict[int, torch.Tensor] = {}
        for rank, shard in enumerate(shards):
            for i, piece in zip(self.chunks(rank), shard.split(self.chunk_len, dim=dim)):
                pieces[i] = piece
        return torch.cat([pieces[i] for i in range(self.chunk_count)], dim=dim)


def check_layout(layout: SequenceLayout, cp: int, q: torch.Tensor, k: torch.Tensor) -> None:
    """Raise ``ValueError`` (naming what to change) unless ``layout`` is a :class:`SequenceLayout` for a cp
    group of ``cp`` ranks whose shards are as long as this rank's queries ``q`` and keys ``k``
    (batch, heads, local_len, head_dim)."""
    if not isinstance(layout, SequenceLayout):
        raise ValueError(f"layout must be a SequenceLayout (or None: contiguous), not {type(layout).__name__}")
    if layout.cp != cp:
        raise ValueError(f"the layout is for cp = {layout.cp} ranks, the group has {cp}; build it as "
                         f"SequenceLayout({layout.kind!r}, {cp}, seq_len)")
    if q.size(-2) != layout.local_len or k.size(-2) != layout.local_len:
        raise ValueError(f"each rank holds {layout.local_len} of the {layout.seq_len} positions, but q has "
                         f"{q.size(-2)} and k {k.size(-2)}")


def causal_pairs(layout: SequenceLayout, cp_rank: int) -> int:
    """(query, key) pairs rank ``cp_rank`` computes in causal ring attention: for each of its
    queries, the keys at or before it, wherever they are held. The work of the rank in units of
    one query-key product (the tiles it computes approach this /block_size**2 for small tiles)."""
    return int(sum(int(p) + 1 for p in layout.positions(cp_rank)))
