"""Kernels of the generator op family."""

KERNELS: dict = {}
