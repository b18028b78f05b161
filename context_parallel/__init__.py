"""Assignment 5.7: context parallelism — the sequence split over a ``cp`` group of ranks.

* :mod:`context_parallel.online_softmax` — the running max / sum / accumulator of the online
  softmax, causal masking by block, one block's gradients (a5_7_1).
* :mod:`context_parallel.blockwise_attention` — attention tile by tile with its own backward (a5_7_1).
* :mod:`context_parallel.layouts` — contiguous and zig-zag sequence layouts (a5_7_2).
* :mod:`context_parallel.ring_attention` — ring attention, forward and backward (a5_7_2).
* :mod:`context_parallel.ulysses` — DeepSpeed-Ulysses all-to-all attention (a5_7_3).
* :mod:`context_parallel.rules` — what cp must divide (torch-free: the configuration's checks).
* :mod:`context_parallel.gpt2` — a ``transformers`` GPT-2 whose attention runs across the cp group.
* :mod:`context_parallel.packing` — long training sequences: translation pairs packed together.
* :mod:`context_parallel.training` — the training mode of ``project/run_context_parallel.py``.
* :mod:`context_parallel.labs.experiments` — workers that notebooks/07_context_parallelism.ipynb launches.
* :mod:`context_parallel.labs.exercises` — the notebook's exercises and their checks.

Every function that communicates takes the context-parallel process group (``group``, the
``cp`` group of the run's mesh; None: the whole world) and communicates only in it, through
:mod:`course.collectives`. Importing this package does not import ``transformers``.
"""
from course.environment import torch_installed
from context_parallel.rules import check_heads

if torch_installed():  # without torch (modal run on a laptop) only the rules above load
    from context_parallel.blockwise_attention import blockwise_attention
    from context_parallel.layouts import LAYOUTS, SequenceLayout, causal_pairs, chunk_ids
    from context_parallel.online_softmax import (SoftmaxState, block_gradients, causal_block, finish,
                                                 online_softmax_update)
    from context_parallel.ring_attention import ring_attention, ring_traffic_bytes
    from context_parallel.ulysses import ulysses_attention, ulysses_traffic_bytes

__all__ = ["blockwise_attention", "LAYOUTS", "SequenceLayout", "causal_pairs", "chunk_ids", "SoftmaxState",
           "block_gradients", "causal_block", "finish", "online_softmax_update", "ring_attention",
           "ring_traffic_bytes", "check_heads", "ulysses_attention", "ulysses_traffic_bytes"]
