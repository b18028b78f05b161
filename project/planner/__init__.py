"""The planner: per-rank memory, step time and MFU of a training run before launching it.

    python -m project.planner --preset llama3-8b --hardware h100 --dp 8 --zero 3 ...   # one plan
    python -m project.planner --preset llama3-8b --n_devices 1024 --hardware h100      # the ranked plans
    python -m project.planner.published_runs                                           # beside published runs
    python -m project.planner.fake_mesh --rank 517 ...                                 # one rank of a large world

Modules, one concept each: :mod:`~project.planner.cli` (the options and the command), :mod:`~project.planner.rules`
(their checks), :mod:`~project.planner.model` (model shapes and presets), :mod:`~project.planner.layout` (the model
on the mesh), :mod:`~project.planner.memory` (memory per rank), :mod:`~project.planner.kernels` (the kernels of a
step), :mod:`~project.planner.pricing` (what a kernel and a collective cost), :mod:`~project.planner.communication`
(the calls of a step), :mod:`~project.planner.step` (the replayed step), :mod:`~project.planner.search` (the ranked
plans), :mod:`~project.planner.verify` and :mod:`~project.planner.fake_mesh` (fake ranks),
:mod:`~project.planner.measure` (prediction beside a CPU run), :mod:`~project.planner.report` (tables),
:mod:`~project.planner.published_runs` (against published runs), :mod:`~project.planner.checks` (notebook 09's
exercise checks).
"""
