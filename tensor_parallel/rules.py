"""The torch-free rules of a tensor-parallel run's configuration: the block types (what each is:
:mod:`tensor_parallel.block_types`) and what tp must divide. Checked before any process starts, also where
torch is not installed (``modal run`` on a laptop, through ``project/options``).
"""
from __future__ import annotations

from typing import Sequence

BLOCK_TYPES = {
    "tp": "exact Megatron tensor parallelism: 2 all-reduces per block forward, 2 backward",
    "spd": "Sync-Point Drop: attention all-reduce dropped, 1 per block forward and backward (approximation)",
    "parallel": "per-rank residual streams across a run of blocks, 1 all-reduce per run (different architecture)",
}


def parse_block_types(block_types: str | Sequence[str] | None, n_layer: int) -> list[str]:
    """One block type per layer.

    Args:
        block_types: None (all ``tp``); one name for every layer (``"spd"``); a
            comma-separated string (``"tp,spd,parallel,parallel"``); or a list of names.
        n_layer: number of transformer layers of the model.

    Raises:
        ValueError: an unknown name, or not exactly ``n_layer`` entries.
    """
    if block_types is None:
        block_types = "tp"
    if isinstance(block_types, str):
        names = [b.strip() for b in block_types.split(",")]
        if len(names) == 1:
            names = names * n_layer
    else:
        names = [str(b).strip() for b in block_types]
    unknown = sorted({b for b in names if b not in BLOCK_TYPES})
    if unknown:
        raise ValueError(f"unknown block type(s) {unknown}; choose from {sorted(BLOCK_TYPES)}")
    if len(names) != n_layer:
        raise ValueError(f"block_types has {len(names)} entries ({','.join(names)}) but the model has "
                         f"n_layer={n_layer} layers; give one type per layer (comma-separated) or one name for all")
    return names


def validate_tp_config(config, tp: int, block_types=None) -> list[str]:
    """Check that a GPT-2 config can be split over ``tp`` ranks; return one block type per layer.

    ``config`` needs ``n_head``, ``n_embd``, ``n_layer`` and ``n_inner`` (None: 4 * n_embd),
    like ``transformers.GPT2Config``.

    Raises:
        ValueError: ``tp`` < 1; ``n_head`` or the MLP width not divisible by ``tp``;
            bad ``block_types`` (see :func:`tensor_parallel.block_types.parse_block_types`).
    """
    if not isinstance(tp, int) or tp < 1:
        raise ValueError(f"tp must be a whole number >= 1, not {tp!r}")
    if config.n_head % tp:
        raise ValueError(f"n_head={config.n_head} is not divisible by tp={tp}: attention is split by "
                         f"heads; choose a tp that divides {config.n_head}")
    inner = config.n_inner if config.n_inner is not None else 4 * config.n_embd
    if inner % tp:
        raise ValueError(f"the MLP width (n_inner={inner}) is not divisible by tp={tp}; "
                         f"choose a tp that divides {inner}")
    return parse_block_types(block_types, config.n_layer)
