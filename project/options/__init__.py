"""The run scripts' configurations, one module per script (``project.options.run_3d`` holds
``project/run_3d.py``'s), each a subclass of :class:`course.config.RunConfig` and the configuration of one mode of
the registry :data:`project.modes.MODES` (``project/train.py --mode 3d`` takes the same).

They import without torch, so that ``modal run`` (:mod:`project.tools.modal_support`) builds and checks the very
configuration the script will run with, on a laptop that has no torch; the scripts import them from here.
"""
