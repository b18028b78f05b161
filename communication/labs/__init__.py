"""Notebook labs of communication: the workers, experiments, benchmarks and exercise checks that notebooks and benchmarks run (never graded, never imported by the part's own modules)."""
