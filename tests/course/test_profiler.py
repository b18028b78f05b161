"""Ungraded: --profile (course.profiler) on a tiny CPU run — a torch.profiler trace per rank, named after the
run's results and rank, bounded to a few steps (small), and put into --trace's file on the same clock."""
from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch

from course.profiler import PROFILE_STEPS, profile_path, profile_schedule


def test_the_schedule_skips_the_first_step_and_records_a_few():
    assert profile_schedule(1) == (0, 0, 1)
    assert profile_schedule(2) == (1, 0, 1)
    assert profile_schedule(3) == (1, 1, 1)
    assert profile_schedule(100) == (1, 1, PROFILE_STEPS)
    with pytest.raises(ValueError, match="at least one step"):
        profile_schedule(0)
    assert profile_path("w", "three_d_", 3).name == "three_d_rank3_torch_profile.json"


def _tiny_mode(tmp_path, steps: int, trace=None, profile=False):
    from course.epoch_runner import Evaluation, TrainingMode, supervised_step
    from course.model import build_gpt2

    g = torch.Generator().manual_seed(0)
    examples = [{"ids": torch.randint(0, 50, (8,), generator=g, device="cpu")} for _ in range(2 * steps)]

    def collate(rows):
        ids = torch.stack([r["ids"] for r in rows])
        return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids.clone()}

    class Mode(TrainingMode):
        results_prefix = "tiny_"

        def __init__(self, *a, **k):
            super().__init__(*a, **k)
            self.model = build_gpt2("tiny", 50, n_positions=8, dropout=0.0, seed=0, n_layer=1)
            self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=1e-3)

        def epoch_batches(self, epoch):
            return [collate(examples[2 * i:2 * i + 2]) for i in range(steps)], steps

        def train_step(self, batch):
            return supervised_step(self.model, self.optimizer, batch, self.device)

        def evaluation(self):
            return Evaluation(self.model, self.device)

    args = SimpleNamespace(n_epochs=1, workdir=str(tmp_path), n_bleu=0, checkpoint_every=None, resume=None,
                           keep_checkpoints=2, max_val_batches=1, model_max_length=8, quiet=True, trace=trace,
                           trace_steps=20, profile=profile)
    data = SimpleNamespace(validation=examples[:2], collate=collate, tokenizer=None, test=[])
    return Mode(args, data, "cpu", show_progress=False)


@pytest.mark.timeout(120)
def test_a_profiled_tiny_run_writes_a_small_trace_per_rank_on_the_course_clock(tmp_path):
    from course.epoch_runner import run_epochs

    path = tmp_path / "run.json"
    run_epochs(_tiny_mode(tmp_path, 5, trace=str(path), profile=True))
    profile = tmp_path / "tiny_rank0_torch_profile.json"
    assert profile.is_file() and profile.stat().st_size < 5e6, "bounded: a few steps, no shapes or stacks"
    mine = json.loads(profile.read_text())
    assert mine["traceName"] == "rank 0: torch.profiler"
    steps = [e for e in mine["traceEvents"] if e.get("name", "").startswith("ProfilerStep#")]
    assert sorted(e["name"] for e in steps) == [f"ProfilerStep#{n}" for n in (2, 3, 4)], "steps 2-4 of 0-4"
    events = json.loads(path.read_text())["traceEvents"]
    rows = {(e["pid"], e["tid"]): e["args"]["name"] for e in events if e["name"] == "thread_name"}
    ours = {e["name"]: e for e in events if e["ph"] == "X" and rows[(e["pid"], e["tid"])] == "step"}
    theirs = [e for e in events if e["ph"] == "X" and rows[(e["pid"], e["tid"])].startswith("torch.profiler")]
    assert set(ours) == {f"step {n}" for n in range(5)} and theirs
    for n in (2, 3, 4):  # the profiler's step n lies within the course's step n (one clock; 1 ms of slack)
        step, = [e for e in theirs if e["name"] == f"ProfilerStep#{n}"]
        assert ours[f"step {n}"]["ts"] - 1e3 <= step["ts"] <= ours[f"step {n}"]["ts"] + ours[f"step {n}"]["dur"] + 1e3
