"""What this process's environment says, read without importing torch (so that the configuration,
:mod:`course.config`, checks a run where torch is not installed: ``modal run`` on a laptop).

* :func:`in_torchrun`: whether a launcher (torchrun, srun) already describes the process group;
* :func:`torch_installed`: whether torch can be imported here (the parts' packages load their torch
  modules only then; their torch-free modules, e.g. ``pipeline.schedules``, load either way).
"""
from __future__ import annotations

import importlib.util
import os


def in_torchrun() -> bool:
    """True when the environment already describes a process group (torchrun, srun)."""
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ


def torch_installed() -> bool:
    """True when ``import torch`` can work here (found on the path, and not blocked in ``sys.modules``)."""
    return importlib.util.find_spec("torch") is not None
