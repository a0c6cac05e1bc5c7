"""Kernels of the resize op family."""

KERNELS: dict = {}
