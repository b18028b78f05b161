"""``--profile``: a ``torch.profiler`` trace of a few training steps per rank, next to the course's own trace.

The course's event recorder (:mod:`course.trace`) says what each rank did at the level the course
teaches (a micro-batch's forward, an all-reduce in the tp group); ``torch.profiler`` says which
operators and kernels ran inside it (``aten::mm``, ``gloo:all_reduce``, CUDA kernels). With ``--profile``
every rank profiles a few steps of its first epoch and writes a Chrome / Perfetto trace
``<workdir>/<results prefix>rank<r>_torch_profile.json`` — named like the run's results files
(``three_d_rank3_results_epoch0.json`` and ``three_d_rank3_torch_profile.json`` belong to the same run
and rank), its process named after the rank's mesh coordinates. With ``--trace`` as well, each rank's
profiled events also go into the run's trace, in the rank's process and on the same clock, so the
two are read side by side in one file.

Bounded: the profiler skips the first step (allocation, first calls), warms up on the next, records
:data:`PROFILE_STEPS` (torch.profiler's ``schedule(wait, warmup, active, repeat=1)``), without shapes,
stacks or memory, so a profiled run stays small and runs at full speed before and after.

Source: PyTorch, "torch.profiler" (``schedule``, ``on_trace_ready``, ``export_chrome_trace``).
"""
from __future__ import annotations

import json
from pathlib import Path

import torch

PROFILE_STEPS = 3  # steps recorded


def profile_path(workdir, results_prefix: str, rank: int) -> Path:
    """``<workdir>/<results_prefix>rank<rank>_torch_profile.json``."""
    return Path(workdir) / f"{results_prefix}rank{rank}_torch_profile.json"


def profile_schedule(n_steps: int) -> tuple[int, int, int]:
    """``(wait, warmup, active)`` for an epoch of ``n_steps`` steps: skip the first step when there is
    another, warm up on one step when two remain, then record up to :data:`PROFILE_STEPS`.

    Raises:
        ValueError: ``n_steps`` < 1.
    """
    if n_steps < 1:
        raise ValueError(f"a profiled epoch needs at least one step, not {n_steps}")
    wait = 1 if n_steps > 1 else 0
    warmup = 1 if n_steps - wait > 1 else 0
    return wait, warmup, min(PROFILE_STEPS, n_steps - wait - warmup)


class StepProfiler:
    """``torch.profiler.profile`` over a few training steps of this rank (``with StepProfiler(...) as p:``
    around the steps, ``p.step()`` after each); writes :func:`profile_path` once the recorded steps end.

    Args:
        path: where the trace goes.
        n_steps: steps the profiled loop runs (:func:`profile_schedule`).
        device: the rank's device (CUDA activity is recorded on a GPU).
        name: the process name the trace shows (e.g. ``"rank 3 (pp 1, dp 0, tp 1)"``).
    """

    def __init__(self, path, n_steps: int, device, name: str):
        from torch.profiler import ProfilerActivity, profile, schedule

        self.path, self.name = Path(path), name
        wait, warmup, active = profile_schedule(n_steps)
        activities = [ProfilerActivity.CPU]
        if torch.device(device).type == "cuda":
            activities.append(ProfilerActivity.CUDA)
        self.steps = (wait, warmup, active)
        self._profile = profile(activities=activities, schedule=schedule(wait=wait, warmup=warmup, active=active,
                                                                         repeat=1),
                                on_trace_ready=self._write, record_shapes=False, with_stack=False,
                                profile_memory=False)
        self.written = False

    def _write(self, prof) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(self.path.name + ".tmp")
        prof.export_chrome_trace(str(tmp))
        trace = json.loads(tmp.read_text())
        pids = {e["pid"] for e in trace.get("traceEvents", []) if e.get("ph") == "M" and e.get("name") == "process_name"}
        for e in trace.get("traceEvents", []):
            if e.get("ph") == "M" and e.get("name") == "process_name" and e.get("pid") in pids:
                label = e["args"].get("name", "")
                e["args"]["name"] = f"{self.name}: torch.profiler {label}".strip()
        trace["traceName"] = f"{self.name}: torch.profiler"
        tmp.write_text(json.dumps(trace))
        tmp.replace(self.path)
        self.written = True

    def __enter__(self) -> "StepProfiler":
        self._profile.__enter__()
        return self

    def step(self) -> None:
        """A training step has ended."""
        self._profile.step()

    def __exit__(self, *exc) -> None:
        self._profile.__exit__(*exc)


def profile_trace_events(trace: dict, pid: int, origin: float, first_tid: int) -> list[dict]:
    """A torch.profiler Chrome trace's events moved into process ``pid`` of a :mod:`course.trace` trace.

    Kineto writes ``ts`` in microseconds after ``baseTimeNanoseconds`` (the Unix epoch), the clock of
    :func:`course.measure.now`; they are put on the course trace's scale (microseconds after ``origin``,
    seconds since the epoch). Each of the profile's threads (host threads, GPU streams) becomes a thread
    ``first_tid + k`` named ``torch.profiler: <its name>``; flow arrows (``s``/``f``/``t``), whose ids
    would collide between ranks, are left out.
    """
    base_us = trace.get("baseTimeNanoseconds", 0) / 1e3
    shift = base_us - origin * 1e6
    names, tids, out = {}, {}, []
    for e in trace.get("traceEvents", []):
        if e.get("ph") == "M" and e.get("name") == "thread_name":
            names[(e.get("pid"), e.get("tid"))] = e["args"].get("name", "")
        if e.get("ph") == "M" and e.get("name") == "process_labels":
            names.setdefault((e.get("pid"), "labels"), e["args"].get("labels", ""))
    for e in trace.get("traceEvents", []):
        if e.get("ph") in ("M", "s", "f", "t") or "ts" not in e:
            continue
        key = (e.get("pid"), e.get("tid"))
        if key not in tids:
            tids[key] = first_tid + len(tids)
        moved = dict(e, pid=pid, tid=tids[key], ts=e["ts"] + shift)
        out.append(moved)
    for key, tid in tids.items():
        label = names.get(key) or f"{names.get((key[0], 'labels'), '')} thread {key[1]}".strip()
        out.append({"name": "thread_name", "ph": "M", "pid": pid, "tid": tid, "args": {"name": f"torch.profiler: {label}"}})
        out.append({"name": "thread_sort_index", "ph": "M", "pid": pid, "tid": tid, "args": {"sort_index": tid}})
    return out
