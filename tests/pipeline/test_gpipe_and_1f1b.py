"""Assignment 5.2.4 — multi-process pipeline with GPipe and 1F1B schedules (graded).

* The action lists follow the definitions (Narayanan et al. 2021, Sec. 2.2.1): GPipe runs
  every forward, then every backward; 1F1B on rank r of p starts with p - r - 1 warm-up
  forwards, then alternates one forward, one backward, and ends with the remaining
  backwards; each micro-batch is forwarded before its backward; all micro-batches are
  done; at most p - rank micro-batches are in flight.
* A real 3-process run (one stage per process, point-to-point send/recv) gives the same
  gradients and losses as one process training the same micro-batches.
"""
import pytest
import torch
from torch import nn

from pipeline.schedules import gpipe_actions, one_f_one_b_actions

pytestmark = pytest.mark.a5_2_4

CONFIGS = [(1, 1), (1, 3), (2, 1), (2, 4), (3, 2), (3, 3), (4, 4), (4, 7), (5, 2)]  # (p, m)


def F(*ids):
    return [("F", i) for i in ids]


def B(*ids):
    return [("B", i) for i in ids]


def _in_flight_peak(actions):
    live, peak = set(), 0
    for kind, i in actions:
        (live.add if kind == "F" else live.discard)(i)
        peak = max(peak, len(live))
    return peak


def _check_common(actions, m):
    assert sorted(actions) == sorted(F(*range(m)) + B(*range(m))), "every micro-batch once forward, once backward"
    position = {a: n for n, a in enumerate(actions)}
    assert all(position[("F", i)] < position[("B", i)] for i in range(m)), "a backward before its forward"
    assert [a for a in actions if a[0] == "F"] == F(*range(m)), "forwards in micro-batch order"


@pytest.mark.parametrize("p,m", CONFIGS)
def test_gpipe_actions_all_forwards_then_all_backwards(p, m):
    for rank in range(p):
        actions = gpipe_actions(rank, p, m)
        _check_common(actions, m)
        assert actions[:m] == F(*range(m)), f"rank {rank}: GPipe runs all forwards first"
        assert _in_flight_peak(actions) == m


def test_one_f_one_b_golden_lists():
    # p = 4, m = 6 (Narayanan et al. 2021, Fig. 4 top, with 6 micro-batches)
    assert one_f_one_b_actions(0, 4, 6) == F(0, 1, 2) + F(3) + B(0) + F(4) + B(1) + F(5) + B(2) + B(3, 4, 5)
    assert one_f_one_b_actions(1, 4, 6) == F(0, 1) + F(2) + B(0) + F(3) + B(1) + F(4) + B(2) + F(5) + B(3) + B(4, 5)
    assert one_f_one_b_actions(3, 4, 6) == [a for i in range(6) for a in (("F", i), ("B", i))]
    # fewer micro-batches than the warm-up would take
    assert one_f_one_b_actions(0, 4, 2) == F(0, 1) + B(0, 1)


@pytest.mark.parametrize("p,m", CONFIGS)
def test_one_f_one_b_actions_follow_the_definition(p, m):
    for rank in range(p):
        actions = one_f_one_b_actions(rank, p, m)
        _check_common(actions, m)
        warmup = min(p - rank - 1, m)
        assert actions[:warmup] == F(*range(warmup)), f"rank {rank}: {warmup} warm-up forwards"
        steady = actions[warmup:warmup + 2 * (m - warmup)]
        assert steady == [a for k in range(m - warmup) for a in (("F", warmup + k), ("B", k))], \
            f"rank {rank}: steady state alternates one forward and one backward: {actions}"
        assert actions[warmup + 2 * (m - warmup):] == B(*range(m - warmup, m)), f"rank {rank}: cool-down backwards"
        assert _in_flight_peak(actions) <= p - rank, f"rank {rank} holds more than p - rank micro-batches"


# ---- a real multi-process run -----------------------------------------------------------

WIDTH, P, MICRO_SIZES = 5, 3, [2, 2, 3, 1, 2]  # micro-batches of unequal size: shapes travel with the data


def _full_model():
    torch.manual_seed(7)
    return nn.Sequential(*[nn.Sequential(nn.Linear(WIDTH, WIDTH), nn.Tanh()) for _ in range(P)])


def _data():
    g = torch.Generator().manual_seed(3)
    inputs = [torch.randn(s, WIDTH, generator=g) for s in MICRO_SIZES]
    targets = [torch.randn(s, WIDTH, generator=g) for s in MICRO_SIZES]
    return inputs, targets


def _loss(output, target):
    return ((output - target) ** 2).mean() / len(MICRO_SIZES)


def pipeline_worker(rank, world_size, schedules, planted=None):
    """Each rank runs its stage under every schedule; returns its gradients, losses and peaks. ``planted``: with a
    planted wrong solution (:mod:`tests.support.planting`)."""
    from tests.support.planting import planting

    with planting(planted):
        return _pipeline_runs(rank, world_size, schedules)


def _pipeline_runs(rank, world_size, schedules):
    from pipeline.stage_runner import StageRunner
    from pipeline.schedules import schedule_actions
    from course.launch import context

    device = context().device
    stage = _full_model()[rank].to(device)
    runner = StageRunner(stage, device, loss_fn=_loss)
    inputs, targets = _data()
    out = {}
    for schedule in schedules:
        stage.zero_grad(set_to_none=True)
        result = runner.run(schedule_actions(schedule, rank, world_size, len(MICRO_SIZES)),
                            inputs if rank == 0 else None,
                            [t.to(device) for t in targets] if rank == world_size - 1 else None)
        out[schedule] = {"grads": [p.grad.detach().cpu().clone() for p in stage.parameters()],
                         "losses": dict(result.losses), "peak_in_flight": result.peak_in_flight}
    return out


@pytest.mark.timeout(240)
def test_multiprocess_gradients_equal_single_process_training():
    from course.launch import launch
    from tests.support.launching import GRADED_COLLECTIVE_TIMEOUT

    check_pipeline_runs(launch(pipeline_worker, P, ["gpipe", "1f1b"], timeout=150,
                               collective_timeout=GRADED_COLLECTIVE_TIMEOUT))


def check_pipeline_runs(results):

    model = _full_model()
    inputs, targets = _data()
    losses = {}
    for i, (x, t) in enumerate(zip(inputs, targets)):
        loss = _loss(model(x), t)
        loss.backward()
        losses[i] = float(loss.detach())
    m = len(MICRO_SIZES)
    for schedule in ("gpipe", "1f1b"):
        for rank in range(P):
            got = results[rank][schedule]["grads"]
            want = [p.grad for p in model[rank].parameters()]
            assert len(got) == len(want)
            for g, w in zip(got, want):
                torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-6,
                                           msg=f"{schedule}: rank {rank}'s gradients differ from single-process")
        last = results[P - 1][schedule]["losses"]
        assert sorted(last) == list(range(m))
        for i in range(m):
            # the same micro-batch through the same layers (the processes split the model, not the sums): its loss
            # can differ only by a matmul's blocking, a few 2^-24 ~ 6e-8 of a loss of O(1)
            assert abs(last[i] - losses[i]) < 1e-6
        peaks = [results[rank][schedule]["peak_in_flight"] for rank in range(P)]
        if schedule == "gpipe":
            assert peaks == [m] * P
        else:
            assert peaks == [min(P - rank, m) for rank in range(P)], f"1F1B in-flight micro-batches {peaks}"
