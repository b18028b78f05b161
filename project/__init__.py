"""The run scripts the course's users launch: the one entry point (``train.py``), its registry of modes (``modes.py``)
and their configurations (``options/``), the documented commands ``run_*.py`` and the Slurm script; the tooling
around the runs lives in ``project/tools/``.
"""
