"""The course's tooling around the runs (not the runs themselves, ``project/``'s entry point and modes, nor the
planner): Modal support (``modal_support``), the GPU report (``gpu_report``; its kernels' measurements:
``gpu_report_kernels``), the performance measurements of the graded keys (``performance``), the loss-parity harness
(``parity``, ``parity_cases``), the communication benchmark (``benchmark``) and the notebooks' execution
(``execute_notebooks``)."""
