"""Ungraded: a 3D checkpoint written at one layout resumes at another (``torch.distributed.checkpoint``
resharding across dp and pp), and one written at another tp is refused before any process starts.

The uninterrupted run trains 4 steps at (dp, pp, tp) = (1, 4, 2) and checkpoints after steps 2
and 4; the resumed run loads the step-2 checkpoint at (2, 2, 2) — every stage now holds the
layers of two old stages, every dp rank half of each batch — and trains steps 3 and 4. Both
runs are ``three_d.training.ThreeDTraining`` under ``run_epochs`` as in ``project/run_3d.py``,
one after the other in the same 8 launched processes (tests/support/three_d_checkpoint.py:
the data are prepared once); ``--resume``'s checks before launch are tested below. With
dropout 0 nothing random is drawn, so the resumed steps compute the same global-batch loss with
the same weights and AdamW state; what differs is only the order of floating-point sums (dp
averages half-batch gradients, micro-batch losses are added in another grouping), which in
float32 moves a loss of ~7 by a few ulps (~1e-6 relative): rtol 1e-4 is far above that and far
below what a wrong load does (a fresh model or layers in the wrong place: >= 1e-2, measured).
"""
from __future__ import annotations

import json
import math

import pytest

from project.run_3d import parse_args

STEPS, EVERY = 4, 2


def _argv(workdir, *extra):
    return ["--preset", "tiny", "--batch_size", "8", "--micro_batches", "2", "--model_max_length", "32",
            "--vocab_size", "1000", "--max_batches", str(STEPS), "--max_val_batches", "1", "--n_bleu", "0",
            "--dropout", "0", "--workdir", str(workdir), "--quiet", "--timeout", "300", *extra]


def _results(workdir, world_size=8):
    return [json.loads((workdir / f"three_d_rank{r}_results_epoch0.json").read_text()) for r in range(world_size)]


@pytest.mark.needs_solution
@pytest.mark.timeout(300)
def test_checkpoint_saved_at_1_4_2_resumes_at_2_2_2(tmp_path):
    import copy

    from course.launch import launch
    from tests.support.three_d_checkpoint import train_then_resume

    first_dir, second_dir = tmp_path / "first", tmp_path / "second"
    second_dir.mkdir()
    first = parse_args(_argv(first_dir, "--dp", "1", "--pp", "4", "--tp", "2", "--checkpoint_every", str(EVERY)))
    second = copy.copy(parse_args(_argv(second_dir, "--dp", "2", "--pp", "2", "--tp", "2")))
    checkpoint = first_dir / "three_d_checkpoints" / f"step{EVERY:08d}"
    second.resume = str(checkpoint)  # written by the first run (run_3d.py's --resume would check it exists)
    launch(train_then_resume, 8, first, second, device="cpu", backend="gloo", timeout=240)

    uninterrupted = _results(first_dir)
    losses = uninterrupted[0]["train_losses"]
    assert len(losses) == STEPS and all(math.isfinite(x) for x in losses), losses
    assert all(r["tied_weight_max_abs_difference"] == 0.0 for r in uninterrupted), "tied copies drifted apart"
    assert (checkpoint / ".metadata").is_file()
    resumed = _results(second_dir)
    for rank, r in enumerate(resumed):
        assert r["config"]["dp"] == 2 and r["config"]["pp"] == 2, "the second run did not use the new layout"
        assert r["steps"] == STEPS, f"rank {rank}: progress not resumed ({r['steps']} steps)"
        assert r["tied_weight_max_abs_difference"] == 0.0, f"rank {rank}: lm_head not loaded from wte"
        # steps 1-2 are the checkpoint's record, 3-4 computed after loading it at the new layout
        assert r["train_losses"][:EVERY] == losses[:EVERY], f"rank {rank}: the steps before the resume are lost"
        assert r["train_losses"][EVERY:] == pytest.approx(losses[EVERY:], rel=1e-4, abs=0), (
            f"rank {rank}: resumed at (2,2,2) {r['train_losses']} vs uninterrupted at (1,4,2) {losses}")


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled:UserWarning")  # one process saves, on purpose
def test_resuming_with_another_tp_stops_before_any_process_starts(tmp_path, capsys):
    """A tiny hand-written checkpoint stands for one written at tp 2 (only its layout entry is read)."""
    import torch
    import torch.distributed.checkpoint as dcp

    from three_d.training import LAYOUT_KEY

    folder = tmp_path / "three_d_checkpoints" / "step00000002"
    dcp.save({LAYOUT_KEY: torch.tensor([1, 4, 2])}, checkpoint_id=str(folder), no_dist=True)
    from course.checkpoint_manifest import write_manifest

    write_manifest(folder, 2)  # as the course's save commits it (a resume verifies the files against it first)
    with pytest.raises(SystemExit):
        parse_args(_argv(tmp_path, "--dp", "2", "--pp", "1", "--tp", "4", "--resume", str(folder)))
    err = capsys.readouterr().err
    assert "written at dp=1 pp=4 tp=2" in err and "resume with --tp 2" in err, err
    with pytest.raises(SystemExit):
        parse_args(_argv(tmp_path, "--dp", "1", "--pp", "2", "--tp", "2", "--resume", str(folder)))
    assert "choose --dp and --pp with dp x pp = 4" in capsys.readouterr().err
    assert parse_args(_argv(tmp_path, "--dp", "2", "--pp", "2", "--tp", "2", "--resume", str(folder))).dp == 2
