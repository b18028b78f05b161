"""Rank 517 of a 1024-rank world, built in one process (project/fake_mesh.py), against the planner.

A 7B-class GPT-2 (``gpt3-6.7b``: 32 blocks, 4096 wide, 32 heads) on ``dp x pp x tp = 16 x 8 x 8``: the
course's own mesh, tensor-parallel pipeline stage and ZeRO classes build rank 517's shard on the meta device
over torch's fake process group, run one micro-batch's forward and backward, reduce the gradients and step
AdamW. The fake world runs in a subprocess (a process group, once made, would stay in the test process),
bounded in time; no test here depends on time or on the CPU's kernels (meta tensors compute nothing).
"""
import json
import subprocess
import sys
from pathlib import Path

import pytest

from course.dims import ParallelDims
from project.plan import PlanConfig, stage_communication, stage_layout

ROOT = Path(__file__).resolve().parents[2]
RANK, DP, PP, TP = 517, 16, 8, 8
VALUES = dict(preset="gpt3-6.7b", hardware="h100", dp=DP, pp=PP, tp=TP, vocab_size=50257, model_max_length=1024,
              batch_size=256, micro_batches=16, precision="fp32")
SCRIPT = """
import json, sys
from project.fake_mesh import measure
from project.plan import PlanConfig
values = json.loads(sys.argv[1])
print(json.dumps({z: measure(PlanConfig.for_test(**values, zero=z), {rank}) for z in (0, 1, 2, 3)}))
""".replace("{rank}", str(RANK))


@pytest.fixture(scope="module")
def found():
    done = subprocess.run([sys.executable, "-c", SCRIPT, json.dumps(VALUES)], cwd=ROOT, capture_output=True,
                          text=True, timeout=240, env={**__import__("os").environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stderr[-3000:]
    return {int(k): v for k, v in json.loads(done.stdout.strip().splitlines()[-1]).items()}


def config(zero):
    return PlanConfig.for_test(**VALUES, zero=zero)


def test_rank_517_has_the_coordinates_and_groups_of_the_arithmetic(found):
    dims = ParallelDims(dp=DP, pp=PP, tp=TP)
    c = dims.coordinates(RANK)
    mesh = found[0]["mesh"]
    assert mesh["rank"] == RANK and mesh["coordinates"] == {"pp": c.pp, "dp": c.dp, "cp": 0, "tp": c.tp}
    groups = mesh["groups"]
    assert groups["tp"] == [dims.rank_of(c.pp, c.dp, t) for t in range(TP)]
    assert groups["dp"] == [dims.rank_of(c.pp, d, c.tp) for d in range(DP)]
    assert groups["pp"] == [dims.rank_of(s, c.dp, c.tp) for s in range(PP)]
    assert RANK in groups["tp"] and RANK in groups["dp"] and RANK in groups["pp"]
    assert found[0]["stage"] == c.pp == 4


@pytest.mark.parametrize("zero", [0, 1, 2, 3])
def test_rank_517_holds_the_planners_bytes(found, zero):
    """Parameters and gradients exactly: the stage's 100,775,936 elements divide by dp = 16, so ZeRO's flat
    buffers need no padding (``memory.zero.shard_range``) and the bytes are the planner's element counts x 4.
    The optimizer state is the planner's plus Adam's step counters (one fp32 scalar per tensor stepped: the
    planner leaves them out, ``project.plan.stage_memory``), exactly."""
    got, plan = found[zero], config(zero)
    assert got["parameters"] == stage_layout(plan, got["stage"])["dense_params"]
    assert got["parameters"] % DP == 0  # no padding: the exact comparisons below hold
    planned = got["planned"]
    assert got["bytes"]["params"] == planned["params"]
    assert got["bytes"]["grads"] == planned["grads"]
    assert got["bytes"]["optimizer"] == planned["optimizer"] + 4 * got["step_counters"]
    blocks = len(got["blocks"])
    assert got["step_counters"] == {0: 12 * blocks, 1: 1, 2: 1, 3: blocks}[zero]  # 12 tensors per block


@pytest.mark.parametrize("zero", [0, 1, 2, 3])
def test_rank_517_collectives_are_the_planners(found, zero):
    """The tp all-reduces of one micro-batch (2 per block forward, 2 backward) and the dp calls of the
    gradient reduction and step: each call's bytes exact. ZeRO-0 here all-reduces each gradient on its own
    (``memory.training.ShardedStep``) where the planner counts one bucket: the total bytes are equal."""
    got, plan = found[zero], config(zero)
    calls = stage_communication(plan, got["stage"])
    tp = [c for c in calls if c["group"] == "tp" and c["kind"] == "all_reduce" and c["bytes"] > 8]
    fake_tp = [c for c in got["collectives"] if c["group"] == "tp"]
    assert len(tp) == 1 and {c["bytes"] for c in fake_tp} == {tp[0]["bytes"]}
    assert len(fake_tp) * plan.micro_batches == tp[0]["count"]
    planned_dp = {}
    for c in calls:
        if c["group"] == "dp" and c["bytes"] > 8:  # the 3D step's fp64 scalars do not run here
            planned_dp[c["kind"]] = planned_dp.get(c["kind"], 0) + c["bytes"] * c["count"]
    fake_dp = {}
    for c in got["collectives"]:
        if c["group"] == "dp":
            fake_dp[c["kind"]] = fake_dp.get(c["kind"], 0) + c["bytes"]
    fake_dp = {k: v for k, v in fake_dp.items() if v}  # ZeRO-3's root unit is empty on a middle stage
    assert fake_dp == pytest.approx(planned_dp, rel=0, abs=0)
    if zero in (1, 2):  # one flat buffer: one call of each kind, of the whole stage's bytes
        for c in got["collectives"]:
            if c["group"] == "dp":
                assert c["bytes"] == 4 * got["parameters"]
