"""The rank that failed is the one named, whatever words the transport used for its peers' errors.

A 1F1B pipeline of 4 stages (tiny GPT-2, ``project/train.py --mode pipeline``'s worker) is started 8 times, and
each time one rank — every rank in turn, twice — is SIGKILLed from outside while the stages exchange activations
and gradients (it says when it has begun its second training step; the kill lands during the steps after). Its
peers' sends and receives then fail in gloo's words for a lost peer ("Connection closed by peer", "Connection reset
by peer", ...), in whatever order they reach the launcher; the report must name the killed rank, from the exit
statuses and the order the ranks ended in (course/rank_failures.py, ``cause_of_failure``), every time. The runs are
started with ``--overwrite`` over an earlier run's results, which every failed run must leave as they were.

``cause_of_failure`` itself is checked on the words NCCL uses (its watchdog's timeout, ``ncclRemoteError``, an
aborted communicator) and on a rank that raised an error of its own among peers that lost it.
"""
from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import pytest

from course.launch import RankFailure, launch
from course.rank_failures import LOST_PEER, cause_of_failure
from course.results import write_results

pytestmark = pytest.mark.fresh_processes  # every run loses a rank: processes of its own, never a pool's

PP = 4


@pytest.fixture(scope="module")
def config(tmp_path_factory):
    from project.options.run_pipeline import PipelineConfig

    workdir = tmp_path_factory.mktemp("pipeline") / "work"
    return PipelineConfig.for_test(schedule="1f1b", pp=PP, micro_batches=2, batch_size=8, preset="tiny",
                                   max_batches=1000, n_bleu=0, max_val_batches=1, vocab_size=1000,
                                   max_train_examples=2000, model_max_length=32, device="cpu", quiet=True,
                                   overwrite=True, workdir=str(workdir))


def _earlier_results(workdir: Path) -> dict[str, str]:
    """An earlier run's results in ``workdir`` (what ``--overwrite`` would replace once a run succeeds)."""
    for rank in range(PP):
        write_results(workdir, rank, 0, {"validation_loss": 1.0 + rank, "bleu": 0.0, "training_time": 1.0,
                                         "tokens_per_sec": 1.0, "config": {"mode": "earlier run"}},
                      prefix="pipeline_1f1b_")
    return {p.name: p.read_text() for p in workdir.glob("pipeline_1f1b_*")}


@pytest.mark.needs_solution
@pytest.mark.timeout(600)
def test_each_killed_rank_of_a_four_stage_pipeline_is_the_one_named(config, tmp_path):
    from tests.support.killed_rank import marked_train_worker

    workdir = Path(config.workdir)
    before = _earlier_results(workdir)
    named, messages = [], []
    for victim in [*range(PP), *range(PP)]:
        marker = tmp_path / f"kill{len(named)}"

        def kill_when_marked():
            deadline = time.monotonic() + 300
            while not marker.exists() and time.monotonic() < deadline:
                time.sleep(0.005)
            if marker.exists():
                os.kill(int(marker.read_text()), signal.SIGKILL)

        killer = threading.Thread(target=kill_when_marked, daemon=True)
        killer.start()
        with pytest.raises(RankFailure) as info:
            launch(marked_train_worker, PP, config, victim, 2, str(marker), device="cpu", timeout=300,
                   collective_timeout=300)
        killer.join(timeout=5)
        named.append(info.value.rank)
        messages.append(str(info.value))
        assert str(info.value).startswith(f"rank {victim} failed: killed by SIGKILL"), str(info.value)[:3000]
    assert named == [*range(PP), *range(PP)], named
    # the failed runs replaced nothing: the earlier results are there, unchanged, and nothing of theirs was published
    assert {p.name: p.read_text() for p in workdir.glob("pipeline_1f1b_*")} == before
    peers_lost = sum(LOST_PEER.search(m.split("\n", 1)[-1]) is not None for m in messages)
    assert peers_lost, "no report showed a peer's lost-connection error: the kills did not land mid-communication"


GLOO_LOST = ["RuntimeError: [/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by peer "
             "[127.0.0.1]:4513",
             "RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:598] Read error [127.0.0.1]:29500: "
             "Connection reset by peer",
             "RuntimeError: [gloo/transport/tcp/pair.cc:575] Write error [127.0.0.1]:13025: Broken pipe",
             "RuntimeError: [gloo/transport/tcp/unbound_buffer.cc:81] Timed out waiting 30000ms for recv operation "
             "to complete",
             "torch.distributed.DistNetworkError: failed to recv, got 0 bytes"]
NCCL_LOST = ["torch.distributed.DistBackendError: NCCL error in: ProcessGroupNCCL.cpp:1970, remote process exited or "
             "there was a network error, NCCL version 2.21.5\nncclRemoteError: A call failed possibly due to a "
             "network error or a remote process exiting prematurely.",
             "RuntimeError: NCCL error: unhandled system error, ncclSystemError: System call (e.g. socket, malloc) or "
             "external library call failed or device error. It can be also caused by unexpected exit of a remote "
             "peer.",
             "[Rank 1] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=6, OpType=ALLREDUCE, "
             "NumelIn=1, NumelOut=1, Timeout(ms)=600000) ran for 600043 milliseconds before timing out.",
             "RuntimeError: NCCL communicator was aborted on rank 2.",
             "RuntimeError: Some NCCL operations have failed or timed out. Due to the asynchronous nature of CUDA "
             "kernels, subsequent GPU operations might run on corrupted/incomplete data."]


@pytest.mark.parametrize("text", GLOO_LOST + NCCL_LOST)
def test_every_lost_peer_wording_of_gloo_and_nccl_is_recognised(text):
    assert LOST_PEER.search(text), text
    # rank 0 lost its peer first (any wording), rank 2 was killed: rank 2 is the cause
    assert cause_of_failure({0: text, 1: text}, [2], {0: 0, 1: 0, 2: -signal.SIGKILL}) == ("died", 2)
    # nobody died: the error of its own, not the peers' lost connections
    own = "ValueError: planted failure on rank 3"
    assert cause_of_failure({0: text, 3: own, 1: text}, [], {}) == ("raised", 3)


def test_the_cause_is_decided_from_exit_statuses_and_order_of_deaths():
    lost = GLOO_LOST[1]
    abort = -signal.SIGABRT
    # NCCL's watchdog aborts the peers (SIGABRT) of a rank that was killed: the killed one is the cause even when
    # an aborted peer was seen to end first
    assert cause_of_failure({}, [1, 2, 3], {1: abort, 2: -signal.SIGKILL, 3: abort}) == ("died", 2)
    assert cause_of_failure({0: lost}, [3, 1], {3: abort, 1: abort}) == ("died", 3)  # the first aborted
    assert cause_of_failure({2: lost, 0: lost}, [], {}) == ("lost", 2)  # a hang: the caller asks where each rank is
    assert cause_of_failure({}, [1], {1: 0}) == ("died", 1)  # exited without reporting
    with pytest.raises(ValueError):
        cause_of_failure({}, [], {})


def test_a_rank_that_raised_is_named_when_its_peers_report_first():
    """Order of arrival alone does not decide: rank 0's lost-peer error arrives before rank 1's own."""
    assert cause_of_failure({0: GLOO_LOST[0], 1: "ValueError: bad batch"}, [], {0: 0, 1: 0}) == ("raised", 1)
