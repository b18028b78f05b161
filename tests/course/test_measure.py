"""course.measure on the CPU, and the results that say what they measured with.

On a GPU the same module synchronises the device before reading the clock, stamps CUDA events and
reads ``torch.cuda.max_memory_allocated`` (checked by ``tests/gpu/test_measure_cuda.py``); here:
the CPU's names and behaviour, the collectives' spans only while an event recorder is active, and the
epoch runner's results file naming its clock and memory measure.
"""
from __future__ import annotations

import json
import time
from types import SimpleNamespace

import pytest
import torch

from course import measure


def test_cpu_clock_stopwatch_and_stamps():
    assert measure.timer_name("cpu") == measure.timer_name(None) == "host-clock"
    assert measure.timer_name(torch.device("cuda", 0)) == "host-clock+cuda-sync"  # by name only: no GPU touched
    # bracketed by the wall clock read around it (seconds, not ms or ns), never bounded by a duration: true at any load
    before = time.time()
    with measure.Stopwatch("cpu") as sw:
        with pytest.raises(RuntimeError, match="once the with block has ended"):
            sw.seconds
        time.sleep(0.05)
        assert sw.lap() >= 0.05
    after = time.time()
    assert 0.05 <= sw.seconds <= after - before and sw.timer == "host-clock" and sw.end >= sw.start
    a = measure.stamp("cpu")
    time.sleep(0.02)
    b = measure.stamp("cpu")
    assert isinstance(a, float) and measure.seconds(b) - measure.seconds(a) >= 0.02
    before = time.time()
    reading = measure.now("cpu")
    assert before <= reading <= time.time()  # the wall clock: comparable between processes


def test_cpu_memory_meter_is_the_process_peak():
    with measure.MemoryMeter("cpu") as m:
        x = torch.ones(8 * 2**20, dtype=torch.uint8, device="cpu")
        del x
    assert m.measure == measure.HOST_MEMORY and m.measure == measure.memory_name("cpu")
    assert m.peak_bytes >= m.start_bytes > 0
    assert measure.memory_name(torch.device("cuda", 1)).startswith("torch.cuda.max_memory_allocated")
    assert measure.measures("cpu") == {"timer": "host-clock", "memory": measure.HOST_MEMORY}


def counted_spans(rank, world_size):
    from unittest import mock

    from course import measure, trace
    from course.collectives import CommCounter, all_reduce

    x = torch.ones(3, device="cpu")
    with mock.patch.object(measure, "now", side_effect=AssertionError("a clock read with no recorder")), \
            mock.patch.object(trace, "now", side_effect=AssertionError("a clock read with no recorder")):
        with CommCounter() as counted:  # counts, reads no clock
            all_reduce(x)
    with CommCounter() as again, trace.recording(trace.Recorder("cpu")) as recorder:
        all_reduce(x)
    return ([r.kind for r in counted.records], [r.kind for r in again.records],
            [(s.name, s.row, s.start, s.end, s.args["bytes"]) for s in recorder.spans])


def test_collective_spans_are_read_only_while_a_recorder_is_active():
    from course.launch import launch

    before = time.time()
    counted, again, spans = launch(counted_spans, 2, timeout=120)[0]
    assert counted == again == ["all_reduce"]
    (name, row, start, end, nbytes), = spans
    assert (name, row, nbytes) == ("all_reduce world", "communication", 12)
    assert before <= start <= end <= time.time()  # course.measure's wall clock, read inside the launch


def test_results_file_names_its_clock_and_memory_measure(tmp_path):
    from course.epoch_runner import Evaluation, TrainingMode, run_epochs, supervised_step
    from course.model import build_gpt2

    g = torch.Generator().manual_seed(0)
    examples = [{"ids": torch.randint(0, 50, (8,), generator=g, device="cpu")} for _ in range(4)]

    def collate(rows):
        ids = torch.stack([r["ids"] for r in rows])
        return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids.clone()}

    class Mode(TrainingMode):
        def __init__(self, *a, **k):
            super().__init__(*a, **k)
            self.model = build_gpt2("tiny", 50, n_positions=8, dropout=0.0, seed=0, n_layer=1)
            self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=1e-3)

        def epoch_batches(self, epoch):
            return [collate(examples[:2]), collate(examples[2:])], 2

        def train_step(self, batch):
            return supervised_step(self.model, self.optimizer, batch, self.device)

        def evaluation(self):
            return Evaluation(self.model, self.device)

    args = SimpleNamespace(n_epochs=1, workdir=str(tmp_path), n_bleu=0, checkpoint_every=None, resume=None,
                           keep_checkpoints=2, max_val_batches=None, model_max_length=8, quiet=True, trace=None,
                           trace_steps=20, profile=False)
    data = SimpleNamespace(validation=examples, collate=collate, tokenizer=None, test=[])
    written = run_epochs(Mode(args, data, "cpu", show_progress=False))
    result = json.loads(open(written[0]).read())
    assert result["timer"] == "host-clock"
    assert result["memory"] == measure.HOST_MEMORY and result["peak_memory_bytes"] > 0
    assert result["training_time"] > 0 and result["steps"] == 2
