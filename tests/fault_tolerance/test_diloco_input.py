"""DiLoCo refuses settings it cannot run, before any step (ungraded: the checks sit outside assignment 5.1.4's
block, so they pass on the stub too)."""
from __future__ import annotations

import pytest
import torch


def test_bad_sync_every_or_outer_settings_are_refused():
    from fault_tolerance.diloco import DiLoCo
    from tests.fault_tolerance.workers import mlp

    model = mlp()
    with pytest.raises(ValueError, match="sync_every"):
        DiLoCo(model, torch.optim.SGD(model.parameters(), lr=0.1), sync_every=0)
    with pytest.raises(ValueError, match="outer_momentum"):
        DiLoCo(model, torch.optim.SGD(model.parameters(), lr=0.1), sync_every=2, outer_momentum=1.0)
