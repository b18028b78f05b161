"""Assignment 5.4: communication — all-reduce from send/recv, bucketed overlapped gradient averaging, compression.

* ``ring``         — ``ring_all_reduce``, ``tree_all_reduce`` (5.4.1)
* ``buckets``      — ``BucketedReducer``: DDP-like buckets whose all-reduce starts during the backward pass (5.4.2)
* ``compression``  — top-k sparsification with error feedback (5.4.3), PowerSGD through torch's hook;
                     ``build_grad_sync``: the synchroniser a data-parallel run's options ask for
* ``hang_lab``     — the first divergence of a hung run from its flight-recorder dumps (5.4.4)
* ``labs``         — ``experiments``: workers that notebooks/04_communication.ipynb and project/tools/benchmark.py
                     launch; ``hang_workers``: the planted hangs of notebooks/10_debugging_hangs.ipynb; ``checks``:
                     the exercises' answer checks

See notebooks/04_communication.ipynb.
"""
from communication.compression import build_grad_sync
from communication.ring import ring_all_reduce, tree_all_reduce

__all__ = ["ring_all_reduce", "tree_all_reduce", "build_grad_sync"]
