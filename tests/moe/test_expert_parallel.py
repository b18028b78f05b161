"""Assignment 5.8.2 — expert parallelism: count exchange, all-to-all dispatch and combine (graded).

Four gloo ranks (dp = 4) run the MoE layer with its experts shared out over ep = 4 ranks (one ep
group) and over ep = 2 ranks (two ep groups, [0, 1] and [2, 3]), each rank with tokens of its own
(different numbers of them). The single-process layer with every expert, run in this process on
each rank's tokens, is the reference, to 1e-6 (float32):

* each rank's output, input gradient and router gradient = the single-process layer's on its
  tokens;
* each rank's expert gradients = the sum, over the ranks of its ep group, of the single-process
  gradients of those experts (the experts processed all those ranks' tokens);
* all communication stays in the ep group;
* every all-to-all's split sizes agree between the ranks — what rank i sends to j is what j expects from
  i, and each rank sends the rows it holds — checked on the ranks before the collective runs
  (``tests/moe/support.py``, ``split_sizes_checked``): counts not exchanged, received counts read
  transposed, output splits taken from the local counts, or a backward pass that does not swap the
  splits fail there with a message about the counts, not inside gloo (on NCCL such splits can hang or
  read the wrong rows instead of raising).

bf16 tokens and layer (the top-2 dropless case): the rows cross the all-to-all as bf16, 2 bytes an element, and the
output and input gradient are bf16 (a dispatch that casts the rows to float32 would send twice the bytes).

Cases: top-2 dropless; an expert that no token chooses; every token choosing one expert (top-1:
that expert's rank receives everything, the others nothing); a capacity that drops choices (dropping
is decided on each rank before dispatch); a rank with no token at all.
"""
from __future__ import annotations

import functools

import pytest
import torch

from tests.moe.support import EP_CASES, EP_SIZES, check_expert_parallel_rank, ep_config, expert_groups, \
    expert_parallel_worker, make_layer, run_single, tokens

pytestmark = pytest.mark.a5_8_2

WORLD = 4


@functools.lru_cache(maxsize=None)
def runs(planted=None):
    from course.launch import launch

    return launch(expert_parallel_worker, WORLD, torch.float32, planted, timeout=120, collective_timeout=60)


@functools.lru_cache(maxsize=None)
def reference(name):
    case = next(c for c in EP_CASES if c[0] == name)
    layer = make_layer(ep_config(case), router=case[2])
    return [run_single(layer, tokens(rank, case[3][rank]), rank) for rank in range(WORLD)]


@pytest.mark.timeout(180)
@pytest.mark.parametrize("ep", EP_SIZES)
@pytest.mark.parametrize("name", [c[0] for c in EP_CASES])
def test_expert_parallel_layer_equals_the_single_process_layer(ep, name):
    ref = reference(name)
    groups = expert_groups(WORLD, ep)
    if name == "an-expert-without-tokens":
        assert all(r["experts"]["c_fc_weight"][0].abs().max() == 0 for r in ref), "expert 0 must get no token"
    for rank in range(WORLD):
        got = runs()[rank][(ep, name)]
        where = f"ep {ep}, rank {rank}"
        check_expert_parallel_rank(got, ref, rank, groups[rank], ep, where, router=True)
        for phase in ("forward", "backward"):
            assert set(got[phase]) <= {"ep"}, f"{where}: {phase} communication outside the ep group: {sorted(got[phase])}"
        assert "all_to_all" in got["forward"].get("ep", {}) and "all_to_all" in got["backward"].get("ep", {}), \
            f"{where}: tokens travel by all-to-all in both passes"


@pytest.mark.timeout(180)
@pytest.mark.parametrize("ep", EP_SIZES)
def test_bf16_rows_travel_and_return_as_bf16(ep):
    for rank in range(WORLD):
        got = runs()[rank][(ep, "bf16")]
        where = f"ep {ep}, rank {rank}, bf16 tokens"
        assert got["out"].dtype == torch.bfloat16 and got["x_grad"].dtype == torch.bfloat16, (
            f"{where}: output {got['out'].dtype}, input gradient {got['x_grad'].dtype}; the layer keeps the tokens' "
            "dtype")
        assert got["row_element_bytes"] == [2], (
            f"{where}: the token rows crossed the all-to-all with {got['row_element_bytes']} bytes an element; bf16 "
            "rows travel as bf16 (2 bytes), not cast to float32")
