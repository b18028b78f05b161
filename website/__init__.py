"""The course as a website: every notebook with its committed outputs, in course order, the guides
and the docs, built by ``python -m website`` into ``build/site/html`` (``website/build.py``)."""
