"""Kernels of the reduction op family."""

KERNELS: dict = {}
