"""Assignment 5.4: communication — all-reduce from send/recv, bucketed overlapped gradient averaging, compression.

* ``ring``         — ``ring_all_reduce``, ``tree_all_reduce`` (5.4.1)
* ``buckets``      — ``BucketedReducer``: DDP-like buckets whose all-reduce starts during the backward pass (5.4.2)
* ``compression``  — top-k sparsification with error feedback (5.4.3), PowerSGD through torch's hook;
                     ``build_grad_sync``: the synchroniser a data-parallel run's options ask for
* ``alpha_beta``   — ``collective_seconds``: the α–β time of one collective on a link (notebooks 04 and 11; the other
                     parts' worked problems at GPU scale price their collectives with it)
* ``hang_lab``     — the first divergence of a hung run from its flight-recorder dumps (5.4.4)
* ``labs``         — ``experiments``: workers that notebooks/04_communication.ipynb and project/tools/benchmark.py
                     launch; ``hang_workers``: the planted hangs of notebooks/10_debugging_hangs.ipynb; ``checks``:
                     the exercises' answer checks

See notebooks/04_communication.ipynb.
"""
from communication.alpha_beta import collective_seconds
from communication.compression import build_grad_sync
from communication.ring import ring_all_reduce, tree_all_reduce

__all__ = ["build_grad_sync", "collective_seconds", "ring_all_reduce", "tree_all_reduce"]
