"""``python -m project.planner``: the planner's command line (:mod:`project.planner.cli`)."""
import sys

from project.planner.cli import main

sys.exit(main())
