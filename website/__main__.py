"""``python -m website``: build the course's site (see ``website/build.py``)."""
import sys

from website.build import main

sys.exit(main())
