"""Assignment 5.4: communication — all-reduce from send/recv, bucketed overlapped gradient averaging, compression.

* ``ring``         — ``ring_all_reduce``, ``tree_all_reduce`` (5.4.1)
* ``buckets``      — ``BucketedReducer``: DDP-like buckets whose all-reduce starts during the backward pass (5.4.2)
* ``compression``  — top-k sparsification with error feedback (5.4.3), PowerSGD through torch's hook
* ``alpha_beta``   — ``collective_seconds``: the alpha-beta time of one collective on a link (the other parts'
                     worked problems at GPU scale price their collectives with it)
* ``experiments``  — workers that notebooks/04_communication.ipynb and project/benchmark.py launch
* ``hang_lab``     — the first divergence of a hung run from its flight-recorder dumps (5.4.4); ``hang_workers``:
                     the planted hangs of notebooks/10_debugging_hangs.ipynb

See notebooks/04_communication.ipynb.
"""
from communication.alpha_beta import collective_seconds
from communication.ring import ring_all_reduce, tree_all_reduce

__all__ = ["collective_seconds", "ring_all_reduce", "tree_all_reduce"]
