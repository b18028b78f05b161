"""Assignment 5.3: Megatron tensor parallelism for GPT-2 (Shoeybi et al. 2019; Korthikanti et al. 2022).

* :mod:`tensor_parallel.mappings` — f, g, scatter/gather (a5_3_1; sequence dim: a5_3_5).
* :mod:`tensor_parallel.layers` — ColumnParallelLinear, RowParallelLinear (a5_3_2).
* :mod:`tensor_parallel.vocab` — VocabParallelEmbedding, vocab-parallel cross-entropy (a5_3_3).
* :mod:`tensor_parallel.gpt2` — tensor-parallel GPT-2 (a5_3_4).
* :mod:`tensor_parallel.sequence_parallel` — sequence parallelism (a5_3_5).
* :mod:`tensor_parallel.block_types` — per-layer ``tp`` / ``spd`` / ``parallel`` blocks.
* :mod:`tensor_parallel.rules` — the block types' names and what tp must divide (torch-free: the
  configuration's checks).
* :mod:`tensor_parallel.export` — the shards put back together as ``transformers``' GPT-2 (``--export_hf``).
* :mod:`tensor_parallel.training` — the training mode of ``project/run_tensor_parallel.py``.
* :mod:`tensor_parallel.labs.experiments` — workers that notebooks/03_tensor_parallel.ipynb launches.

Every module takes the tensor-parallel process group (``group``, the ``tp`` group of the
run's mesh; None: the whole world) and communicates only in it, through the counted
collectives of :mod:`course.collectives`.

Importing this package does not import ``transformers``.
"""
from course.environment import torch_installed

if torch_installed():  # without torch (modal run on a laptop) none loads; tensor_parallel.rules does
    from tensor_parallel.export import hf_state_dict
    from tensor_parallel.gpt2 import TensorParallelGPT2, attention_bias
    from tensor_parallel.layers import ColumnParallelLinear, RowParallelLinear
    from tensor_parallel.mappings import (copy_to_tensor_parallel_region, gather_from_sequence_parallel_region,
                                          gather_from_tensor_parallel_region, reduce_from_tensor_parallel_region,
                                          reduce_scatter_to_sequence_parallel_region,
                                          scatter_to_sequence_parallel_region, scatter_to_tensor_parallel_region)
    from tensor_parallel.vocab import VocabParallelEmbedding, vocab_parallel_cross_entropy, vocab_parallel_lm_loss

__all__ = [
    "TensorParallelGPT2", "attention_bias", "ColumnParallelLinear", "RowParallelLinear", "VocabParallelEmbedding",
    "vocab_parallel_cross_entropy", "vocab_parallel_lm_loss", "copy_to_tensor_parallel_region",
    "reduce_from_tensor_parallel_region", "scatter_to_tensor_parallel_region", "gather_from_tensor_parallel_region",
    "scatter_to_sequence_parallel_region", "gather_from_sequence_parallel_region",
    "reduce_scatter_to_sequence_parallel_region", "hf_state_dict",
]
