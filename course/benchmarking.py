"""The one benchmark harness: warm-up, repeats, median and spread, the machine, JSON, the command line.

Every benchmark of the course (``project/benchmark.py``, ``python -m pipeline.schedule_benchmark``,
``python -m three_d.factorisation_benchmark``) and every repeated measurement in the notebooks' workers
measures the same way (docs/architecture.md, "The benchmark harness"):

* **warm-up, then repeats** — :func:`interleaved` runs each variant ``warmup`` times untimed (memory
  allocation, first calls), then ``repeats`` rounds in which the variants take turns, so a change in the
  machine's load touches all of them alike; :func:`timed` times one call on the slowest rank of a group
  (a barrier first, then :func:`course.measure.now`: on a GPU after the device's queued work);
* **median and spread** — :func:`summarise` (``median``, ``min``, ``max``, ``n``, ``all``) of at least
  :data:`MIN_REPEATS` repeats; a comparison is a ratio taken per repeat, side by side (:func:`ratios`);
* **the machine** — :func:`machine`: cores, CPU model, device, torch and Python versions, the load
  average when the benchmark started (a loaded machine inflates every time);
* **JSON** — :func:`write_report` writes ``{"machine", "config", ...results}`` atomically;
* **the command line** — :func:`parser` gives every benchmark the same options for the same thing
  (``--device``, ``--repeats``, ``--warmup``, ``--out``, ``--timeout``; mesh sizes and
  ``--micro_batches`` named as in :class:`course.config.RunConfig`), :func:`old_name` keeps a former
  option name working with a note naming the new one, and :func:`check` validates before any process
  starts.
"""
from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
from pathlib import Path
from typing import Callable

import torch

from course.measure import now, timer_name

MIN_REPEATS = 3  # a median and a spread need three points


# ---- statistics -----------------------------------------------------------------------------------

def summarise(values: list[float]) -> dict:
    """``{"median", "min", "max", "n", "all"}`` of ``values`` (seconds, tokens/s, ...).

    Raises:
        ValueError: no values.
    """
    values = [float(v) for v in values]
    if not values:
        raise ValueError("nothing to summarise: no repeat was measured")
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "n": len(values),
            "all": values}


def ratios(numerators: list[float], denominators: list[float]) -> dict:
    """:func:`summarise` of the per-repeat ratios ``a / b`` of two variants measured side by side (repeat k
    of each ran in the same round of :func:`interleaved`).

    Raises:
        ValueError: the lists differ in length.
    """
    if len(numerators) != len(denominators):
        raise ValueError(f"ratios of {len(numerators)} and {len(denominators)} repeats: measure both side by side")
    return summarise([a / b for a, b in zip(numerators, denominators)])


def apart(a: dict, b: dict) -> bool:
    """Whether two :func:`summarise` results' ranges do not overlap (every repeat of one beat every repeat
    of the other)."""
    return a["min"] > b["max"] or b["min"] > a["max"]


# ---- timing -----------------------------------------------------------------------------------------

def slowest(seconds: float, group=None) -> float:
    """The largest of every rank's ``seconds`` in ``group`` (a host tensor over gloo: a timing the host
    holds); ``seconds`` itself without a process group."""
    import torch.distributed as dist

    if not dist.is_initialized():
        return seconds
    t = torch.tensor([seconds], dtype=torch.float64, device="cpu")
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group)
    return float(t)


def timed(fn: Callable[[], object], device=None, group=None) -> float:
    """Seconds of ``fn()`` on the slowest rank of ``group``: a barrier in ``group``, then the clock of
    :func:`course.measure.now` around the call (on a GPU, its work to completion). Without a process group:
    this process's seconds. Collective over ``group``."""
    import torch.distributed as dist

    if dist.is_initialized():
        dist.barrier(group=group)
    start = now(device)
    fn()
    return slowest(now(device) - start, group)


def interleaved(variants: dict[str, Callable[[], object]], repeats: int, warmup: int = 1, device=None, group=None,
                inner: int = 1) -> dict[str, list[float]]:
    """Seconds per call of each variant: ``warmup`` untimed calls of each, then ``repeats`` rounds in which
    every variant is timed in turn over ``inner`` calls (:func:`timed`, slowest rank of ``group``).

    Returns:
        ``{name: [seconds per call, one per repeat]}``.
    """
    for fn in variants.values():
        for _ in range(warmup):
            fn()
    out: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(repeats):
        for name, fn in variants.items():
            out[name].append(timed(lambda: [fn() for _ in range(inner)], device, group) / inner)
    return out


# ---- the machine ------------------------------------------------------------------------------------

