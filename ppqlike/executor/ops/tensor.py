"""Kernels of the tensor op family."""

KERNELS: dict = {}
