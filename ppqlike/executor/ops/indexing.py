"""Kernels of the indexing op family."""

KERNELS: dict = {}
