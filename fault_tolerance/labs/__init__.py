"""Experiments of notebook 11 (workers in importable modules, never in notebook cells)."""
