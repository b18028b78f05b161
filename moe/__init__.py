"""Mixture of experts and expert parallelism (assignment 5.8)."""
