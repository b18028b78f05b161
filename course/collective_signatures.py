"""Rule 6 of the emulated NCCL rules (:mod:`course.nccl_rules`), the part that needs no process group: the
**signature** of one collective call — which collective, its tensor's dtype and shape, its root and reduce op, and
the elements it puts in for each rank of the group and expects from each — and its comparison across the group.

NCCL matches a group's collectives by the order in which each rank issues them and nothing else; every rank must
issue the same collectives in the same order with sizes that agree. For an all-to-all the splits may be uneven: the
pair rule is that rank i's ``input_split_sizes[j]`` equals rank j's ``output_split_sizes[i]`` (the same rule covers
all-gather, reduce-scatter and the equal-count collectives, whose "to" and "from" lists are uniform). Only element
counts are compared, as NCCL does: shapes appear in the message only.

A signature is a list of ints (``HEADER + 2 p`` for a group of ``p``), so that :mod:`course.nccl_rules` can send it
to the other members as one int64 tensor. Sources: NCCL's documentation, "Collective Operations" and "Group
Calls"; ``ProcessGroupNCCL::alltoall_base`` (the split sizes become per-peer sends and receives).
"""
from __future__ import annotations

import itertools

import torch
import torch.distributed as dist
from torch.distributed import distributed_c10d as c10d

COLLECTIVES = ("all_reduce", "all_gather", "all_gather_into_tensor", "reduce_scatter", "reduce_scatter_tensor",
               "broadcast", "barrier", "all_to_all", "all_to_all_single", "reduce", "gather", "scatter",
               "all_gather_object", "broadcast_object_list")
# A signature: HEADER int64 fields, then what the call moves to each group rank and from each (elements):
_VALID, _OP, _DTYPE, _ROOT, _REDUCE, _IN_UNIT, _OUT_UNIT, _NDIM = range(8)
_MAX_DIMS = 8  # dimensions of the call's tensor kept for the message
HEADER = 8 + _MAX_DIMS
_ALL_DTYPES = sorted({v for v in vars(torch).values() if isinstance(v, torch.dtype)}, key=str)  # same in every rank
_REDUCE_OPS = {int(v): k for k, v in dist.ReduceOp.RedOpType.__members__.items()}
OBJECT_COLLECTIVES = ("all_gather_object", "broadcast_object_list")



