"""Asynchronous checkpoints (course.checkpoint.save_checkpoint_async, ``--async_checkpoint``), ungraded.

Two gloo ranks hold a save in flight with a slow writer (each rank's write waits
``$LLMSYS_CHECKPOINT_WRITE_DELAY`` s, as on a slow file system) and look at the checkpoint folder from
the training side: the save returns at once (the state is staged in host memory), the weights change
right after and the checkpoint still holds the staged values; while the files are written ``latest``
names the previous checkpoint and the new one exists only as ``step....tmp`` (a save is never reported
complete before its files are); once waited for, it is committed (renamed, ``latest`` replaced).
What a killed run does with a save in flight: tests/course/test_fail_safe.py.
"""
from __future__ import annotations

import pytest

DELAY = 3.0


@pytest.mark.timeout(120)
def test_an_async_save_overlaps_training_and_is_committed_only_once_written(tmp_path, monkeypatch):
    from course.checkpoint import WRITE_DELAY
    from course.launch import launch
    from tests.support.async_checkpoint import async_save_worker

    monkeypatch.setenv(WRITE_DELAY, str(DELAY))
    out = launch(async_save_worker, 2, str(tmp_path), device="cpu", backend="gloo", timeout=90)
    for rank, r in out.items():
        # Checked on the state of the write, not on how long calls took: the write (held DELAY s) had not
        # completed when the save returned (so it did not block, and wait() had a write to wait for), and the
        # checkpoint is committed only after wait(). (Only a process kept off a core for the whole DELAY between
        # the write's start and the save's return could see it otherwise.)
        assert r["written_at_return"] is False, f"rank {rank}: the async save returned only once its files were written"
        assert r["during"]["latest"] == "step00000001", f"rank {rank}: latest named {r['during']['latest']} mid-write"
        assert not r["during"]["final_exists"] and r["during"]["tmp_exists"], r["during"]
        assert r["during"]["committed"] is False
        assert r["after"] == {"latest": "step00000002", "folder": "step00000002", "committed": True,
                              "tmp_exists": False}, r["after"]
        # the staged values, not the ones the weights had when the files were written
        assert (r["own"], r["shared"], r["steps"]) == (2.0 + rank, 2.0, 2), r
    assert sorted(p.name for p in tmp_path.iterdir()) == ["latest", "step00000001", "step00000002"]