def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine(device=None) -> dict:
    """What the numbers were measured on: ``cores`` (``os.cpu_count``), ``usable_cores`` (this process's
    CPU affinity), ``cpu_model``, ``device`` and ``gpu`` (name and count on CUDA), ``torch``, ``python``,
    ``platform``, ``load_average`` (1, 5, 15 minutes, when this was called: more busy processes than cores
    inflate every time measured) and ``timer`` (:func:`course.measure.timer_name`)."""
    device = None if device is None else torch.device(device)
    out = {"cores": os.cpu_count(),
           "usable_cores": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
           "cpu_model": _cpu_model(), "device": str(device) if device is not None else "cpu",
           "torch": torch.__version__, "python": platform.python_version(), "platform": platform.platform(),
           "load_average": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
           "timer": timer_name(device)}
    if device is not None and device.type == "cuda":
        out["gpu"] = {"name": torch.cuda.get_device_name(device), "count": torch.cuda.device_count()}
    return out


def describe(info: dict) -> str:
    """One line for a printed table: cores, CPU, device, load."""
    load = info.get("load_average")
    loaded = f"; load average {load[0]:.1f} at the start" if load else ""
    gpu = f" ({info['gpu']['count']} x {info['gpu']['name']})" if info.get("gpu") else ""
    return (f"{info['cores']} cores ({info['cpu_model']}), device {info['device']}{gpu}, torch {info['torch']}, "
            f"timer {info['timer']}{loaded}")


# ---- JSON --------------------------------------------------------------------------------------------

def write_report(path, report: dict) -> Path:
    """Write ``report`` (it should hold ``machine`` and ``config``) as indented JSON, atomically."""
    from course.results import write_json

    missing = [k for k in ("machine", "config") if k not in report]
    if missing:
        raise ValueError(f"a benchmark report holds {missing} too (course.benchmarking.machine, the options)")
    return write_json(path, report)


# ---- the command line ----------------------------------------------------------------------------

def parser(description: str, *, out: str, device: str = "auto", repeats: int = MIN_REPEATS, warmup: int = 1,
           timeout: float | None = None) -> argparse.ArgumentParser:
    """A benchmark's command line with the options every benchmark shares (group "measurement"):
    ``--device``, ``--repeats``, ``--warmup``, ``--out`` and, with ``timeout``, ``--timeout``. The
    benchmark adds its own; mesh sizes and micro-batches take :class:`course.config.RunConfig`'s names."""
    p = argparse.ArgumentParser(description=description, formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    g = p.add_argument_group("measurement")
    g.add_argument("--device", default=device, choices=("auto", "cpu", "cuda"),
                   help="auto: one GPU per rank with NCCL when there are enough, else the CPU with gloo")
    g.add_argument("--repeats", type=int, default=repeats, help=f"timed repeats (>= {MIN_REPEATS}): median and min-max")
    g.add_argument("--warmup", type=int, default=warmup, help="untimed runs first (allocation, first calls)")
    g.add_argument("--out", type=Path, default=Path(out), help="where the JSON report goes")
    if timeout is not None:
        g.add_argument("--timeout", type=float, default=timeout, help="wall-clock limit of each launch (seconds)")
    return p


def old_name(parser: argparse.ArgumentParser, old: str, new: str, **kwargs) -> None:
    """Keep ``old`` working as ``new`` (same value) with a note naming ``new`` (:class:`course.config.RunConfig`'s
    former names do the same). ``kwargs``: ``type``/``nargs`` of the new option."""
    from course.config import _OldName

    dest = new.lstrip("-")
    action = next(a for a in parser._actions if a.dest == dest)
    kwargs = {"type": action.type, "nargs": action.nargs, **kwargs}
    parser.add_argument(old, dest=dest, action=_OldName, new=new, help=argparse.SUPPRESS,
                        **{k: v for k, v in kwargs.items() if v is not None})


def check(parser: argparse.ArgumentParser, args: argparse.Namespace, world_size: int) -> argparse.Namespace:
    """Check the shared options before any process starts (exits through ``parser.error`` with what to
    change): ``--repeats`` >= :data:`MIN_REPEATS`, ``--warmup`` >= 0, ``--device`` resolved for
    ``world_size`` ranks (:func:`course.launch.resolve_device_backend`)."""
    from course.launch import resolve_device_backend

    if args.repeats < MIN_REPEATS:
        parser.error(f"--repeats must be >= {MIN_REPEATS} timed repeats (a median and a spread need three points), "
                     f"not {args.repeats}")
    if args.warmup < 0:
        parser.error(f"--warmup must be >= 0, not {args.warmup}")
    try:
        args.device, _ = resolve_device_backend(args.device, "auto", world_size)
    except ValueError as exc:
        parser.error(str(exc))
    return args


def torchrun_size(parser: argparse.ArgumentParser, given: list[int] | int | None, option: str, argv=None) -> int | None:
    """Under torchrun a benchmark's number of ranks is torchrun's ``WORLD_SIZE``: returns it (None outside
    torchrun). Exits with a message when ``option`` was given with another value."""
    from course.launch import default_world_size, in_torchrun

    if not in_torchrun():
        return None
    size = default_world_size(0)
    argv = sys.argv if argv is None else argv
    values = given if isinstance(given, list) else [given]
    if option in argv and any(v != size for v in values if v is not None):
        parser.error(f"under torchrun {option} is torchrun's WORLD_SIZE={size}: leave it out, or start torchrun with "
                     f"--nproc_per_node=<that size>")
    return size
