"""The course's shared library: everything around the parallelism algorithms.

Launching processes, the device mesh and its groups, counted communication, the corpus,
the tokenizer, the GPT-2 presets, the loss, the one epoch runner, greedy decoding and BLEU,
results files and plots. It imports no part (``data_parallel``, ``pipeline``,
``tensor_parallel``, ...) and no script: the parts build on it, the scripts on both
(docs/architecture.md).
"""
