"""Assignment 5.5: memory — ZeRO stages 1-3 written by hand, activation checkpointing, memory measured.

* ``zero``           — ``shard_range``, ``ZeroOptimizer`` (ZeRO-1, 5.5.1; ZeRO-2, 5.5.2)
* ``fsdp``           — ``FullyShardedModel``: ZeRO-3, parameters sharded per block (5.5.3)
* ``checkpointing``  — ``checkpoint_block``: activations dropped and recomputed in backward (5.5.4)
* ``accounting``     — bytes held per category (counted by storage) and the ZeRO formulas
* ``training``       — ``build_sharding``: the memory options of a data-parallel run as one sharded step
* ``labs``           — the notebook's workers (``experiments``, ``formula_checks``), the HSDP benchmark and the
                       ZeRO++ experiment, the exercises' answer checks

See notebooks/05_memory.ipynb.
"""
from memory.fsdp import FullyShardedModel
from memory.training import build_sharding
from memory.zero import ZeroOptimizer, shard_range

__all__ = ["ZeroOptimizer", "shard_range", "FullyShardedModel", "build_sharding"]
