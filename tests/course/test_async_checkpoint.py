"""Asynchronous checkpoints (course.checkpoint.save_checkpoint_async, ``--async_checkpoint``), ungraded.

Two gloo ranks hold a save in flight with a slow writer (each rank's write waits
``$LLMSYS_CHECKPOINT_WRITE_DELAY`` s, as on a slow file system) and look at the checkpoint folder from
the training side: the save returns at once (the state is staged in host memory), the weights change
right after and the checkpoint still holds the staged values; while the files are written ``latest``
names the previous checkpoint and the new one exists only as ``step....tmp`` (a save is never reported
complete before its files are); once waited for, it is committed (renamed, ``latest`` replaced).
What a killed run does with a save in flight: tests/course/test_fail_safe.py.

The pipeline runs at pp = 3 and 4 (``project/run_pipeline.py --async_checkpoint``): the middle stages are in no
embedding group, so they hold fewer groups than the end stages unless the mesh evens that out; the
checkpoint group then never met under one name and every rank waited in its creation (issue 38, item 1).
Each run writes its checkpoints in the background and finishes; a run resumed from the first checkpoint
repeats the uninterrupted run's per-step losses from there.
"""
from __future__ import annotations

import json

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


STEPS, EVERY = 4, 2  # optimizer steps per run; a checkpoint every EVERY steps


def _pipeline_argv(workdir, pp: int, *extra: str) -> list[str]:
    # tiny GPT-2 (4 blocks: up to 4 stages), a slice of the corpus with its own small tokenizer, no BLEU; a hung
    # run ends after --timeout s with the launcher's report of where each rank waits
    return ["--schedule", "1f1b", "--pp", str(pp), "--micro_batches", "2", "--batch_size", "8",
            "--preset", "tiny", "--max_batches", str(STEPS), "--checkpoint_every", str(EVERY), "--async_checkpoint",
            "--n_bleu", "0", "--max_val_batches", "1", "--vocab_size", "1000", "--max_train_examples", "2000",
            "--device", "cpu", "--workdir", str(workdir), "--quiet", "--timeout", "90", *extra]


def _results(workdir, pp: int) -> dict[int, dict]:
    return {r: json.loads((workdir / f"pipeline_1f1b_rank{r}_results_epoch0.json").read_text()) for r in range(pp)}


@pytest.mark.needs_solution
@pytest.mark.timeout(300)
@pytest.mark.parametrize("pp", [3, 4])
def test_async_checkpoints_of_a_pipeline_of_three_or_more_stages_finish_and_resume(pp, tmp_path, capsys):
    from project.run_pipeline import main

    workdir = tmp_path / "work"
    assert main(_pipeline_argv(workdir, pp)) == 0, capsys.readouterr().err[-3000:]
    root = workdir / "pipeline_1f1b_checkpoints"
    assert (root / "latest").read_text() == f"step{STEPS:08d}", "the last background save was not committed"
    first = root / f"step{EVERY:08d}"
    assert (first / ".metadata").is_file(), sorted(p.name for p in root.iterdir())
    from course.checkpoint_manifest import verify_checkpoint

    # the background saves carry their manifest too, written once their files were: every file verifies
    assert [verify_checkpoint(root / f"step{s:08d}") for s in range(EVERY, STEPS + 1, EVERY)] == \
        list(range(EVERY, STEPS + 1, EVERY))
    uninterrupted = {r: res["train_losses"] for r, res in _results(workdir, pp).items()}

    assert main(_pipeline_argv(workdir, pp, "--resume", str(first))) == 0, capsys.readouterr().err[-3000:]
    after = _results(workdir, pp)
    assert all("checkpoint_load_seconds" in res for res in after.values()), "the second run did not resume"
    resumed = {r: res["train_losses"] for r, res in after.items()}
    # the resumed run records the steps it ran (steps EVERY+1 .. STEPS) after the restored ones: the same
    # batches, weights and random generators on the same kernels give the same losses exactly
    assert resumed == uninterrupted, f"resumed:\n{resumed}\nuninterrupted:\n{uninterrupted}"
