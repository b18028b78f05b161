"""Assignment 5.6: 3D parallelism — data x pipeline x tensor parallel GPT-2 on one device mesh.

* :mod:`three_d.mesh_arithmetic` — a rank's coordinates and its dp/pp/tp groups (a5_6_1).
* :mod:`three_d.stage` — a pipeline stage made of tensor-parallel GPT-2 blocks; activations
  sent to the same tp rank of the next stage, or scatter-gather (a5_6_2).
* :mod:`three_d.step` — the 3D training step: pipeline schedule over the pp group, gradients
  averaged over the dp group, tied embedding/head gradients summed, global grad-norm clip (a5_6_3).
* :mod:`three_d.labs` — the notebook's workers, the factorisation benchmark and the exercises' answer checks.

It composes the other parts through their packages only (``import pipeline``,
``import tensor_parallel``) and :mod:`course` (``course.mesh.Mesh`` gives the groups).
"""
import pipeline
from three_d.mesh_arithmetic import coordinates, group_ranks

# The schedules a 3D step runs: those of the registry with one chunk per rank (pipeline.SCHEDULES). Here, not in
# three_d.step, so that the configuration's choices load without torch (modal run on a laptop).
SCHEDULES = tuple(name for name, s in pipeline.SCHEDULES.items() if not s.interleaved and s.placement == "loop")
# The V-shaped schedules (two stages per rank, rank r holding stages r and 2p - 1 - r): the 3D step builds one
# tensor-parallel stage per rank, so it refuses them with a message (V_SCHEDULE_MESSAGE) rather than run them wrong.
V_SCHEDULES = tuple(name for name, s in pipeline.SCHEDULES.items() if s.placement == "v")
V_SCHEDULE_MESSAGE = ("--schedule {name} places two stages on every rank in a V (stages r and 2p - 1 - r), and the 3D "
                      "step builds one tensor-parallel stage per rank: run {name} with project/run_pipeline.py "
                      "--schedule {name} (pipeline parallelism alone), or use --schedule zb-h1 here (the "
                      "split backward on one stage per rank)")

__all__ = ["coordinates", "group_ranks", "SCHEDULES", "V_SCHEDULES"]