def _moves(name: str, a: dict, p: int, group) -> tuple:
    """What the call ``name`` with bound arguments ``a`` moves in a group of ``p``: ``(tensor, root, reduce op,
    to[p], from[p], to_unit, from_unit)`` — the call's main tensor (for its dtype and shape), the root's group
    rank (-1: none), the reduce op's code (-1: none), the elements it puts in for each group rank and expects
    from each, and the elements per split unit (an all-to-all's rows) for the message. Raises on arguments torch
    would refuse (the caller lets torch say so)."""
    def root(key):
        given, group_given = a.get(key), a.get(f"group_{key}")
        return c10d._canonicalize_group_rank(group, given, group_given, return_global=False)

    def reduce_op():
        op = a.get("op")
        return int(op) if isinstance(op, dist.ReduceOp.RedOpType) else -2  # -2: a ReduceOp object (premul_sum)

    zeros = [0] * p
    if name in ("all_reduce", "broadcast", "reduce"):
        t = a["tensor"]
        n = t.numel()
        if name == "all_reduce":
            return t, -1, reduce_op(), [n] * p, [n] * p, 1, 1
        r = root("src" if name == "broadcast" else "dst")
        at_root = [n] * p if dist.get_group_rank(group, dist.get_rank()) == r else zeros
        one = [n if i == r else 0 for i in range(p)]  # the root sends to (broadcast) or receives from every rank
        return (t, r, -1, at_root, one, 1, 1) if name == "broadcast" else (t, r, reduce_op(), one, at_root, 1, 1)
    if name == "all_gather":
        t = a["tensor"]
        return t, -1, -1, [t.numel()] * p, [x.numel() for x in a["tensor_list"]], 1, 1
    if name == "all_gather_into_tensor":
        t = a["input_tensor"]
        return t, -1, -1, [t.numel()] * p, [a["output_tensor"].numel() // p] * p, 1, 1
    if name == "reduce_scatter":
        t = a["output"]
        return t, -1, reduce_op(), [x.numel() for x in a["input_list"]], [t.numel()] * p, 1, 1
    if name == "reduce_scatter_tensor":
        t = a["input"]
        return t, -1, reduce_op(), [t.numel() // p] * p, [a["output"].numel()] * p, 1, 1
    if name == "all_to_all_single":
        t, out = a["input"], a["output"]
        units = [int(torch.Size(x.shape[1:]).numel()) for x in (t, out)]
        splits = [list(s) if s else [x.shape[0] // p] * p
                  for s, x in ((a["input_split_sizes"], t), (a["output_split_sizes"], out))]
        return (t, -1, -1, [int(s) * units[0] for s in splits[0]], [int(s) * units[1] for s in splits[1]],
                units[0], units[1])
    if name == "all_to_all":
        ins, outs = a["input_tensor_list"], a["output_tensor_list"]
        return ins[0] if ins else None, -1, -1, [x.numel() for x in ins], [x.numel() for x in outs], 1, 1
    if name in ("gather", "scatter"):
        t, r = a["tensor"], root("dst" if name == "gather" else "src")
        mine = dist.get_group_rank(group, dist.get_rank())
        lst = a["gather_list" if name == "gather" else "scatter_list"]
        at_root = [x.numel() for x in lst] if mine == r else zeros
        one = [t.numel() if i == r else 0 for i in range(p)]
        return (t, r, -1, one, at_root, 1, 1) if name == "gather" else (t, r, -1, at_root, one, 1, 1)
    if name == "broadcast_object_list":
        return None, root("src"), -1, zeros, zeros, 1, 1
    return None, -1, -1, zeros, zeros, 1, 1  # barrier, all_gather_object: nothing to compare but the call


def signature(name: str, a: dict, p: int, group) -> list[int]:
    """The signature of one collective call, ``HEADER + 2 p`` ints (see the field names above); a call whose
    arguments cannot be read (torch will refuse them) gets ``_VALID = 0`` and is not compared."""
    sig = [0] * (HEADER + 2 * p)
    sig[_OP] = COLLECTIVES.index(name)
    sig[_DTYPE] = sig[_ROOT] = sig[_REDUCE] = sig[_NDIM] = -1
    try:
        t, root, reduce, to, came, to_unit, from_unit = _moves(name, a, p, group)
        if len(to) != p or len(came) != p:
            return sig
    except Exception:  # noqa: BLE001 - torch raises its own error on these arguments
        return sig
    sig[_VALID], sig[_ROOT], sig[_REDUCE], sig[_IN_UNIT], sig[_OUT_UNIT] = 1, root, reduce, to_unit, from_unit
    if t is not None and name not in OBJECT_COLLECTIVES:
        sig[_DTYPE], sig[_NDIM] = _ALL_DTYPES.index(t.dtype), t.dim()
        dims = list(t.shape)[:_MAX_DIMS]
        sig[8:8 + len(dims)] = dims
    sig[HEADER:] = [int(x) for x in (*to, *came)]
    return sig


def describe(sig: list[int], members: list[int]) -> str:
    """One collective call in words, from its signature (ranks are global)."""
    p = len(members)
    name = COLLECTIVES[sig[_OP]]
    if not sig[_VALID]:
        return f"{name} (arguments torch refuses)"
    words = name
    if sig[_REDUCE] != -1:
        words += f"({_REDUCE_OPS.get(sig[_REDUCE], 'a ReduceOp object')})"
    if sig[_ROOT] != -1:
        words += f", root rank {members[sig[_ROOT]]}"
    if sig[_DTYPE] != -1:
        ndim = sig[_NDIM]
        shape = sig[8:8 + min(ndim, _MAX_DIMS)] + (["..."] if ndim > _MAX_DIMS else [])
        words += f", {str(_ALL_DTYPES[sig[_DTYPE]]).removeprefix('torch.')} [{', '.join(map(str, shape))}]"
    to, came = sig[HEADER:HEADER + p], sig[HEADER + p:]
    if name == "all_to_all_single":
        to_unit, from_unit = max(sig[_IN_UNIT], 1), max(sig[_OUT_UNIT], 1)
        rows = f"{to_unit}" if to_unit == from_unit else f"{to_unit} and {from_unit}"
        words += (f", input_split_sizes {[x // to_unit for x in to]}, output_split_sizes "
                  f"{[x // from_unit for x in came]} (rows of {rows} elements)")
    elif name in ("all_to_all", "all_gather", "reduce_scatter", "gather", "scatter"):  # lists: sizes per rank
        words += f", elements to each group rank {to}, from each {came}"
    return words


def mismatch(sigs: list[list[int]], members: list[int]) -> tuple[int, int, str] | None:
    """The first disagreement between the signatures ``sigs`` (one per group rank) of one collective:
    ``(group rank a, group rank b, what differs)``, or None when they match (or one rank's arguments are refused
    by torch, which then says so itself)."""
    if not all(sig[_VALID] for sig in sigs):
        return None
    for field, what in ((_OP, "they issue different collectives"), (_DTYPE, "the dtypes differ"),
                        (_ROOT, "the roots differ"), (_REDUCE, "the reduce ops differ")):
        for b, sig in enumerate(sigs):
            if sig[field] != sigs[0][field]:
                return 0, b, what
    p = len(members)
    for i, j in itertools.product(range(p), range(p)):
        sent, expected = sigs[i][HEADER + j], sigs[j][HEADER + p + i]  # what i puts in for j, what j expects from i
        if sent == expected:
            continue
        if sigs[0][_OP] == COLLECTIVES.index("all_to_all_single"):
            to_unit, from_unit = max(sigs[i][_IN_UNIT], 1), max(sigs[j][_OUT_UNIT], 1)
            return i, j, (f"rank {members[i]}'s input_split_sizes[{j}] is {sent // to_unit} rows ({sent} elements), "
                          f"rank {members[j]}'s output_split_sizes[{i}] {expected // from_unit} rows ({expected} "
                          "elements)")
        return i, j, (f"rank {members[i]} puts in {sent} elements for rank {members[j]}, whose call expects "
                      f"{expected} from rank {members[i]}")
    return None


def mismatch_message(n: int, label: str, members: list[int], sigs: list[list[int]], found: tuple[int, int, str]) -> str:
    """The error of collective #``n`` of the group ``label`` whose signatures ``sigs`` disagree as ``found``
    (:func:`mismatch`) says."""
    i, j, what = found
    i, j = min(i, j), max(i, j)
    p = len(members)
    everyone = "".join(f"  rank {members[r]}: {describe(sigs[r], members)}\n" for r in range(p))
    everyone = f"Every rank of the group:\n{everyone}" if p > 2 else ""
    return (
        f"collective #{n} of group {label} (ranks {members}) does not match between rank {members[i]} "
        f"and rank {members[j]}: {what}.\n  rank {members[i]}: {describe(sigs[i], members)}\n  rank {members[j]}: "
        f"{describe(sigs[j], members)}\n{everyone}"
        "NCCL matches a group's collectives by the order each rank issues them, nothing else: every rank of the group "
        "must issue the same collectives in the same order, with sizes that agree (an all-to-all's splits may be "
        "uneven, but rank i's input_split_sizes[j] must equal rank j's output_split_sizes[i]). Otherwise NCCL hangs "
        "or moves the wrong bytes; gloo aborts with an unrelated error, or runs.")
