"""Kernels of the normalization op family."""

KERNELS: dict = {}
